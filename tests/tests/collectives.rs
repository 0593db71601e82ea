//! Multi-process tests of the collectives: each test launches `collectives-worker SCENARIO`
//! as N ranks. `WEAVE_TEST_LONG=1` (`cargo xtask test --long`) runs the full matrix.

use std::path::Path;
use std::time::Duration;

use weave_tests::launcher::{
    assert_survivors_saw_the_killed_rank, launch_serialized, leftover_segments, median_and_max, number_after, ok_line,
    random_secret, run_ok, scenario_spec,
};

const WORKER: &str = env!("CARGO_BIN_EXE_collectives-worker");

/// Runs `scenario` (with `arg`) with each number of ranks in `worlds`, each job within
/// `job_timeout_s`.
fn run(scenario: &str, arg: Option<&str>, worlds: &[usize], job_timeout_s: u64) {
    for &n in worlds {
        let mut spec = scenario_spec(Path::new(WORKER), scenario, n, 30.0, Duration::from_secs(job_timeout_s));
        if let Some(a) = arg {
            spec = spec.arg(a);
        }
        run_ok(&spec, scenario);
    }
}

fn long() -> bool {
    std::env::var_os("WEAVE_TEST_LONG").is_some_and(|v| v == "1")
}

#[test]
fn every_collective_dtype_op_and_count_with_1_2_3_4_5_and_8_ranks() {
    let which = if long() { "long" } else { "ci" };
    run("matrix", Some(which), &[1, 2, 3, 4, 5, 8], if long() { 3600 } else { 300 });
}

weave_tests::scenario_tests! { run;
    every_algorithm_forced_gives_the_same_results: "algorithms", None, &[1, 2, 3, 4, 8], 600;
    the_channel_family_runs_the_matrix_with_16_ranks: "matrix", Some("channel"), &[16], 600;
    a_thousand_calls_with_changing_sizes: "stale-state", None, &[2, 3], 120;
    split_communicators_and_a_buffer_used_with_two_communicators: "split", None, &[1, 2, 4, 5], 120;
    mismatched_counts_roots_ops_and_bad_arguments_fail_on_every_rank: "mismatch", None, &[1, 2, 3, 4], 120;
    send_recv_and_groups: "p2p", None, &[1, 2, 3, 4], 120;
    send_recv_and_groups_over_channel_links: "p2p-channel", None, &[1, 2, 3, 4], 120;
    an_unmatched_send_is_found_at_the_next_exchange_in_mailboxes: "p2p-mismatch", Some("mailbox"), &[2, 3], 120;
    an_unmatched_send_is_found_at_the_next_exchange_over_links: "p2p-mismatch", Some("channel"), &[2, 3], 120;
    an_unmatched_send_is_found_at_the_next_exchange_over_tcp: "p2p-mismatch", Some("tcp"), &[2, 3], 120;
    zero_copy_shared_buffers_mixed_with_plain_slices: "shared", None, &[1, 2, 3, 4], 300;
}

#[test]
fn a_rank_killed_mid_channel_all_reduce_fails_the_others_and_leaks_nothing() {
    for (n, over) in [(2, "shm"), (4, "shm"), (2, "tcp"), (4, "tcp")] {
        let secret = random_secret();
        let spec = scenario_spec(Path::new(WORKER), "channel-kill", n, 10.0, Duration::from_secs(60))
            .arg(over)
            .env("WEAVE_SECRET", &secret)
            .keep_going(true);
        let report = launch_serialized(&spec).expect("launch channel-kill");
        assert_survivors_saw_the_killed_rank(&report, "channel-kill");
        // The job's own time: the wait for another test's job to finish does not count.
        assert!(report.elapsed < Duration::from_secs(30), "job took {:?}", report.elapsed);
        let left = leftover_segments(&secret);
        assert!(left.is_empty(), "shared-memory segments left behind: {left:?}");
    }
}

#[test]
fn every_collective_across_posed_nodes_over_tcp_2x2_and_3x1() {
    for (nodes, per_node) in [(2, 2), (3, 1)] {
        let spec = scenario_spec(Path::new(WORKER), "nodes", nodes * per_node, 30.0, Duration::from_secs(600))
            .posed_nodes(nodes);
        let report = run_ok(&spec, "nodes");
        assert!(report.ranks.iter().all(|r| r.stdout.iter().any(|l| l.contains(&format!("on {nodes} nodes")))));
    }
}

#[test]
fn a_hierarchical_call_small_on_one_node_and_larger_on_another_fails_on_every_rank() {
    for op in ["all_reduce", "all_gather"] {
        let spec =
            scenario_spec(Path::new(WORKER), "nodes-straddle", 4, 2.0, Duration::from_secs(120)).arg(op).posed_nodes(2);
        run_ok(&spec, "nodes-straddle");
    }
}

// Namespace nodes: each node a network, UTS and mount namespace (own hostname and /dev/shm,
// eth0 on a bridge). They need root, so they are ignored; `cargo xtask test` runs them as root
// (`--ignored namespace`), and run without root they fail saying why.

/// Panics with the reason unless namespace nodes can be made here.
fn require_namespaces() {
    if let Err(e) = weave_launch::namespace_nodes_available(None) {
        panic!("namespace nodes cannot be made here, so this test cannot run (it needs root): {e}");
    }
}

/// Panics unless, within 5 s, nothing holds the job's namespaces and the host's /dev/shm has no
/// segment of the job with `secret`.
fn assert_nothing_left(report: &weave_launch::LaunchReport, secret: &str) {
    assert!(!report.namespaces.is_empty(), "the job made no namespaces");
    if let Err(held) = weave_launch::wait_namespaces_released(&report.namespaces, Duration::from_secs(5)) {
        panic!("namespaces still held after the job:\n{}", held.join("\n"));
    }
    let left = leftover_segments(secret);
    assert!(left.is_empty(), "shared-memory segments in the host's /dev/shm: {left:?}");
}

/// `scenario` as `ranks` ranks on `nodes` namespace nodes, with a fresh job secret (returned,
/// for [`assert_nothing_left`]) and `WEAVE_TIMEOUT` of `weave_timeout` seconds.
fn namespace_job(scenario: &str, ranks: usize, nodes: usize, weave_timeout: f64) -> (weave_launch::LaunchSpec, String) {
    let secret = random_secret();
    let spec = scenario_spec(Path::new(WORKER), scenario, ranks, weave_timeout, Duration::from_secs(600))
        .namespace_nodes(nodes, None)
        .env("WEAVE_SECRET", &secret);
    (spec, secret)
}

/// [`namespace_job`] of `scenario ARG` whose last rank is killed: checks that every survivor
/// reported the dead rank and that nothing is left, and returns the report.
fn namespace_kill_job(
    scenario: &str,
    arg: &str,
    ranks: usize,
    nodes: usize,
    weave_timeout: f64,
) -> weave_launch::LaunchReport {
    let (spec, secret) = namespace_job(scenario, ranks, nodes, weave_timeout);
    let report =
        launch_serialized(&spec.arg(arg).keep_going(true)).unwrap_or_else(|e| panic!("launch {scenario}: {e}"));
    assert_survivors_saw_the_killed_rank(&report, scenario);
    assert_nothing_left(&report, &secret);
    report
}

#[test]
#[ignore = "needs root (network namespaces): cargo xtask test runs it as root"]
fn every_collective_across_namespace_nodes_over_tcp_2x2_and_3x1() {
    require_namespaces();
    for (nodes, per_node) in [(2, 2), (3, 1)] {
        let (spec, secret) = namespace_job("nodes", nodes * per_node, nodes, 30.0);
        let report = run_ok(&spec, "nodes");
        for r in &report.ranks {
            let line = ok_line(r, "nodes").expect("OK line");
            assert!(line.contains(&format!("on {nodes} nodes")), "{line}");
            // Shared memory inside a node (its own /dev/shm), TCP between nodes.
            for p in (0..nodes * per_node).filter(|&p| p != r.rank) {
                let want = if p / per_node == r.rank / per_node { "shm" } else { "tcp" };
                assert!(line.contains(&format!(" {p}:{want}")), "rank {} peer {p} not over {want}: {line}", r.rank);
            }
        }
        assert_nothing_left(&report, &secret);
    }
}

#[test]
#[ignore = "needs root (network namespaces): cargo xtask test runs it as root"]
fn a_rank_killed_across_namespace_nodes_fails_the_others_and_leaks_nothing() {
    require_namespaces();
    for (nodes, per_node) in [(2, 1), (2, 2)] {
        namespace_kill_job("channel-kill", "shm", nodes * per_node, nodes, 10.0);
    }
}

#[test]
#[ignore = "needs root (network namespaces): cargo xtask test runs it as root"]
fn twenty_kills_at_random_points_across_2x2_namespace_nodes_fail_every_survivor_within_the_timeout() {
    require_namespaces();
    const WEAVE_TIMEOUT_S: f64 = 10.0;
    let mut after_ms = Vec::new();
    for trial in 0..20u64 {
        // A spread of points: 0–390 ms into the loop, in a scrambled order.
        let delay = (trial * 7 % 20) * 20;
        let report = namespace_kill_job("node-kill", &delay.to_string(), 4, 2, WEAVE_TIMEOUT_S);
        for r in &report.ranks[..3] {
            let line = ok_line(r, "node-kill").expect("an OK line");
            let ms: u64 = number_after(line, "failed ");
            assert!((ms as f64) < WEAVE_TIMEOUT_S * 1000.0, "trial {trial}: rank {} failed only after {ms} ms", r.rank);
            after_ms.push(ms);
        }
    }
    let (median, max) = median_and_max(&mut after_ms);
    println!("2x2 namespace nodes, 20 kills: survivors failed {median} ms (median) / {max} ms (max) after the kill");
}
