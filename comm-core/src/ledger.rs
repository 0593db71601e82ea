//! A communicator's ledger: how many calls this rank began and finished, and what the latest
//! one is — its sequence number and signature (which call, how many bytes, which root). The
//! calling thread writes it at the start and end of every call; any thread reads it at any
//! time, so the notice service can answer a peer that asks how far this rank got (see
//! [`crate::verdict`]).
//!
//! Collectives and point-to-point groups are counted apart: every rank calls the collectives of
//! a communicator in the same order, so the `n`-th collective of one rank is the `n`-th of every
//! other, while a group involves only some ranks.
//!
//! # Cost
//!
//! A call writes five words with plain stores (one writer: the thread in the call) and reads
//! nothing shared; readers use the version word as a sequence lock and retry a torn read.

use std::sync::atomic::{AtomicU64, Ordering, fence};

use crate::error::{Error, Result};
use crate::wire::{Decoder, Encoder};

/// What kind of call a ledger entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum CallKind {
    /// All-reduce.
    AllReduce = 1,
    /// All-gather.
    AllGather = 2,
    /// Reduce-scatter.
    ReduceScatter = 3,
    /// Broadcast from a root.
    Broadcast = 4,
    /// Reduce to a root.
    Reduce = 5,
    /// All-to-all with equal blocks.
    AllToAll = 6,
    /// All-to-all with per-peer counts.
    AllToAllv = 7,
    /// A group of point-to-point sends and receives.
    Group = 8,
}

impl CallKind {
    /// The call's name as the API spells it.
    pub fn name(self) -> &'static str {
        match self {
            CallKind::AllReduce => "all_reduce",
            CallKind::AllGather => "all_gather",
            CallKind::ReduceScatter => "reduce_scatter",
            CallKind::Broadcast => "broadcast",
            CallKind::Reduce => "reduce",
            CallKind::AllToAll => "all_to_all",
            CallKind::AllToAllv => "all_to_allv",
            CallKind::Group => "point-to-point group",
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => CallKind::AllReduce,
            2 => CallKind::AllGather,
            3 => CallKind::ReduceScatter,
            4 => CallKind::Broadcast,
            5 => CallKind::Reduce,
            6 => CallKind::AllToAll,
            7 => CallKind::AllToAllv,
            8 => CallKind::Group,
            _ => return None,
        })
    }
}

/// What a call is, as far as its peers must agree on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallSignature {
    /// Which call.
    pub kind: CallKind,
    /// Bytes this rank passed: the call's per-rank size (a group: what it sends and receives).
    pub bytes: u64,
    /// The root of a rooted call; the first peer of a group.
    pub root: Option<u32>,
    /// Whether the buffers are GPU memory (the call was queued on a stream).
    pub device: bool,
}

impl CallSignature {
    /// A call of `kind` moving `bytes`, rooted at `root`, on host buffers.
    pub fn host(kind: CallKind, bytes: usize, root: Option<usize>) -> Self {
        CallSignature { kind, bytes: bytes as u64, root: root.map(|r| r as u32), device: false }
    }

    /// Packs into one word: kind (8 bits), device (1), root + 1 (23 bits, 0 for none), then
    /// bytes in the second word.
    fn pack(&self) -> u64 {
        let root = self.root.map_or(0, |r| (u64::from(r) + 1).min((1 << 23) - 1));
        u64::from(self.kind as u8) | (u64::from(self.device) << 8) | (root << 9)
    }

    fn unpack(word: u64, bytes: u64) -> Option<Self> {
        let kind = CallKind::from_u8((word & 0xff) as u8)?;
        let root = (word >> 9) & ((1 << 23) - 1);
        Some(CallSignature { kind, bytes, root: root.checked_sub(1).map(|r| r as u32), device: word & 0x100 != 0 })
    }
}

impl std::fmt::Display for CallSignature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {} B", self.kind.name(), self.bytes)?;
        if let Some(root) = self.root {
            let what = if self.kind == CallKind::Group { "first peer" } else { "root" };
            write!(f, ", {what} {root}")?;
        }
        if self.device {
            write!(f, ", device buffers")?;
        }
        Ok(())
    }
}

/// What a rank's ledger says at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LedgerEntry {
    /// Collectives begun (the sequence number of the latest, counting from 1).
    pub collectives_begun: u64,
    /// Collectives finished without error.
    pub collectives_finished: u64,
    /// Point-to-point groups begun.
    pub groups_begun: u64,
    /// Point-to-point groups finished without error.
    pub groups_finished: u64,
    /// The latest call begun, if any.
    pub latest: Option<CallSignature>,
    /// The peer whose wait timed out in the latest call, if one did.
    pub waited_on: Option<u32>,
}

impl LedgerEntry {
    /// Whether the latest call was begun and not finished: the rank is in it, or it failed.
    pub fn in_call(&self) -> bool {
        match self.latest {
            Some(s) if s.kind == CallKind::Group => self.groups_finished < self.groups_begun,
            Some(_) => self.collectives_finished < self.collectives_begun,
            None => false,
        }
    }

    /// Encodes the entry (a [`wire`](crate::wire) message, magic `WVLE`).
    pub fn encode(&self) -> Vec<u8> {
        let (word, bytes) = self.latest.map_or((0, 0), |s| (s.pack(), s.bytes));
        Encoder::new(*b"WVLE", 1)
            .u64(self.collectives_begun)
            .u64(self.collectives_finished)
            .u64(self.groups_begun)
            .u64(self.groups_finished)
            .u64(word)
            .u64(bytes)
            .u64(self.waited_on.map_or(0, |p| u64::from(p) + 1))
            .finish()
    }

    /// Decodes an entry, checking every field.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, *b"WVLE", 1, "ledger entry")?;
        let (cb, cf, gb, gf) = (d.u64()?, d.u64()?, d.u64()?, d.u64()?);
        let (word, size, waited) = (d.u64()?, d.u64()?, d.u64()?);
        d.finish()?;
        if cf > cb || gf > gb {
            return Err(Error::protocol(format!(
                "ledger entry: more calls finished than begun ({cf} of {cb} collectives, {gf} of {gb} groups)"
            )));
        }
        let latest = match word {
            0 => None,
            w => Some(
                CallSignature::unpack(w, size)
                    .ok_or_else(|| Error::protocol(format!("ledger entry: unknown call word {w:#x}")))?,
            ),
        };
        let waited_on = waited.checked_sub(1).map(|p| u32::try_from(p).unwrap_or(u32::MAX));
        Ok(LedgerEntry {
            collectives_begun: cb,
            collectives_finished: cf,
            groups_begun: gb,
            groups_finished: gf,
            latest,
            waited_on,
        })
    }
}

/// One communicator's ledger on one rank (see the module documentation).
#[derive(Debug, Default)]
pub struct Ledger {
    /// Odd while the writer changes the words below.
    version: AtomicU64,
    collectives_begun: AtomicU64,
    collectives_finished: AtomicU64,
    groups_begun: AtomicU64,
    groups_finished: AtomicU64,
    /// The latest call's packed signature and bytes.
    latest: AtomicU64,
    latest_bytes: AtomicU64,
    /// Peer + 1 whose wait timed out in the latest call; 0 for none.
    waited_on: AtomicU64,
}

impl Ledger {
    /// Records the start of a call; returns its sequence number (of collectives, or of groups).
    /// Only the thread in the call writes (calls of a communicator do not overlap).
    #[inline]
    pub fn begin(&self, signature: CallSignature) -> u64 {
        let counter = if signature.kind == CallKind::Group { &self.groups_begun } else { &self.collectives_begun };
        let seq = counter.load(Ordering::Relaxed) + 1;
        let v = self.version.load(Ordering::Relaxed);
        self.version.store(v + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        self.latest.store(signature.pack(), Ordering::Relaxed);
        self.latest_bytes.store(signature.bytes, Ordering::Relaxed);
        self.waited_on.store(0, Ordering::Relaxed);
        counter.store(seq, Ordering::Relaxed);
        self.version.store(v + 2, Ordering::Release);
        seq
    }

    /// Records that the latest call finished without error.
    #[inline]
    pub fn finish(&self, signature: &CallSignature) {
        let (begun, finished) = if signature.kind == CallKind::Group {
            (&self.groups_begun, &self.groups_finished)
        } else {
            (&self.collectives_begun, &self.collectives_finished)
        };
        finished.store(begun.load(Ordering::Relaxed), Ordering::Release);
    }

    /// Records that the latest call's wait for `peer` timed out.
    pub fn waited_on(&self, peer: usize) {
        self.waited_on.store(peer as u64 + 1, Ordering::Release);
    }

    /// What the ledger says now (a consistent view of one moment).
    pub fn entry(&self) -> LedgerEntry {
        loop {
            let before = self.version.load(Ordering::Acquire);
            let entry = self.read();
            fence(Ordering::Acquire);
            if before.is_multiple_of(2) && self.version.load(Ordering::Relaxed) == before {
                return entry;
            }
            std::hint::spin_loop();
        }
    }

    fn read(&self) -> LedgerEntry {
        let latest =
            CallSignature::unpack(self.latest.load(Ordering::Relaxed), self.latest_bytes.load(Ordering::Relaxed));
        let waited = self.waited_on.load(Ordering::Acquire);
        LedgerEntry {
            collectives_begun: self.collectives_begun.load(Ordering::Relaxed),
            collectives_finished: self.collectives_finished.load(Ordering::Acquire),
            groups_begun: self.groups_begun.load(Ordering::Relaxed),
            groups_finished: self.groups_finished.load(Ordering::Acquire),
            latest,
            waited_on: waited.checked_sub(1).map(|p| p as u32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_counts_collectives_and_groups_apart() {
        let l = Ledger::default();
        assert_eq!(l.entry(), LedgerEntry::default());
        let all_reduce = CallSignature::host(CallKind::AllReduce, 32, None);
        assert_eq!(l.begin(all_reduce), 1);
        assert!(l.entry().in_call());
        l.finish(&all_reduce);
        let group = CallSignature::host(CallKind::Group, 8, Some(3));
        assert_eq!(l.begin(group), 1);
        l.waited_on(3);
        let e = l.entry();
        assert_eq!((e.collectives_begun, e.collectives_finished, e.groups_begun, e.groups_finished), (1, 1, 1, 0));
        assert_eq!((e.latest, e.waited_on), (Some(group), Some(3)));
        assert!(e.in_call());
        let broadcast = CallSignature { device: true, ..CallSignature::host(CallKind::Broadcast, 1 << 40, Some(0)) };
        assert_eq!(l.begin(broadcast), 2);
        assert_eq!(l.entry().latest, Some(broadcast));
        assert_eq!(l.entry().waited_on, None, "a new call clears the timed-out peer");
        assert_eq!(broadcast.to_string(), "broadcast of 1099511627776 B, root 0, device buffers");
    }

    #[test]
    fn entries_round_trip_and_garbage_is_an_error() {
        let l = Ledger::default();
        l.begin(CallSignature::host(CallKind::AllToAllv, 12, None));
        l.waited_on(7);
        let e = l.entry();
        assert_eq!(LedgerEntry::decode(&e.encode()).unwrap(), e);
        assert_eq!(LedgerEntry::decode(&LedgerEntry::default().encode()).unwrap(), LedgerEntry::default());
        for damaged in crate::wire::damaged_messages(&e.encode()) {
            let _ = LedgerEntry::decode(&damaged);
        }
        let finished_more = LedgerEntry { collectives_finished: 2, ..e };
        assert!(LedgerEntry::decode(&finished_more.encode()).is_err());
    }

    #[test]
    fn a_reader_never_sees_a_torn_entry() {
        let l = Ledger::default();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 1..=20_000u64 {
                    // The bytes follow the sequence number, so a torn read shows.
                    let sig = CallSignature::host(CallKind::AllReduce, i as usize, None);
                    l.begin(sig);
                    l.finish(&sig);
                }
                stop.store(true, Ordering::Release);
            });
            while !stop.load(Ordering::Acquire) {
                let e = l.entry();
                if let Some(sig) = e.latest {
                    assert_eq!(sig.bytes, e.collectives_begun, "torn entry {e:?}");
                }
            }
        });
    }
}
