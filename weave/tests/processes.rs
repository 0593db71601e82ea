//! The facade across processes: four ranks of this test binary, started with `weave-launch`,
//! build communicators through `weave::Communicator::from_env` over shared memory and check
//! an all-reduce, an all-gather and a reduce-scatter reached through `weave` paths alone.

use std::time::Duration;

use weave::{Communicator, ReduceOp};

/// The name of the test below, which each rank runs alone.
const TEST: &str = "four_processes_reach_every_call_through_the_facade";

#[test]
fn four_processes_reach_every_call_through_the_facade() {
    if std::env::var_os("RANK").is_some() {
        rank_body();
        return;
    }
    let program = std::env::current_exe().expect("the path of this test binary");
    let spec = weave_launch::LaunchSpec::new(4, program).args([TEST, "--exact", "--nocapture", "--test-threads=1"]);
    let report = launch_successfully(spec, "starting 4 ranks");
    for r in &report.ranks {
        let line = format!("rank {} of 4: checked", r.rank);
        assert!(
            r.stdout.iter().any(|l| l.contains(&line)),
            "rank {} did not report its checks: {:?}",
            r.rank,
            r.stdout
        );
    }
}

/// A user's own subscriber (`tracing_subscriber::fmt().with_env_filter("weave=debug")`) sees the
/// communicator's creation and each call's plan: the README example's two ranks, each asked
/// through `RUST_LOG`.
#[test]
fn a_users_subscriber_sees_the_communicators_creation_and_plan_choices() {
    let example = example("all_reduce");
    let spec = weave_launch::LaunchSpec::new(2, &example).env("RUST_LOG", "weave=debug");
    let report = launch_successfully(spec, "starting 2 ranks of the example");
    for r in &report.ranks {
        let says = |what: &str| r.stderr.iter().any(|l| l.contains(what));
        assert!(
            says("weave::init") && says("ready; transports to peers"),
            "rank {}: no creation event: {:?}",
            r.rank,
            r.stderr
        );
        assert!(
            says("weave::transport") && says("connected to rank"),
            "rank {}: no transport event: {:?}",
            r.rank,
            r.stderr
        );
        assert!(
            says("weave::plan") && says("all_reduce of 4194304 B on 2 ranks -> "),
            "rank {}: no plan event for the all_reduce: {:?}",
            r.rank,
            r.stderr
        );
    }
}

/// The elastic example: its last rank dies at step 5; the others shrink, grow back with a
/// replacement, and every rank ends with the same weights.
#[test]
fn the_elastic_example_loses_a_rank_grows_back_and_finishes() {
    let out = std::process::Command::new(example("elastic"))
        .arg("4")
        .env_remove("RANK")
        .output()
        .expect("run the elastic example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("the others shrank, grew back and finished"), "{stdout}");
    let finished = stdout.lines().filter(|l| l.contains("20 steps, every sum exact, weights equal")).count();
    assert_eq!(finished, 4, "three survivors and the replacement finish: {stdout}");
}

/// Launches `spec` with a 20 s communicator timeout, its output kept and the job bounded by two
/// minutes; panics with `starting` when it cannot start, and with the summary when a rank failed.
fn launch_successfully(spec: weave_launch::LaunchSpec, starting: &str) -> weave_launch::LaunchReport {
    let spec = spec.env("WEAVE_TIMEOUT", "20").capture(true).timeout(Duration::from_secs(120));
    let report = weave_launch::launch(&spec).expect(starting);
    assert!(report.success(), "{}", report.summary());
    report
}

/// The path of example `name`, built now if `cargo test` did not build it.
fn example(name: &str) -> std::path::PathBuf {
    // This binary is target/<profile>/deps/processes-*; the examples are built beside deps/.
    let exe = std::env::current_exe().expect("the path of this test binary");
    let example = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>").join("examples").join(name);
    if !example.exists() {
        // `cargo test` builds the examples before it runs tests; a lone `cargo test --test` may not.
        let profile: &[&str] = if cfg!(debug_assertions) { &[] } else { &["--release"] };
        let built = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", "weave", "--example", name])
            .args(profile)
            .status()
            .expect("run cargo to build the example");
        assert!(built.success(), "the {name} example did not build");
    }
    example
}

/// One rank: each call's result against its exact value (small integers, exact in f64).
fn rank_body() {
    let comm = Communicator::from_env().expect("a communicator from the launcher's variables");
    let (rank, n) = (comm.rank(), comm.world_size());
    assert_eq!(n, 4);

    let mine: Vec<f64> = (0..1000).map(|i| (i * n + rank) as f64).collect();
    let mut sum = vec![0.0; 1000];
    comm.all_reduce(&mine, &mut sum, ReduceOp::Sum).expect("all_reduce");
    for (i, &x) in sum.iter().enumerate() {
        assert_eq!(x, (n * n * i + n * (n - 1) / 2) as f64, "all_reduce element {i}");
    }

    let mut gathered = vec![0i32; 3 * n];
    comm.all_gather(&[rank as i32; 3], &mut gathered).expect("all_gather");
    assert_eq!(gathered, (0..3 * n).map(|i| (i / 3) as i32).collect::<Vec<_>>());

    let send: Vec<u32> = (0..2 * n).map(|i| (i + rank) as u32).collect();
    let mut block = [0u32; 2];
    comm.reduce_scatter(&send, &mut block, ReduceOp::Max).expect("reduce_scatter");
    assert_eq!(block, [(2 * rank + n - 1) as u32, (2 * rank + n) as u32]);

    println!("rank {rank} of {n}: checked");
}
