//! Multi-process tests of the collectives: each test launches `collectives-worker SCENARIO`
//! as N ranks. `WEAVE_TEST_LONG=1` (`cargo xtask test --long`) runs the full matrix.

use std::path::Path;
use std::time::Duration;

use weave_tests::launcher::{
    assert_survivors_saw_the_killed_rank, launch_serialized, leftover_segments, random_secret, run_ok, scenario_spec,
};

const WORKER: &str = env!("CARGO_BIN_EXE_collectives-worker");

fn run(scenario: &str, arg: Option<&str>, worlds: &[usize], job_timeout: Duration) {
    for &n in worlds {
        let mut spec = scenario_spec(Path::new(WORKER), scenario, n, 30.0, job_timeout);
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
    run("matrix", Some(which), &[1, 2, 3, 4, 5, 8], Duration::from_secs(if long() { 3600 } else { 300 }));
}

#[test]
fn every_algorithm_forced_gives_the_same_results() {
    run("algorithms", None, &[1, 2, 3, 4, 8], Duration::from_secs(600));
}

#[test]
fn the_channel_family_runs_the_matrix_with_16_ranks() {
    run("matrix", Some("channel"), &[16], Duration::from_secs(600));
}

#[test]
fn a_thousand_calls_with_changing_sizes() {
    run("stale-state", None, &[2, 3], Duration::from_secs(120));
}

#[test]
fn split_communicators_and_a_buffer_used_with_two_communicators() {
    run("split", None, &[1, 2, 4, 5], Duration::from_secs(120));
}

#[test]
fn mismatched_counts_roots_ops_and_bad_arguments_fail_on_every_rank() {
    run("mismatch", None, &[1, 2, 3, 4], Duration::from_secs(120));
}

#[test]
fn send_recv_and_groups() {
    run("p2p", None, &[1, 2, 3, 4], Duration::from_secs(120));
}

#[test]
fn send_recv_and_groups_over_channel_links() {
    run("p2p-channel", None, &[1, 2, 3, 4], Duration::from_secs(120));
}

#[test]
fn zero_copy_shared_buffers_mixed_with_plain_slices() {
    run("shared", None, &[1, 2, 3, 4], Duration::from_secs(300));
}

#[test]
fn a_rank_killed_mid_channel_all_reduce_fails_the_others_and_leaks_nothing() {
    for (n, over) in [(2, "shm"), (4, "shm"), (2, "tcp"), (4, "tcp")] {
        let secret = random_secret();
        let spec = scenario_spec(Path::new(WORKER), "channel-kill", n, 10.0, Duration::from_secs(60))
            .arg(over)
            .env("WEAVE_SECRET", &secret)
            .keep_going(true);
        let started = std::time::Instant::now();
        let report = launch_serialized(&spec).expect("launch channel-kill");
        assert_survivors_saw_the_killed_rank(&report, "channel-kill");
        assert!(started.elapsed() < Duration::from_secs(30), "job took {:?}", started.elapsed());
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
