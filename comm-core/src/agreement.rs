//! A fault-tolerant agreement on the failed members of a communicator: every member that
//! returns returns the same set, even when members die while it runs — the set ULFM's
//! `MPI_Comm_agree` decides together with its flag, reached over a tree of the live members as
//! the early-returning agreement of Herault et al. (SC'15) does.
//!
//! # Protocol
//!
//! Each member holds a *view*: the members it knows failed (its own knowledge at the start, then
//! whatever it learns). An *attempt* is the agreement among the members outside one view,
//! arranged in a tree of fan-out [`FANOUT`] by rank (the lowest is the root). Its messages
//! ([`AgreementMessage`]) carry the sender's view:
//!
//! 1. At the start of an attempt a member sends [`Step::Probe`] to its children and
//!    [`Step::NewView`] to the neighbours of its previous attempt (they may wait for it); while
//!    it waits it sends its neighbours a `Probe` every quarter of the timeout, a heartbeat.
//! 2. A member whose children have all answered [`Step::Up`] with its view sends `Up` to its
//!    parent, carrying a decision if one reached its subtree. The root decides: the decision
//!    carried up, else its view. A decision travels as [`Step::Decided`] to the parent and the
//!    children of each member that takes it.
//! 3. A message with another view is merged: the union becomes the view (a new attempt), and a
//!    sender whose view was smaller is sent the union; a message whose view is the union
//!    counts in the new attempt. A member waiting for a peer that is lost (its bootstrap link
//!    ended) or silent for the timeout — no message, heartbeats included — adds it to its view
//!    (a new attempt). Views only grow, so there are at most n attempts.
//! 4. A member that decided answers every later message of that agreement with its decision
//!    (the [`Resilience`] slot, answered by the notice service thread even after it returned),
//!    and takes a decision only from a member outside its view.
//!
//! Why the decision is the same everywhere: a root decides only once every member outside its
//! view answered in that attempt; a member that decided earlier and is alive answers with its
//! decision, which the root then takes; a member only takes decisions from members it does not
//! hold failed, so a decision cannot arrive from a member the deciding attempt excluded. A member
//! that the others' views hold failed gets an error, not a decision.
//!
//! # Wire format
//!
//! The body of a [`NoticeKind::Agreement`](crate::notice::NoticeKind::Agreement) notice:
//! `instance: u64`, `step: u8`, `size: u32` (the communicator's), `view: bytes` (a bitmap of
//! `size` bits, member r in bit r % 8 of byte r / 8), `value: bytes` (a bitmap, or empty when no
//! decision rides along). Every length is checked against the communicator's size.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::diagnostics;
use crate::error::{Error, Result};
use crate::resilience::Resilience;
use crate::wire::{Decoder, Encoder};

/// Children per member in an attempt's tree.
pub const FANOUT: usize = 4;
/// How often a waiting member looks at whether the peers it waits for are lost.
const LOOK: Duration = Duration::from_millis(10);
/// Magic of an agreement message body.
const MAGIC: [u8; 4] = *b"WVAG";
/// Version of the agreement message body.
const VERSION: u16 = 1;

/// What an agreement message says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    /// "My subtree answered in my view" (with a decision, if one reached it).
    Up = 1,
    /// "I started an attempt in this view; answer when you can" (to a child).
    Probe = 2,
    /// "My view is now this" (to a neighbour of my previous attempt, or a sender behind).
    NewView = 3,
    /// "The decision is this."
    Decided = 4,
}

/// One agreement message (see the module documentation for its wire format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgreementMessage {
    /// Which agreement of the communicator.
    pub instance: u64,
    /// What it says.
    pub step: Step,
    /// The sender's view: the members it holds failed.
    pub view: BTreeSet<usize>,
    /// A decision, where one rides along.
    pub value: Option<BTreeSet<usize>>,
}

impl AgreementMessage {
    /// A [`Step::Decided`] message of `value`.
    pub fn decided(instance: u64, value: &BTreeSet<usize>) -> Self {
        AgreementMessage { instance, step: Step::Decided, view: BTreeSet::new(), value: Some(value.clone()) }
    }

    /// The body's bytes for a communicator of `size` members.
    pub fn encode(&self, size: usize) -> Vec<u8> {
        let mut e = Encoder::new(MAGIC, VERSION);
        e.u64(self.instance).u8(self.step as u8).u32(size as u32).bytes(&bitmap(&self.view, size));
        match &self.value {
            Some(v) => e.u8(1).bytes(&bitmap(v, size)),
            None => e.u8(0).bytes(&[]),
        };
        e.finish()
    }

    /// Decodes a body from a member of a `size`-member communicator: every member named must
    /// be below `size`.
    pub fn decode(bytes: &[u8], size: usize) -> Result<Self> {
        let mut d = Decoder::new(bytes, MAGIC, VERSION, "agreement message")?;
        let instance = d.u64()?;
        let step = match d.u8()? {
            1 => Step::Up,
            2 => Step::Probe,
            3 => Step::NewView,
            4 => Step::Decided,
            other => return Err(Error::protocol(format!("agreement message of unknown step {other}"))),
        };
        let bits = d.u32()? as usize;
        if bits > size {
            return Err(Error::protocol(format!(
                "agreement message names {bits} members; the communicator has {size}"
            )));
        }
        let view = members_of(d.bytes()?, bits)?;
        let has_value = d.u8()?;
        let value_bytes = d.bytes()?;
        let value = match has_value {
            0 if value_bytes.is_empty() => None,
            1 => Some(members_of(value_bytes, bits)?),
            _ => return Err(Error::protocol("agreement message: malformed decision field")),
        };
        d.finish()?;
        Ok(AgreementMessage { instance, step, view, value })
    }
}

/// `set` as a bitmap of `size` bits.
fn bitmap(set: &BTreeSet<usize>, size: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; size.div_ceil(8)];
    for &m in set.iter().filter(|&&m| m < size) {
        bytes[m / 8] |= 1 << (m % 8);
    }
    bytes
}

/// The members of a bitmap of `size` bits; its length must fit.
fn members_of(bytes: &[u8], size: usize) -> Result<BTreeSet<usize>> {
    if bytes.len() != size.div_ceil(8) {
        return Err(Error::protocol(format!(
            "agreement message: a bitmap of {} bytes for {size} members",
            bytes.len()
        )));
    }
    let set: BTreeSet<usize> = (0..size).filter(|&m| bytes[m / 8] & (1 << (m % 8)) != 0).collect();
    Ok(set)
}

/// One attempt's place of this member: its parent and children among the live members.
struct Place {
    parent: Option<usize>,
    children: Vec<usize>,
}

impl Place {
    fn of(me: usize, size: usize, view: &BTreeSet<usize>) -> Place {
        let alive: Vec<usize> = (0..size).filter(|m| !view.contains(m)).collect();
        let pos = alive.binary_search(&me).unwrap_or(0);
        let parent = (pos > 0).then(|| alive[(pos - 1) / FANOUT]);
        let children = (FANOUT * pos + 1..=FANOUT * pos + FANOUT).filter_map(|c| alive.get(c).copied()).collect();
        Place { parent, children }
    }

    fn neighbours(&self) -> impl Iterator<Item = usize> + '_ {
        self.parent.iter().copied().chain(self.children.iter().copied())
    }
}

/// What ended an attempt.
enum Outcome {
    /// The view grew: start again.
    Grew,
    /// The decision.
    Decided(BTreeSet<usize>),
}

/// Agrees with the other live members on the failed ones (see the module documentation);
/// `known_failed` is what this member knows already. Every member that returns `Ok` returns the
/// same sorted list. Each wait for a peer is bounded by `timeout`, after which that peer counts
/// as failed.
///
/// # Errors
/// [`Error::Revoked`] when the other members hold this one failed (it was too slow to answer, or
/// cut off); [`Error::Unsupported`] when the bootstrap carries no notices.
pub fn agree(resilience: &Resilience, known_failed: &BTreeSet<usize>, timeout: Duration) -> Result<Vec<usize>> {
    let instance = resilience.next_agreement();
    let (me, size) = (resilience.rank(), resilience.size());
    let started = Instant::now();
    let mut view: BTreeSet<usize> = known_failed.iter().copied().filter(|&m| m < size && m != me).collect();
    let mut previous: Vec<usize> = Vec::new();
    let mut attempts = 0usize;
    let decision = loop {
        attempts += 1;
        let place = Place::of(me, size, &view);
        tracing::debug!(
            target: diagnostics::FAULT,
            rank = me,
            instance,
            attempt = attempts,
            "agreement attempt in view {view:?}: parent {:?}, children {:?}",
            place.parent,
            place.children
        );
        for &p in &previous {
            send(resilience, p, instance, Step::NewView, &view, None);
        }
        for &c in &place.children {
            send(resilience, c, instance, Step::Probe, &view, None);
        }
        match attempt(resilience, instance, &place, &mut view, timeout)? {
            Outcome::Decided(value) => break value,
            Outcome::Grew => previous = place.neighbours().collect(),
        }
    };
    tracing::info!(
        target: diagnostics::FAULT,
        rank = me,
        instance,
        attempts,
        took = ?started.elapsed(),
        "agreed on the failed members {:?}",
        decision
    );
    Ok(decision.into_iter().collect())
}

/// Runs one attempt in `view` until it decides or the view grows.
fn attempt(
    resilience: &Resilience,
    instance: u64,
    place: &Place,
    view: &mut BTreeSet<usize>,
    timeout: Duration,
) -> Result<Outcome> {
    let me = resilience.rank();
    let mut pending: BTreeSet<usize> = place.children.iter().copied().collect();
    let mut carried: Option<BTreeSet<usize>> = None;
    let mut sent_up = false;
    // When each neighbour was last heard from: a neighbour counts as failed once silent for the
    // timeout. Members heartbeat their neighbours, so a parent still waiting for a slow or dead
    // subtree of its own is not taken for dead by the children waiting for it.
    let started = Instant::now();
    let mut heard: std::collections::HashMap<usize, Instant> = place.neighbours().map(|n| (n, started)).collect();
    let beat = (timeout / 4).max(Duration::from_millis(50));
    let mut last_beat = started;
    loop {
        if pending.is_empty() && !sent_up {
            let Some(parent) = place.parent else {
                let value = carried.clone().unwrap_or_else(|| view.clone());
                return Ok(Outcome::Decided(take(resilience, instance, place, &value, None)));
            };
            send(resilience, parent, instance, Step::Up, view, carried.as_ref());
            sent_up = true;
            heard.insert(parent, Instant::now());
        }
        if last_beat.elapsed() >= beat {
            for n in place.neighbours() {
                send(resilience, n, instance, Step::Probe, view, None);
            }
            last_beat = Instant::now();
        }
        let Some((from, message)) = resilience.next_message(instance, LOOK) else {
            let waiting: Vec<usize> =
                if sent_up { place.parent.into_iter().collect() } else { pending.iter().copied().collect() };
            let silent = |w: usize| heard.get(&w).is_none_or(|t| t.elapsed() >= timeout);
            let failed: Vec<usize> =
                waiting.into_iter().filter(|&w| silent(w) || resilience.member_lost(w).is_some()).collect();
            if failed.is_empty() {
                continue;
            }
            tracing::debug!(target: diagnostics::FAULT, rank = me, instance, ?failed, "agreement: members failed while waited for");
            view.extend(failed);
            return Ok(Outcome::Grew);
        };
        heard.insert(from, Instant::now());
        tracing::trace!(target: diagnostics::FAULT, rank = me, instance, from, "agreement message {:?} view {:?} value {:?}", message.step, message.view, message.value);
        if view.contains(&from) {
            // A member this one holds failed takes no part (its late messages are dropped).
            continue;
        }
        match message.step {
            Step::Decided => {
                let value = message.value.unwrap_or_default();
                return Ok(Outcome::Decided(take(resilience, instance, place, &value, Some(from))));
            }
            _ if message.view != *view => {
                let merged: BTreeSet<usize> = view.union(&message.view).copied().collect();
                if merged.contains(&me) {
                    return Err(declared_failed(me));
                }
                if merged != message.view {
                    send(resilience, from, instance, Step::NewView, &merged, None);
                }
                if merged != *view {
                    if merged == message.view {
                        // The sender is already in the attempt this member starts now: its
                        // message (an `Up` above all) counts there.
                        resilience.put_back(instance, from, message);
                    }
                    *view = merged;
                    return Ok(Outcome::Grew);
                }
            }
            Step::Up => {
                if pending.remove(&from)
                    && let Some(value) = message.value
                {
                    carried.get_or_insert(value);
                }
            }
            Step::Probe | Step::NewView => {}
        }
    }
}

/// Takes `value` as this member's decision: records it (later messages are answered with it)
/// and passes it to the attempt's neighbours other than `from`.
fn take(
    resilience: &Resilience,
    instance: u64,
    place: &Place,
    value: &BTreeSet<usize>,
    from: Option<usize>,
) -> BTreeSet<usize> {
    resilience.decide(instance, value);
    for n in place.neighbours().filter(|&n| Some(n) != from) {
        send(resilience, n, instance, Step::Decided, &BTreeSet::new(), Some(value));
    }
    value.clone()
}

fn send(
    resilience: &Resilience,
    to: usize,
    instance: u64,
    step: Step,
    view: &BTreeSet<usize>,
    value: Option<&BTreeSet<usize>>,
) {
    let message = AgreementMessage { instance, step, view: view.clone(), value: value.cloned() };
    resilience.send_agreement(to, &message);
}

#[cold]
fn declared_failed(me: usize) -> Error {
    Error::Revoked(format!(
        "the other members agree that rank {me} failed (it did not answer within the timeout): it takes no further \
         part; build a new communicator, or join again through grow"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_every_damaged_one_is_an_error_or_a_message() {
        let m = AgreementMessage {
            instance: 3,
            step: Step::Up,
            view: [1, 9].into_iter().collect(),
            value: Some([9].into_iter().collect()),
        };
        let bytes = m.encode(12);
        assert_eq!(AgreementMessage::decode(&bytes, 12).unwrap(), m);
        assert!(AgreementMessage::decode(&bytes, 8).is_err(), "12 members named to an 8-member communicator");
        for damaged in crate::wire::damaged_messages(&bytes) {
            let _ = AgreementMessage::decode(&damaged, 12);
        }
        let none = AgreementMessage { instance: 0, step: Step::Probe, view: BTreeSet::new(), value: None };
        assert_eq!(AgreementMessage::decode(&none.encode(3), 3).unwrap(), none);
    }

    #[test]
    fn the_tree_of_an_attempt_skips_the_failed() {
        let view: BTreeSet<usize> = [0, 2].into_iter().collect();
        let root = Place::of(1, 8, &view);
        assert_eq!((root.parent, root.children.clone()), (None, vec![3, 4, 5, 6]));
        let leaf = Place::of(7, 8, &view);
        assert_eq!((leaf.parent, leaf.children), (Some(3), vec![]));
    }
}
