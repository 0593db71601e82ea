//! The verdict on a stalled call (issue "survive a failure", item 6): every rank whose call
//! times out or loses a peer gets, inside its error, the same judgement of the members'
//! ledgers — which rank is behind, in which call, how far it got — within a second of its
//! timeout. Thread ranks skip or change a call over the loopback bootstrap; processes
//! (`collectives-worker stall MODE`, see `weave_tests::stall`) are killed, stopped, or leave a
//! receive or a send unmatched.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use collectives::{Communicator, ReduceOp};
use comm_core::Error;
use comm_core::config::Config;
use comm_core::loopback::{LoopbackBootstrap, LoopbackTransport};
use comm_core::verdict::Lag;
use weave_launch::RankExit;
use weave_tests::launcher::{dump, job_turn, launch_serialized, number_after, scenario_spec};

const WORKER: &str = env!("CARGO_BIN_EXE_collectives-worker");

/// The timeout of these jobs: short, so that the stalls end soon.
const TIMEOUT: Duration = Duration::from_millis(1500);

/// What a rank of a stalled job reports: its error, and how long after its timeout it came.
struct Stalled {
    rank: usize,
    error: Error,
    late: Duration,
}

/// `n` thread ranks run `calls` checked all-reduces; rank `odd` runs `odd_one` instead of its
/// call `at` (0-based) and then waits for the others to finish. Returns the others' errors.
fn stall(n: usize, odd: usize, at: usize, odd_one: impl Fn(&Communicator) + Sync) -> Vec<Stalled> {
    // The ranks spin while they wait; the bounds below assume no other job of this binary runs.
    let _turn = job_turn();
    let group = LoopbackBootstrap::group(n, TIMEOUT);
    let done = Barrier::new(n);
    let (done, odd_one) = (&done, &odd_one);
    std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .map(|b| {
                s.spawn(move || {
                    let rank = comm_core::bootstrap::Bootstrap::rank(&b);
                    let config = Config { timeout: TIMEOUT, ..Config::default() };
                    let comm = Communicator::builder(b).with_transport(LoopbackTransport).with_config(config).build();
                    let comm = comm.unwrap_or_else(|e| panic!("rank {rank}: building: {e}"));
                    let mut failure = None;
                    for i in 0..=at {
                        if rank == odd && i == at {
                            odd_one(&comm);
                            break;
                        }
                        let mut sum = [0u64; 64];
                        let started = Instant::now();
                        match comm.all_reduce(&[1u64; 64], &mut sum, ReduceOp::Sum) {
                            Ok(()) => assert_eq!(sum, [n as u64; 64], "rank {rank}: call {i}"),
                            Err(error) => {
                                let late = started.elapsed().saturating_sub(TIMEOUT);
                                failure = Some(Stalled { rank, error, late });
                                break;
                            }
                        }
                    }
                    // The odd rank stays reachable until the others have their verdicts.
                    done.wait();
                    failure
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().expect("a rank thread panicked")).collect()
    })
}

/// Every failed rank has a verdict, the same text on all, naming exactly `behind`; returns it.
fn one_verdict(failed: &[Stalled], behind: &[usize]) -> String {
    assert!(!failed.is_empty(), "no rank failed");
    let texts: Vec<String> = failed
        .iter()
        .map(|f| {
            let v = f.error.verdict().unwrap_or_else(|| panic!("rank {}: no verdict in {}", f.rank, f.error));
            assert_eq!(v.behind_ranks(), behind, "rank {}: {v}", f.rank);
            assert!(
                f.late < Duration::from_secs(1),
                "rank {}: the verdict came {:.2?} after the timeout",
                f.rank,
                f.late
            );
            v.to_string()
        })
        .collect();
    assert!(texts.iter().all(|t| *t == texts[0]), "the verdicts differ:\n{}", texts.join("\n"));
    texts[0].clone()
}

#[test]
fn a_rank_that_skips_a_call_is_named_behind_by_every_other() {
    let failed = stall(4, 2, 3, |_| std::thread::sleep(TIMEOUT * 2));
    assert_eq!(failed.len(), 3);
    let text = one_verdict(&failed, &[2]);
    let v = failed[0].error.verdict().expect("checked");
    assert_eq!(v.behind[0].1, Lag::Earlier { finished: 3, begun: 3, now: None }, "{text}");
    assert!(text.contains("3 reached collective 4 (all_reduce of 512 B)"), "{text}");
    assert!(text.contains("rank 2 is behind: finished 3 collectives, in no call now"), "{text}");
    println!("{text}");
}

#[test]
fn a_rank_that_calls_something_else_is_named_with_its_call() {
    let failed = stall(3, 1, 2, |comm| {
        let mut buf = [0u32; 8];
        let e = comm.broadcast_in_place(&mut buf, 0).expect_err("the others are in an all-reduce");
        assert!(matches!(e, Error::Timeout { .. } | Error::Protocol(_)), "{e}");
    });
    let text = one_verdict(&failed, &[1]);
    assert!(text.contains("rank 1 called broadcast of 32 B, root 0 there instead"), "{text}");
    println!("{text}");
}

/// What `collectives-worker stall MODE` reported on four ranks with a 2 s timeout.
struct StallJob {
    /// The ranks that reported a verdict, in rank order.
    ranks: Vec<usize>,
    /// Their verdict, the same text on each.
    text: String,
    /// The most milliseconds a failed call took on those ranks.
    worst: u64,
    /// Every rank's output, for messages.
    all: String,
}

/// Runs `collectives-worker stall MODE` on four ranks with a 2 s timeout, after checking that
/// the ranks that failed report the same verdict and that rank 3 died by SIGKILL when it was to.
fn stall_job(mode: &str, odd_killed: bool) -> StallJob {
    let spec = scenario_spec(WORKER.as_ref(), "stall", 4, 2.0, Duration::from_secs(60)).arg(mode).keep_going(true);
    let report = launch_serialized(&spec).unwrap_or_else(|e| panic!("launching stall {mode}: {e}"));
    let mut verdicts = Vec::new();
    for r in &report.ranks {
        if odd_killed && r.rank == 3 {
            assert_eq!(r.exit, RankExit::Signal(9), "stall {mode}: rank 3 was to die by SIGKILL\n{}", dump(&report));
            continue;
        }
        assert_eq!(r.exit, RankExit::Code(0), "stall {mode}: rank {}\n{}", r.rank, dump(&report));
        let Some(line) = r.stdout.iter().find(|l| l.contains("VERDICT ")) else { continue };
        let took: u64 = number_after(line, " after ");
        let text = line.split("VERDICT ").nth(1).unwrap_or_default().to_string();
        verdicts.push((r.rank, took, text));
    }
    assert!(!verdicts.is_empty(), "stall {mode}: no rank reported a verdict\n{}", dump(&report));
    let first = &verdicts[0].2;
    assert!(verdicts.iter().all(|v| v.2 == *first), "stall {mode}: the verdicts differ\n{}", dump(&report));
    StallJob {
        ranks: verdicts.iter().map(|v| v.0).collect(),
        text: first.clone(),
        worst: verdicts.iter().map(|v| v.1).max().unwrap_or_default(),
        all: dump(&report),
    }
}

#[test]
fn a_killed_rank_is_named_lost_by_every_survivor() {
    let StallJob { ranks, text, worst, all } = stall_job("kill", true);
    assert_eq!(ranks, [0, 1, 2]);
    assert!(text.contains("rank 3 was lost") && !text.contains("rank 0") && !text.contains("rank 1 "), "{all}");
    assert!(worst < 1000, "a survivor's error with its verdict took {worst} ms\n{all}");
    println!("killed: within {worst} ms: {text}");
}

#[test]
fn a_stopped_rank_is_named_silent_by_every_other_within_a_second_of_the_timeout() {
    let StallJob { ranks, text, worst, all } = stall_job("stop", true);
    assert_eq!(ranks.len(), 3, "{all}");
    assert!(text.contains("rank 3 did not answer within 500.0ms"), "{all}");
    assert!((2000..3000).contains(&worst), "the verdict came {worst} ms after the call began (timeout 2 s)\n{all}");
    println!("stopped: within {worst} ms: {text}");
}

#[test]
fn an_unmatched_receive_names_the_peer_it_waits_for() {
    let StallJob { ranks, text, all, .. } = stall_job("recv", false);
    assert_eq!(ranks.len(), 1, "only rank 0 was in a call\n{all}");
    let waits = "nobody is behind it; rank 0 waits in a point-to-point group of 256 B, first peer 1 for rank 1";
    assert!(text.contains(waits), "{all}");
    println!("unmatched receive: {text}");
}

#[test]
fn an_unmatched_send_names_the_peer_it_waits_for() {
    let StallJob { ranks, text, all, .. } = stall_job("send", false);
    assert_eq!(ranks.len(), 1, "only rank 1 was in a call\n{all}");
    assert!(text.contains("rank 1 waits in a point-to-point group of 8388608 B, first peer 0 for rank 0"), "{all}");
    println!("unmatched send: {text}");
}
