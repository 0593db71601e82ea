//! Launching rank-worker jobs from integration tests, through the same launcher as
//! `cargo xtask launch`.

use std::path::Path;
use std::time::Duration;

use weave_launch::{LaunchReport, LaunchSpec, RankExit, RankReport, launch};

/// A job of `ranks` copies of `program SCENARIO`, with `WEAVE_TIMEOUT` set to `weave_timeout`
/// seconds and the whole job bounded by `job_timeout`.
pub fn scenario_spec(
    program: &Path,
    scenario: &str,
    ranks: usize,
    weave_timeout: f64,
    job_timeout: Duration,
) -> LaunchSpec {
    LaunchSpec::new(ranks, program)
        .arg(scenario)
        .timeout(job_timeout)
        .env("WEAVE_TIMEOUT", weave_timeout.to_string())
        .capture(true)
}

/// Jobs of one test binary run one at a time: ranks spin while they wait, and two jobs sharing
/// two cores would slow each other down by orders of magnitude.
static ONE_JOB_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn among the jobs of its binary (see `ONE_JOB_AT_A_TIME`), held until the
/// guard drops: for tests that run ranks as threads of their own. A panicking test does not
/// poison it for the others.
pub fn job_turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// Launches a job in its turn ([`job_turn`]).
pub fn launch_serialized(spec: &LaunchSpec) -> weave_launch::Result<LaunchReport> {
    let _turn = job_turn();
    launch(spec)
}

/// Runs the job and panics with every rank's output unless all ranks exited 0 and each printed
/// its `OK SCENARIO` line. Returns the report for further checks.
pub fn run_ok(spec: &LaunchSpec, scenario: &str) -> LaunchReport {
    let report = launch_serialized(spec).unwrap_or_else(|e| panic!("launching {scenario}: {e}"));
    let all_ok = report.success() && report.ranks.iter().all(|r| ok_line(r, scenario).is_some());
    assert!(all_ok, "{scenario} with {} ranks failed: {}\n{}", spec.ranks, report.summary(), dump(&report));
    report
}

/// Checks a job whose last rank was killed with `SIGKILL` in the middle of `scenario`: the victim
/// died by that signal, and every other rank exited 0 after printing its `OK SCENARIO` line (it
/// took the dead peer for an error instead of waiting for it). Panics with every rank's output
/// otherwise.
pub fn assert_survivors_saw_the_killed_rank(report: &LaunchReport, scenario: &str) {
    let Some((victim, survivors)) = report.ranks.split_last() else {
        panic!("{scenario}: the job has no ranks");
    };
    assert_eq!(victim.exit, RankExit::Signal(9), "victim must die by SIGKILL\n{}", dump(report));
    for r in survivors {
        assert!(
            r.exit.success() && ok_line(r, scenario).is_some(),
            "rank {} did not report the dead peer as an error\n{}",
            r.rank,
            dump(report)
        );
    }
}

/// The number in `line` right after `marker`, up to the next space, comma or `}`: a time in an
/// `OK` line (`failed 120 ms`), a field of a JSON result line (`"time_us":3.5,`). Panics naming
/// the line when there is none.
pub fn number_after<T: std::str::FromStr>(line: &str, marker: &str) -> T {
    line.split(marker)
        .nth(1)
        .and_then(|rest| rest.split([' ', ',', '}']).next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no number after {marker:?} in {line:?}"))
}

/// The line `OK SCENARIO rank R: DETAIL` the worker prints when `scenario` succeeded on
/// `rank`, if it printed one.
pub fn ok_line<'r>(rank: &'r RankReport, scenario: &str) -> Option<&'r str> {
    let done =
        |l: &&String| l.strip_prefix("OK ").and_then(|l| l.strip_prefix(scenario)).is_some_and(|l| l.starts_with(' '));
    rank.stdout.iter().find(done).map(String::as_str)
}

/// The median and the largest of `values`, which this sorts; panics when there are none.
pub fn median_and_max<T: Ord + Copy>(values: &mut [T]) -> (T, T) {
    values.sort_unstable();
    let last = values.last().copied().expect("no values to take the median of");
    (values[values.len() / 2], last)
}

/// Every rank's captured output, for failure messages.
pub fn dump(report: &LaunchReport) -> String {
    let mut s = String::new();
    for r in &report.ranks {
        s.push_str(&format!("--- rank {} ({}) ---\n", r.rank, r.exit));
        for l in r.stdout.iter().chain(&r.stderr) {
            s.push_str(l);
            s.push('\n');
        }
    }
    s
}

/// Shared-memory segments of the job with this secret that still exist in `/dev/shm` (any
/// communicator or sub-communicator of the job).
pub fn leftover_segments(secret_hex: &str) -> Vec<String> {
    let secret: [u8; 16] = comm_core::wire::parse_hex(secret_hex).expect("test secret is 32 hex digits");
    let key = comm_core::bootstrap::UniqueId::with_secret("127.0.0.1:1".parse().expect("address"), secret).job_key();
    let prefix = format!("weave-{key}");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// A fresh random job secret as 32 hex digits.
pub fn random_secret() -> String {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    comm_core::wire::hex(&b)
}
