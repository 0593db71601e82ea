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
    let spec = weave_launch::LaunchSpec::new(4, program)
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env("WEAVE_TIMEOUT", "20")
        .capture(true)
        .timeout(Duration::from_secs(120));
    let report = weave_launch::launch(&spec).expect("starting 4 ranks");
    assert!(report.success(), "{}", report.summary());
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
