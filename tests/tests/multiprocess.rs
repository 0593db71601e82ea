//! Multi-process tests of the foundation: each test launches `rank-worker SCENARIO` as N ranks
//! through the launcher and requires every rank to succeed.

use std::path::Path;
use std::time::Duration;

use weave_tests::launcher::{
    assert_survivors_saw_the_killed_rank, launch_serialized, leftover_segments, random_secret, run_ok, scenario_spec,
};

const WORKER: &str = env!("CARGO_BIN_EXE_rank-worker");

fn worker() -> &'static Path {
    Path::new(WORKER)
}

/// Runs `scenario` with each number of ranks in `worlds`, each job within `job_timeout_s`.
fn each_world(scenario: &str, worlds: &[usize], job_timeout_s: u64) {
    for &n in worlds {
        run_ok(&scenario_spec(worker(), scenario, n, 30.0, Duration::from_secs(job_timeout_s)), scenario);
    }
}

weave_tests::scenario_tests! { each_world;
    bootstrap_primitives_with_1_2_3_4_and_8_ranks: "bootstrap", &[1, 2, 3, 4, 8], 60;
    register_exchange_import_with_1_2_3_4_and_8_ranks: "exchange", &[1, 2, 3, 4, 8], 60;
    memory_channels_move_random_data_with_1_2_3_4_and_8_ranks: "memory-channel", &[1, 2, 3, 4, 8], 120;
    port_channels_through_the_proxy_with_1_2_3_4_and_8_ranks: "port-channel", &[1, 2, 3, 4, 8], 120;
    ten_thousand_signal_wait_round_trips: "signal-storm", &[2, 3], 120;
    strangers_at_the_bootstrap_port_are_refused_and_the_job_goes_on: "bad-connections", &[2, 4], 60;
    write_past_a_registered_range_is_invalid_argument: "out-of-range", &[2, 3], 60;
    damaged_descriptors_are_errors: "bad-descriptor", &[2, 3], 60;
    registration_order_mismatch_is_reported_on_every_rank: "registration-mismatch", &[2, 3], 60;
}

#[test]
fn a_rank_killed_during_a_wait_fails_the_others_within_the_timeout_and_leaks_nothing() {
    for n in [2, 4] {
        let secret = random_secret();
        let weave_timeout = 5.0;
        let spec = scenario_spec(worker(), "fault-kill", n, weave_timeout, Duration::from_secs(60))
            .env("WEAVE_SECRET", &secret)
            .keep_going(true);
        let report = launch_serialized(&spec).expect("launch fault-kill");
        let elapsed = report.elapsed;
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
