//! Multi-process tests of the foundation: each test launches `rank-worker SCENARIO` as N ranks
//! through the launcher and requires every rank to succeed.

use std::path::Path;
use std::time::{Duration, Instant};

use weave_tests::launcher::{
    assert_survivors_saw_the_killed_rank, launch_serialized, leftover_segments, random_secret, run_ok, scenario_spec,
};

const WORKER: &str = env!("CARGO_BIN_EXE_rank-worker");

fn worker() -> &'static Path {
    Path::new(WORKER)
}

fn each_world(scenario: &str, worlds: &[usize], job_timeout: Duration) {
    for &n in worlds {
        run_ok(&scenario_spec(worker(), scenario, n, 30.0, job_timeout), scenario);
    }
}

#[test]
fn bootstrap_primitives_with_1_2_3_4_and_8_ranks() {
    each_world("bootstrap", &[1, 2, 3, 4, 8], Duration::from_secs(60));
}

#[test]
fn register_exchange_import_with_1_2_3_4_and_8_ranks() {
    each_world("exchange", &[1, 2, 3, 4, 8], Duration::from_secs(60));
}

#[test]
fn memory_channels_move_random_data_with_1_2_3_4_and_8_ranks() {
    each_world("memory-channel", &[1, 2, 3, 4, 8], Duration::from_secs(120));
}

#[test]
fn port_channels_through_the_proxy_with_1_2_3_4_and_8_ranks() {
    each_world("port-channel", &[1, 2, 3, 4, 8], Duration::from_secs(120));
}

#[test]
fn ten_thousand_signal_wait_round_trips() {
    each_world("signal-storm", &[2, 3], Duration::from_secs(120));
}

#[test]
fn strangers_at_the_bootstrap_port_are_refused_and_the_job_goes_on() {
    each_world("bad-connections", &[2, 4], Duration::from_secs(60));
}

#[test]
fn write_past_a_registered_range_is_invalid_argument() {
    each_world("out-of-range", &[2, 3], Duration::from_secs(60));
}

#[test]
fn damaged_descriptors_are_errors() {
    each_world("bad-descriptor", &[2, 3], Duration::from_secs(60));
}

#[test]
fn registration_order_mismatch_is_reported_on_every_rank() {
    each_world("registration-mismatch", &[2, 3], Duration::from_secs(60));
}

#[test]
fn a_rank_killed_during_a_wait_fails_the_others_within_the_timeout_and_leaks_nothing() {
    for n in [2, 4] {
        let secret = random_secret();
        let weave_timeout = 5.0;
        let spec = scenario_spec(worker(), "fault-kill", n, weave_timeout, Duration::from_secs(60))
            .env("WEAVE_SECRET", &secret)
            .keep_going(true);
        let started = Instant::now();
        let report = launch_serialized(&spec).expect("launch fault-kill");
        let elapsed = started.elapsed();
        assert_survivors_saw_the_killed_rank(&report, "fault-kill");
        assert!(elapsed < Duration::from_secs_f64(weave_timeout + 20.0), "job took {elapsed:?}");
        let left = leftover_segments(&secret);
        assert!(left.is_empty(), "shared-memory segments left behind: {left:?}");
    }
}

#[test]
fn a_failing_rank_makes_the_launcher_stop_the_others() {
    // A scenario the worker does not know: every rank fails at once; the launcher must report
    // the failure, not hang.
    let spec = scenario_spec(worker(), "no-such-scenario", 3, 5.0, Duration::from_secs(30));
    let report = launch_serialized(&spec).expect("launch");
    assert!(!report.success());
    assert!(report.first_failure.is_some());
}
