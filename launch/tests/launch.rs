//! End-to-end tests of the launcher: real jobs of `/bin/sh` ranks, each bounded by a timeout.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::SigSet;
use weave_launch::{CancelToken, Error, LaunchSpec, OUTPUT_GRACE, RankExit, Signal, launch};

/// `ranks` ranks of `/bin/sh -c script`, output captured, the job bounded to 20 s.
fn sh(ranks: usize, script: &str) -> LaunchSpec {
    LaunchSpec::new(ranks, "/bin/sh").arg("-c").arg(script).capture(true).timeout(Duration::from_secs(20))
}

#[test]
fn all_ranks_succeed_with_consistent_environment() {
    let spec = sh(
        4,
        r#"echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $WEAVE_SECRET $EXTRA""#,
    )
    .env("EXTRA", "x")
    .env("RANK", "99");
    let report = launch(&spec).unwrap();
    assert!(report.success(), "{}", report.summary());
    assert_eq!(report.first_failure, None);
    assert!(!report.timed_out);
    assert!(report.summary().starts_with("all 4 ranks exited 0"));
    let mut secrets = Vec::new();
    for (i, r) in report.ranks.iter().enumerate() {
        assert_eq!(r.rank, i);
        assert_eq!(r.exit, RankExit::Code(0));
        assert!(!r.killed_by_launcher && r.output_complete);
        assert_eq!(r.stdout.len(), 1, "{:?}", r.stdout);
        let f: Vec<&str> = r.stdout[0].split(' ').collect();
        assert_eq!(f.len(), 8, "{f:?}");
        assert_eq!(f[0], i.to_string(), "RANK (the launcher's value wins over LaunchSpec.env)");
        assert_eq!((f[1], f[2], f[3]), ("4", f[0], "4"));
        assert_eq!(f[4], "127.0.0.1");
        assert_eq!(f[5], report.master_port.to_string());
        assert!(f[6].len() == 32 && f[6].bytes().all(|b| b.is_ascii_hexdigit()), "{}", f[6]);
        assert_eq!(f[7], "x");
        secrets.push(f[6].to_string());
    }
    assert!(secrets.windows(2).all(|w| w[0] == w[1]));
    assert_ne!(report.master_port, 0);
}

#[test]
fn echoed_and_captured_lines_carry_their_rank() {
    let sink = Arc::new(Mutex::new(Vec::<u8>::new()));
    let spec = sh(3, r#"echo "out $RANK"; echo "err $RANK" >&2; printf 'tail %s' "$RANK""#).echo_to(sink.clone());
    let report = launch(&spec).unwrap();
    assert!(report.success(), "{}", report.summary());
    for r in &report.ranks {
        assert_eq!(r.stdout, [format!("out {}", r.rank), format!("tail {}", r.rank)]);
        assert_eq!(r.stderr, [format!("err {}", r.rank)]);
    }
    let echoed = String::from_utf8(sink.lock().unwrap().clone()).unwrap();
    let mut lines: Vec<&str> = echoed.lines().collect();
    lines.sort();
    let mut want: Vec<String> = (0..3)
        .flat_map(|r| [format!("[rank {r}] out {r}"), format!("[rank {r}] err {r}"), format!("[rank {r}] tail {r}")])
        .collect();
    want.sort();
    assert_eq!(lines, want);
}

#[test]
fn failing_rank_stops_the_others() {
    // Every rank ignores the catchable signals: SIGKILL must stop them anyway.
    let spec =
        sh(4, r#"trap '' INT TERM HUP; if [ "$RANK" = 2 ]; then echo "rank 2 gives up" >&2; exit 3; fi; sleep 60"#);
    let t = Instant::now();
    let report = launch(&spec).unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
    assert!(!report.success() && !report.timed_out);
    assert_eq!(report.first_failure, Some(2));
    assert_eq!(report.ranks[2].exit, RankExit::Code(3));
    assert!(!report.ranks[2].killed_by_launcher);
    for r in [0, 1, 3] {
        assert!(report.ranks[r].killed_by_launcher, "rank {r}");
        assert_eq!(report.ranks[r].exit, RankExit::Signal(Signal::SIGKILL as i32));
    }
    let summary = report.summary();
    assert!(summary.contains("rank 2 failed first: it exited with code 3"), "{summary}");
    assert!(summary.contains("rank 2 gives up"), "{summary}");
    assert!(summary.contains("stopped rank(s) 0, 1, 3 of 4"), "{summary}");
}

#[test]
fn timeout_kills_every_rank() {
    let spec = sh(3, "sleep 60").timeout(Duration::from_millis(300));
    let t = Instant::now();
    let report = launch(&spec).unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
    assert!(report.timed_out && !report.success());
    assert_eq!(report.first_failure, None);
    assert!(report.ranks.iter().all(|r| r.killed_by_launcher));
    assert!(report.summary().contains("timed out"), "{}", report.summary());
}

#[test]
fn rank_killed_by_a_signal_is_a_failure() {
    let spec = sh(2, r#"if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 60"#);
    let t = Instant::now();
    let report = launch(&spec).unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
    assert_eq!(report.first_failure, Some(1));
    assert_eq!(report.ranks[1].exit, RankExit::Signal(9));
    assert!(!report.ranks[1].killed_by_launcher);
    assert!(report.ranks[0].killed_by_launcher);
    assert!(report.summary().contains("rank 1 failed first: it was killed by signal 9 (SIGKILL)"));
}

#[test]
fn missing_program_is_an_io_error() {
    let spec = LaunchSpec::new(2, "/nonexistent/weave-rank-program");
    match launch(&spec) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("/nonexistent/weave-rank-program"), "{e}"),
        other => panic!("expected Error::Io, got {other:?}"),
    }
    assert!(matches!(launch(&LaunchSpec::new(0, "/bin/true")), Err(Error::InvalidArgument(_))));
}

#[test]
fn cancel_forwards_the_signal_then_kills() {
    let token = CancelToken::new();
    // Rank 0 ends on SIGTERM; rank 1 ignores it and is killed after the grace time.
    let spec = sh(2, r#"if [ "$RANK" = 1 ]; then trap '' TERM; fi; sleep 60"#)
        .cancel_token(token.clone())
        .cancel_grace(Duration::from_millis(300));
    let canceller = {
        let token = token.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            token.cancel(Signal::SIGTERM);
        })
    };
    let t = Instant::now();
    let report = launch(&spec).unwrap();
    canceller.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
    assert_eq!(report.cancelled, Some(Signal::SIGTERM));
    assert_eq!(report.first_failure, None);
    assert!(report.ranks.iter().all(|r| r.killed_by_launcher));
    assert_eq!(report.ranks[1].exit, RankExit::Signal(Signal::SIGKILL as i32));
}

#[test]
fn escaped_grandchild_cannot_hold_the_launcher() {
    // The grandchild leaves the process group and keeps stdout open past OUTPUT_GRACE.
    let spec = sh(1, "setsid sleep 4 & echo started");
    let t = Instant::now();
    let report = launch(&spec).unwrap();
    assert!(t.elapsed() < OUTPUT_GRACE + Duration::from_secs(1), "took {:?}", t.elapsed());
    assert!(report.success(), "{}", report.summary());
    assert_eq!(report.ranks[0].stdout, ["started"]);
    assert!(!report.ranks[0].output_complete);
}

#[test]
fn ranks_start_with_no_blocked_signals() {
    let mut set = SigSet::empty();
    set.add(Signal::SIGHUP);
    set.thread_block().unwrap();
    let report = launch(&sh(1, "grep SigBlk /proc/self/status"));
    set.thread_unblock().unwrap();
    let report = report.unwrap();
    assert!(report.success(), "{}", report.summary());
    assert_eq!(report.ranks[0].stdout, ["SigBlk:\t0000000000000000"]);
}

#[test]
fn posed_nodes_give_each_rank_its_node_and_local_rank() {
    let spec = sh(6, r#"echo "$RANK $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $WEAVE_HOST_ID""#).posed_nodes(3);
    let report = launch(&spec).unwrap();
    assert!(report.success(), "{}", report.summary());
    let mut hosts = Vec::new();
    for r in &report.ranks {
        let f: Vec<&str> = r.stdout[0].split_whitespace().collect();
        let rank: usize = f[0].parse().unwrap();
        assert_eq!(f[1..4], [(rank % 2).to_string(), "2".to_string(), (rank / 2).to_string()], "rank {rank}");
        hosts.push(f[4].to_string());
    }
    assert!(hosts[0] == hosts[1] && hosts[1] != hosts[2] && hosts[2] == hosts[3] && hosts[4] != hosts[0]);
    let uneven = sh(5, "true").posed_nodes(2);
    assert!(launch(&uneven).is_err(), "5 ranks cannot split into 2 equal nodes");
}

#[test]
fn a_line_without_end_is_kept_in_pieces_of_bounded_size() {
    // 200,000 bytes and no newline, then a short line: the first comes in 64 KiB pieces.
    let report = launch(&sh(1, "head -c 200000 /dev/zero | tr '\\0' x; echo; echo done")).unwrap();
    assert!(report.success(), "{}", report.summary());
    let out = &report.ranks[0].stdout;
    assert!(out.iter().all(|l| l.len() <= 64 << 10), "a line longer than 64 KiB was kept whole");
    assert_eq!(out.iter().map(String::len).sum::<usize>(), 200_000 + "done".len());
    assert_eq!(out.len(), 5, "four pieces of the long line, then done");
    assert_eq!(out.last().map(String::as_str), Some("done"));
}
