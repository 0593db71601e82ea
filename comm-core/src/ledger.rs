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
//! A call makes four plain stores (one writer: the thread in the call) and reads nothing
//! shared; the words describing the latest call carry low bits of its sequence number, so a
//! reader tells a torn read and takes it again.
//!
//! # The GPU's progress
//!
//! A device call's host side returns once its kernel is launched; whether the GPU has begun
//! it is another matter (a GPU kept busy by work queued before it has not). A communicator
//! with a GPU hands its ledger a [`DeviceProgress`] — the latest collective whose kernel has
//! started, which the kernels themselves report — and every entry carries it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

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

/// How far a rank's GPU got: read by the ledger whenever it is asked (see the module
/// documentation).
pub trait DeviceProgress: Send + Sync + std::fmt::Debug {
    /// The collective number (as the ledger counts them) of the latest call whose kernel has
    /// started on the GPU; 0 before the first.
    fn started_call(&self) -> u64;
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
    /// The latest collective whose kernel has started on this rank's GPU (0: none, or no GPU).
    pub device_started: u64,
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
        Encoder::new(*b"WVLE", 2)
            .u64(self.collectives_begun)
            .u64(self.collectives_finished)
            .u64(self.groups_begun)
            .u64(self.groups_finished)
            .u64(word)
            .u64(bytes)
            .u64(self.waited_on.map_or(0, |p| u64::from(p) + 1))
            .u64(self.device_started)
            .finish()
    }

    /// Decodes an entry, checking every field.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, *b"WVLE", 2, "ledger entry")?;
        let (cb, cf, gb, gf) = (d.u64()?, d.u64()?, d.u64()?, d.u64()?);
        let (word, size, waited, device_started) = (d.u64()?, d.u64()?, d.u64()?, d.u64()?);
        d.finish()?;
        if device_started > cb {
            return Err(Error::protocol(format!(
                "ledger entry: the GPU started collective {device_started} of {cb} begun"
            )));
        }
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
            device_started,
        })
    }
}

/// Where the fields of a ledger's `latest` word lie: kind (4 bits), device (1), the low 11 bits
/// of the call's sequence number, bytes (48, saturating).
const KIND_MASK: u64 = 0xf;
const DEVICE_BIT: u64 = 1 << 4;
const TAG_SHIFT: u32 = 5;
const TAG_MASK: u64 = 0x7ff;
const BYTES_SHIFT: u32 = 16;
const BYTES_MAX: u64 = (1 << 48) - 1;

/// The tag of call `seq` of `kind` in a [`Ledger`]'s root and timed-out-peer words: 24 low bits
/// of the sequence number and the kind (a collective and a group may have the same number).
#[inline(always)]
fn call_id(kind: CallKind, seq: u64) -> u64 {
    (seq & 0xff_ffff) | ((kind as u64) << 24)
}

/// One communicator's ledger on one rank (see the module documentation).
///
/// The words describing the latest call carry low bits of its sequence number. A reader reads
/// the counters, then those words, then the counters again: with the counters unchanged the
/// words belong to the latest call or — while the writer is between its stores — to the next
/// one, which the bits tell apart, and the read is taken again.
#[derive(Debug, Default)]
pub struct Ledger {
    /// The GPU's progress, once a GPU engine registered it.
    device: OnceLock<Arc<dyn DeviceProgress>>,
    collectives_begun: AtomicU64,
    collectives_finished: AtomicU64,
    groups_begun: AtomicU64,
    groups_finished: AtomicU64,
    /// The latest call: kind, device, tag, bytes (see [`KIND_MASK`] and the rest).
    latest: AtomicU64,
    /// Root + 1 of the latest rooted call (low 32 bits) and its [`call_id`] (high 32).
    root: AtomicU64,
    /// Peer + 1 whose wait timed out (low 32 bits) in the call of the [`call_id`] (high 32).
    waited_on: AtomicU64,
}

impl Ledger {
    /// Records the start of a call; returns its sequence number (of collectives, or of groups),
    /// which [`finish`](Self::finish) takes. Only the thread in the call writes (calls of a
    /// communicator do not overlap): two plain stores, three for a rooted call.
    #[inline]
    pub fn begin(&self, signature: CallSignature) -> u64 {
        let counter = if signature.kind == CallKind::Group { &self.groups_begun } else { &self.collectives_begun };
        let seq = counter.load(Ordering::Relaxed) + 1;
        if let Some(root) = signature.root {
            let id = call_id(signature.kind, seq);
            self.root.store((u64::from(root) + 1) | (id << 32), Ordering::Relaxed);
        }
        let word = signature.kind as u64
            | if signature.device { DEVICE_BIT } else { 0 }
            | ((seq & TAG_MASK) << TAG_SHIFT)
            | (signature.bytes.min(BYTES_MAX) << BYTES_SHIFT);
        self.latest.store(word, Ordering::Release);
        counter.store(seq, Ordering::Release);
        seq
    }

    /// Records that call `seq` of `signature`'s kind finished without error.
    #[inline]
    pub fn finish(&self, signature: &CallSignature, seq: u64) {
        let finished =
            if signature.kind == CallKind::Group { &self.groups_finished } else { &self.collectives_finished };
        finished.store(seq, Ordering::Release);
    }

    /// Collectives begun so far (this rank's view; the writer's thread reads it cheaply).
    #[inline]
    pub fn collectives_begun(&self) -> u64 {
        self.collectives_begun.load(Ordering::Relaxed)
    }

    /// Point-to-point groups begun so far.
    #[inline]
    pub fn groups_begun(&self) -> u64 {
        self.groups_begun.load(Ordering::Relaxed)
    }

    /// Makes every later entry carry `progress` (the communicator's GPU; set once, later calls
    /// are ignored).
    pub fn watch_device(&self, progress: Arc<dyn DeviceProgress>) {
        let _ = self.device.set(progress);
    }

    /// Records that the latest call's wait for `peer` timed out.
    pub fn waited_on(&self, peer: usize) {
        let Some((kind, seq)) = self.latest_call() else { return };
        let peer = (peer as u64 + 1).min(u64::from(u32::MAX));
        self.waited_on.store((call_id(kind, seq) << 32) | peer, Ordering::Release);
    }

    /// The kind and sequence number of the latest call (the writer's view).
    fn latest_call(&self) -> Option<(CallKind, u64)> {
        let kind = CallKind::from_u8((self.latest.load(Ordering::Relaxed) & KIND_MASK) as u8)?;
        let counter = if kind == CallKind::Group { &self.groups_begun } else { &self.collectives_begun };
        Some((kind, counter.load(Ordering::Relaxed)))
    }

    /// What the ledger says now (a consistent view of one moment: a read that straddles the
    /// start of a call is taken again).
    pub fn entry(&self) -> LedgerEntry {
        loop {
            if let Some(entry) = self.read() {
                return entry;
            }
            std::hint::spin_loop();
        }
    }

    /// One attempt at [`entry`](Self::entry); `None` when the words do not belong together.
    fn read(&self) -> Option<LedgerEntry> {
        let collectives_begun = self.collectives_begun.load(Ordering::Acquire);
        let groups_begun = self.groups_begun.load(Ordering::Acquire);
        let word = self.latest.load(Ordering::Acquire);
        let (root_word, waited) = (self.root.load(Ordering::Acquire), self.waited_on.load(Ordering::Acquire));
        let collectives_finished = self.collectives_finished.load(Ordering::Acquire);
        let groups_finished = self.groups_finished.load(Ordering::Acquire);
        let stable = self.collectives_begun.load(Ordering::Acquire) == collectives_begun
            && self.groups_begun.load(Ordering::Acquire) == groups_begun;
        if !stable {
            return None;
        }
        // With the begun counts stable, more finished than begun is a caller's misuse of
        // `finish` (no race makes it): the view is clamped rather than retried for ever.
        let collectives_finished = collectives_finished.min(collectives_begun);
        let groups_finished = groups_finished.min(groups_begun);
        // A kernel reports the number it was launched with, never more than was begun.
        let device_started = self.device.get().map_or(0, |d| d.started_call().min(collectives_begun));
        let entry = |latest, waited_on| LedgerEntry {
            collectives_begun,
            collectives_finished,
            groups_begun,
            groups_finished,
            latest,
            waited_on,
            device_started,
        };
        let Some(kind) = CallKind::from_u8((word & KIND_MASK) as u8) else { return Some(entry(None, None)) };
        let seq = if kind == CallKind::Group { groups_begun } else { collectives_begun };
        if (word >> TAG_SHIFT) & TAG_MASK != seq & TAG_MASK {
            return None;
        }
        let id = call_id(kind, seq);
        let rooted = root_word >> 32 == id;
        let signature = CallSignature {
            kind,
            bytes: word >> BYTES_SHIFT,
            root: rooted.then(|| (root_word & u64::from(u32::MAX)).saturating_sub(1) as u32),
            device: word & DEVICE_BIT != 0,
        };
        let waited_on = (waited >> 32 == id).then(|| (waited & u64::from(u32::MAX)).saturating_sub(1) as u32);
        Some(entry(Some(signature), waited_on))
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
        l.finish(&all_reduce, 1);
        let group = CallSignature::host(CallKind::Group, 8, Some(3));
        assert_eq!(l.begin(group), 1);
        l.waited_on(3);
        let e = l.entry();
        assert_eq!((e.collectives_begun, e.collectives_finished, e.groups_begun, e.groups_finished), (1, 1, 1, 0));
        assert_eq!((e.latest, e.waited_on), (Some(group), Some(3)));
        assert!(e.in_call());
        let broadcast = CallSignature { device: true, ..CallSignature::host(CallKind::Broadcast, 1 << 40, Some(0)) };
        l.waited_on(5);
        assert_eq!(l.begin(broadcast), 2);
        assert_eq!(l.entry().latest, Some(broadcast));
        assert_eq!(l.entry().waited_on, None, "a new call clears the timed-out peer");
        assert_eq!(broadcast.to_string(), "broadcast of 1099511627776 B, root 0, device buffers");
    }

    #[test]
    fn a_finish_beyond_the_calls_begun_is_clamped_not_spun_on() {
        let l = Ledger::default();
        let all_reduce = CallSignature::host(CallKind::AllReduce, 32, None);
        assert_eq!(l.begin(all_reduce), 1);
        l.finish(&all_reduce, 7);
        l.finish(&CallSignature::host(CallKind::Group, 8, None), 3);
        let e = l.entry();
        assert_eq!((e.collectives_begun, e.collectives_finished, e.groups_begun, e.groups_finished), (1, 1, 0, 0));
    }

    #[test]
    fn entries_carry_how_far_the_gpu_got_never_past_what_was_begun() {
        #[derive(Debug)]
        struct Started(AtomicU64);
        impl DeviceProgress for Started {
            fn started_call(&self) -> u64 {
                self.0.load(Ordering::Relaxed)
            }
        }
        let l = Ledger::default();
        let gpu = Arc::new(Started(AtomicU64::new(0)));
        l.watch_device(gpu.clone());
        for _ in 0..2 {
            l.begin(CallSignature { device: true, ..CallSignature::host(CallKind::AllGather, 64, None) });
        }
        assert_eq!(l.entry().device_started, 0);
        gpu.0.store(1, Ordering::Relaxed);
        assert_eq!(l.entry().device_started, 1);
        gpu.0.store(9, Ordering::Relaxed);
        assert_eq!(l.entry().device_started, 2, "a GPU cannot have started a call not begun");
        let e = l.entry();
        assert_eq!(LedgerEntry::decode(&e.encode()).unwrap(), e);
        assert!(LedgerEntry::decode(&LedgerEntry { device_started: 3, ..e }.encode()).is_err());
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
                    let seq = l.begin(sig);
                    l.finish(&sig, seq);
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
