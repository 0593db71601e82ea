//! Model-checked concurrency: the lock-free core run by [loom] over every interleaving of
//! small scenarios, with loads free to return any value the memory model allows.
//!
//! Built only for `--cfg loom` tests (`cargo xtask loom`), where [`crate::sync`] hands the
//! trigger FIFO, the doorbell, the bounded waits, the semaphore's tally and the slot credits
//! loom's atomics, locks and scheduler instead of the standard library's. Every model runs the
//! library's own code; where the code under test leaves a store to its caller (a semaphore's
//! token is stored by a connection, a link's slots by the link), the model makes the store the
//! way the caller does, in the caller's order and with its orderings.
//!
//! What a model reports:
//! - a failed assertion (a trigger lost, duplicated or out of order, a signal taken twice);
//! - a data race on a [`loom::cell::UnsafeCell`] (a slot or a payload read while it is written,
//!   or read without the release/acquire pair that makes the write visible);
//! - a deadlock: under loom a doorbell's sleep has no time slice, so a lost wake-up leaves its
//!   sleeper asleep for good, which loom reports.
//!
//! Each model bounds the preemptions it explores ([`PREEMPTIONS`]); loom then explores every
//! schedule with at most that many, which is where the bugs of protocols this small show.
//!
//! [loom]: https://docs.rs/loom

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

use crate::doorbell::Doorbell;
use crate::error::Result;
use crate::fifo::{Trigger, TriggerFields, TriggerFifo, TriggerType};
use crate::semaphore::{SemaphoreCounts, SemaphoreTally};
use crate::slot_credits::SlotCredits;
use crate::spin::{WaitContext, wait_until_rung};
use crate::sync::AtomicU64;

/// Preemptions a model of two threads explores at most in one execution.
const PREEMPTIONS: usize = 3;

/// Preemptions a model of three threads explores at most in one execution: each spins while
/// it waits, and a third bound would take the model hours.
const PREEMPTIONS_OF_THREE: usize = 2;

/// Runs `model` over every schedule loom explores within [`PREEMPTIONS`].
fn check(model: impl Fn() + Sync + Send + 'static) {
    check_within(PREEMPTIONS, model);
}

/// Runs `model` over every schedule loom explores within `preemptions`.
fn check_within(preemptions: usize, model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.max_branches = 20_000;
    builder.check(model);
}

/// No peer to lose and no progress to make.
fn fine() -> Result<()> {
    Ok(())
}

/// Never set: the models' waits end only by their conditions.
static NEVER_ABORTED: AtomicBool = AtomicBool::new(false);

/// A wait that gives up only after a minute of real time: no schedule of a model comes near it,
/// so a wait that cannot end shows as a deadlock or a model that does not finish, not as a
/// timeout.
fn patient(operation: &str) -> WaitContext<'_> {
    WaitContext { operation, peer: None, timeout: Duration::from_secs(60), abort: &NEVER_ABORTED, check_peer: &fine }
}

/// A trigger that names its producer and its index (in the size field).
fn numbered(producer: u64, index: u64) -> Trigger {
    Trigger::new(TriggerFields::new(TriggerType::DATA, producer * 1000 + index, (0, 0), (0, 0), 0))
        .expect("a small size fits its field")
}

/// `producers` threads push `each` triggers into a FIFO of `capacity` slots while one consumer
/// polls and pops: every trigger arrives once, each producer's in its order, across laps and
/// through a full ring.
fn fifo_model(capacity: u32, producers: u64, each: u64) {
    check_within(if producers > 1 { PREEMPTIONS_OF_THREE } else { PREEMPTIONS }, move || {
        let fifo = Arc::new(TriggerFifo::new(capacity).expect("a valid capacity"));
        let pushers: Vec<_> = (0..producers)
            .map(|p| {
                let fifo = fifo.clone();
                thread::spawn(move || {
                    for i in 0..each {
                        fifo.push(numbered(p, i), &patient("push")).expect("the consumer frees the ring");
                    }
                })
            })
            .collect();
        let mut next = vec![0u64; producers as usize];
        let mut popped = 0;
        while popped < producers * each {
            let Some(trigger) = fifo.poll() else {
                thread::yield_now();
                continue;
            };
            let (p, i) = (trigger.size() / 1000, trigger.size() % 1000);
            assert!(p < producers, "a trigger from no producer: {trigger:?}");
            assert_eq!(i, next[p as usize], "producer {p}'s triggers out of order or repeated");
            next[p as usize] += 1;
            assert!(fifo.pop(), "the polled trigger is still there to pop");
            popped += 1;
        }
        for pusher in pushers {
            pusher.join().expect("producer");
        }
        assert!(fifo.poll().is_none(), "a trigger nobody pushed");
        assert_eq!((fifo.head(), fifo.tail()), (producers * each, producers * each));
    });
}

#[test]
fn fifo_two_producers_commit_out_of_order() {
    // Two slots: the second reservation may be committed first, and the consumer must wait
    // for the first.
    fifo_model(2, 2, 1);
}

#[test]
fn fifo_one_slot_three_laps() {
    // Capacity 1: every push waits for the previous pop, and the lap parity alone tells the
    // new trigger from the last lap's.
    fifo_model(1, 1, 3);
}

#[test]
fn fifo_wait_processed_sees_what_the_consumer_did() {
    check(|| {
        let fifo = Arc::new(TriggerFifo::new(2).expect("a valid capacity"));
        let result = Arc::new(UnsafeCell::new(0u64));
        let consumer = {
            let (fifo, result) = (fifo.clone(), result.clone());
            thread::spawn(move || {
                loop {
                    if let Some(trigger) = fifo.poll() {
                        // SAFETY: loom's cell: the producer reads it only after `pop` below.
                        result.with_mut(|r| unsafe { *r = trigger.size() });
                        assert!(fifo.pop());
                        return;
                    }
                    thread::yield_now();
                }
            })
        };
        let ticket = fifo.push(numbered(0, 7), &patient("push")).expect("push");
        fifo.wait_processed(ticket, &patient("wait processed")).expect("the consumer pops");
        // SAFETY: loom's cell; loom reports the read if `wait_processed` did not order it
        // after the consumer's write.
        assert_eq!(result.with(|r| unsafe { *r }), 7);
        consumer.join().expect("consumer");
    });
}

/// A waiter sleeps on a doorbell until a word is 1; another thread stores the 1 and rings, with
/// the fence or without. Returns nothing: a lost wake is a deadlock, which loom reports.
fn doorbell_model(fenced: bool) {
    check(move || {
        let shared = Arc::new((Doorbell::new(), AtomicU64::new(0)));
        let writer = {
            let shared = shared.clone();
            thread::spawn(move || {
                let (bell, word) = &*shared;
                word.store(1, Ordering::Release);
                bell.ring_fenced(fenced);
            })
        };
        let (bell, word) = &*shared;
        while !bell.sleep(Duration::from_secs(60), || word.load(Ordering::Acquire) == 1) {}
        assert_eq!(bell.sleepers(), 0, "the sleeper took its announcement back");
        writer.join().expect("writer");
    });
}

#[test]
fn doorbell_loses_no_wake_up() {
    doorbell_model(true);
}

/// The check can fail: without the fence before it looks for sleepers (what a ring does on an
/// uncrowded host, where a sleep's slice bounds the loss), loom finds the schedule in which the
/// writer misses the sleeper and the sleeper misses the store.
#[test]
#[should_panic(expected = "deadlock")]
fn doorbell_without_its_fence_can_lose_a_wake_up() {
    doorbell_model(false);
}

#[test]
fn doorbell_a_wait_until_rung_ends_with_the_ring() {
    // The bounded wait that links and barriers use, asleep on the doorbell from its first
    // snooze (under loom a backoff sleeps at once), woken by a ring after the store.
    check(|| {
        let shared = Arc::new((Doorbell::new(), AtomicU64::new(0)));
        let writer = {
            let shared = shared.clone();
            thread::spawn(move || {
                let (bell, word) = &*shared;
                for value in 1..=2 {
                    word.store(value, Ordering::Release);
                    bell.ring();
                }
            })
        };
        let (bell, word) = &*shared;
        wait_until_rung(&patient("wait"), Some(bell), &fine, || word.load(Ordering::Acquire) == 2)
            .expect("the ring ends the wait");
        writer.join().expect("writer");
    });
}

#[test]
fn semaphore_signals_from_two_threads_reach_the_token_in_order() {
    check(|| {
        let tally = Arc::new(SemaphoreTally::new(SemaphoreCounts::default()));
        let token = Arc::new(AtomicU64::new(0));
        let signallers: Vec<_> = (0..2)
            .map(|_| {
                let (tally, token) = (tally.clone(), token.clone());
                thread::spawn(move || {
                    tally
                        .signal(|next| {
                            // The connection's store into the peer's token.
                            assert_eq!(token.load(Ordering::Relaxed), next - 1, "signals out of order");
                            token.store(next, Ordering::Release);
                            Ok(())
                        })
                        .expect("signal");
                })
            })
            .collect();
        for s in signallers {
            s.join().expect("signaller");
        }
        assert_eq!(token.load(Ordering::Relaxed), 2);
    });
}

#[test]
fn semaphore_every_signal_is_taken_once_by_a_wait_and_a_poll() {
    check_within(PREEMPTIONS_OF_THREE, || {
        // The peer writes payload `n`, then stores signal `n` into this side's token (a
        // connection's update-and-sync after its writes) and rings. A poll and a wait race for
        // the two signals; a poll that finds none waits instead. The waits sleep on the
        // doorbell: two threads spinning at once would only explore loom's scheduler.
        struct Side {
            tally: SemaphoreTally,
            token: AtomicU64,
            bell: Doorbell,
            payloads: [UnsafeCell<u64>; 2],
        }
        let side = Arc::new(Side {
            tally: SemaphoreTally::new(SemaphoreCounts::default()),
            token: AtomicU64::new(0),
            bell: Doorbell::new(),
            payloads: [UnsafeCell::new(0), UnsafeCell::new(0)],
        });
        fn take(side: &Side, poll_first: bool) -> u64 {
            let polled = if poll_first { side.tally.poll(side.token.load(Ordering::Acquire)) } else { None };
            let n = polled.unwrap_or_else(|| {
                side.tally
                    .wait(|n| {
                        wait_until_rung(&patient("semaphore wait"), Some(&side.bell), &fine, || {
                            side.token.load(Ordering::Acquire) >= n
                        })
                    })
                    .expect("the peer signals twice")
            });
            // SAFETY: loom's cell; a signal taken before the peer stored it races here.
            assert_eq!(side.payloads[n as usize - 1].with(|p| unsafe { *p }), 100 + n);
            n
        }
        let peer = {
            let side = side.clone();
            thread::spawn(move || {
                for n in 1..=2u64 {
                    // SAFETY: loom's cell: a taker reads payload `n` only after it took signal
                    // `n`, which the store below publishes.
                    side.payloads[n as usize - 1].with_mut(|p| unsafe { *p = 100 + n });
                    side.token.store(n, Ordering::Release);
                    side.bell.ring();
                }
            })
        };
        let poller = {
            let side = side.clone();
            thread::spawn(move || take(&side, true))
        };
        let waited = take(&side, false);
        let polled = poller.join().expect("poller");
        peer.join().expect("peer");
        assert_ne!(waited, polled, "one signal taken twice");
        assert_eq!(side.tally.taken(), 2);
    });
}

/// A link's slot ring of `slots` slots, credits returned every `batch` messages: a sender posts
/// `messages` messages into the receiver's slots the way a link posting directly does (payload,
/// then the sequence word with release, then a ring of the receiver's doorbell) and the
/// receiver takes them the way it does (the sequence word with acquire, the payload, then the
/// credits with release and a ring of the sender's doorbell). Both sleep on their doorbells
/// when they wait. A slot written while the receiver reads it is a data race loom reports.
fn link_model(slots: usize, batch: usize, messages: u64) {
    check(move || {
        struct Ring {
            sequence: Vec<AtomicU64>,
            payload: Vec<UnsafeCell<u64>>,
            freed: AtomicU64,
            receiver_bell: Doorbell,
            sender_bell: Doorbell,
        }
        let ring = Arc::new(Ring {
            sequence: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            payload: (0..slots).map(|_| UnsafeCell::new(0)).collect(),
            freed: AtomicU64::new(0),
            receiver_bell: Doorbell::new(),
            sender_bell: Doorbell::new(),
        });
        let sender = {
            let ring = ring.clone();
            thread::spawn(move || {
                let mut credits = SlotCredits::new(slots, batch);
                for m in 1..=messages {
                    if !credits.has_credit(&ring.freed) {
                        let limit = credits.credit_limit();
                        wait_until_rung(&patient("credit"), Some(&ring.sender_bell), &fine, || {
                            ring.freed.load(Ordering::Acquire) >= limit
                        })
                        .expect("the receiver returns credits");
                        credits.refresh(&ring.freed);
                        assert!(credits.knows_credit());
                    }
                    let slot = credits.slot_after(credits.posted());
                    // SAFETY: loom's cell; the credit says the receiver is done with the slot.
                    ring.payload[slot].with_mut(|p| unsafe { *p = m });
                    ring.sequence[slot].store(credits.next_sequence(), Ordering::Release);
                    ring.receiver_bell.ring();
                    credits.note_posted();
                }
            })
        };
        let mut credits = SlotCredits::new(slots, batch);
        for m in 1..=messages {
            let target = credits.next_arrival();
            let slot = credits.slot_after(credits.consumed());
            wait_until_rung(&patient("message"), Some(&ring.receiver_bell), &fine, || {
                ring.sequence[slot].load(Ordering::Acquire) >= target
            })
            .expect("the sender posts");
            assert_eq!(ring.sequence[slot].load(Ordering::Acquire), m, "a message out of sequence");
            // SAFETY: loom's cell; published by the sequence word loaded above.
            assert_eq!(ring.payload[slot].with(|p| unsafe { *p }), m);
            if let Some(consumed) = credits.note_consumed() {
                SlotCredits::return_credits(&ring.freed, consumed);
                ring.sender_bell.ring();
            }
        }
        sender.join().expect("sender");
    });
}

#[test]
fn link_credits_one_by_one_through_two_slots() {
    link_model(2, 1, 4);
}

#[test]
fn link_credits_in_batches_of_two_through_two_slots() {
    link_model(2, 2, 4);
}

#[test]
fn link_credits_one_slot() {
    link_model(1, 1, 3);
}
