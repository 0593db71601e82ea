//! The verdict on a stalled call (issue "survive a failure", item 6): every rank whose call
//! times out or loses a peer gets, inside its error, the same judgement of the members'
//! ledgers — which rank is behind, in which call, how far it got — within a second of its
//! timeout. Thread ranks over the loopback bootstrap here; killed and stopped processes in
//! `tests/elastic.rs`.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use collectives::{Communicator, ReduceOp};
use comm_core::Error;
use comm_core::config::Config;
use comm_core::loopback::{LoopbackBootstrap, LoopbackTransport};
use comm_core::verdict::Lag;

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
