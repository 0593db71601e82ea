//! The trigger FIFO: a ring of two-word triggers that producers (host threads now, GPU threads
//! later) push and one consumer, the proxy thread, pops. What a [`Trigger`] holds and how its
//! two words are laid out: [`crate::trigger`].
//!
//! # Memory layout of the ring
//!
//! The ring lives in a [`FifoStorage`]: `capacity` (a power of two) [`FifoSlot`]s of 16 bytes
//! (`#[repr(C, align(16))]`: word 0 at byte 0, word 1 at byte 8), a `head` counter (the next
//! sequence number producers reserve) and a `tail` counter (how many triggers the consumer has
//! popped), each a `u64`. Sequence number `s` lives in slot `s & (capacity - 1)`. Counters only
//! grow; slots are never cleared: a slot holds a valid trigger for sequence `s` when the commit
//! bit of its word 1 equals the *lap parity* `1 - ((s / capacity) & 1)`. Zeroed memory (commit
//! bit 0) is therefore never valid on lap 0, and the previous lap's trigger (opposite parity) is
//! never mistaken for the current one. [`TriggerFifo::new`] keeps all of it on the host heap;
//! a transport can supply pinned, device-mapped memory instead through
//! [`TriggerFifo::with_storage`], and [`TriggerFifo::device_handle`] gives kernels the
//! addresses ([`FifoDeviceHandle`]).
//!
//! # Protocol
//!
//! - **Push** (any number of producers): reserve sequence `s` by advancing `head` with a
//!   compare-and-swap, but only while `s - tail < capacity` (flow control; a full ring makes the
//!   producer wait, bounded by its [`WaitContext`]); write word 0, then word 1 with the commit
//!   bit, with release ordering. Reserving only when the slot is free means a push that times
//!   out reserved nothing, so it never leaves a hole that would stall the consumer. A device
//!   producer may reserve with a plain `fetch_add` on `head` and then wait for
//!   `s - tail < capacity`, as MSCCL++ does; the two ways mix on the same counters.
//! - **Poll / pop** (one consumer): load word 1 of the slot at `tail` with acquire ordering and
//!   compare its commit bit with the lap parity of `tail`; if valid, read word 0 and decode;
//!   after handling the trigger, [`pop`](TriggerFifo::pop) stores `tail + 1` with release
//!   ordering, which frees the slot for producers and tells
//!   [`wait_processed`](TriggerFifo::wait_processed) that the trigger's effects are done.
//!
//! The loom models (`cargo xtask loom`) run this protocol over every interleaving of two
//! producers and the consumer, and of a producer lapping a one-slot ring.

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use crate::error::{Error, Result};
use crate::spin::{WaitContext, spin_until};
use crate::sync::AtomicU64;
use crate::trigger::COMMIT_SHIFT;
pub use crate::trigger::{
    MAX_MEMORIES, MAX_SEMAPHORES, MAX_TRIGGER_OFFSET, MAX_TRIGGER_SIZE, MEMORY_ID_BITS, MemoryId, SEMAPHORE_ID_BITS,
    SemaphoreId, TRIGGER_OFFSET_BITS, TRIGGER_SIZE_BITS, TRIGGER_TYPE_BITS, Trigger, TriggerFields, TriggerType,
};

/// Ring size used when none is given.
pub const DEFAULT_FIFO_CAPACITY: u32 = 512;
/// Largest ring accepted (16 MiB of slots).
pub const MAX_FIFO_CAPACITY: u32 = 1 << 20;

// Loom's atomics are larger than the hardware's; its models use heap storage only.
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<FifoSlot>() == 16 && std::mem::align_of::<FifoSlot>() == 16);
const _: () = assert!(std::mem::size_of::<FifoDeviceHandle>() == 32);

/// One slot of the ring: word 0 at byte 0, word 1 (with the commit bit) at byte 8; 16-byte
/// aligned so a device can publish both words with one 16-byte store.
#[derive(Default)]
#[repr(C, align(16))]
pub struct FifoSlot {
    words: [AtomicU64; 2],
}

/// Memory for a [`TriggerFifo`]: the slots and the two counters.
///
/// # Safety
///
/// An implementation guarantees, for as long as the value lives (even if the value itself is
/// moved — the memory must be a separate allocation or mapping):
/// - [`slots`](Self::slots) points to [`capacity`](Self::capacity) consecutive [`FifoSlot`]s,
///   16-byte aligned, all zero when the storage is handed to [`TriggerFifo::with_storage`];
/// - [`head`](Self::head) and [`tail`](Self::tail) point to two distinct 8-byte-aligned `u64`
///   counters, zero at that point, overlapping neither each other nor the slots;
/// - the methods return the same pointers and capacity every time;
/// - anything else touching that memory (other processes, GPU kernels) does so only with atomic
///   accesses, following the protocol in the [module docs](self).
pub unsafe trait FifoStorage: Send + Sync {
    /// Number of slots.
    fn capacity(&self) -> u32;
    /// The first slot.
    fn slots(&self) -> NonNull<FifoSlot>;
    /// The head counter (next sequence number to reserve).
    fn head(&self) -> NonNull<AtomicU64>;
    /// The tail counter (triggers popped so far).
    fn tail(&self) -> NonNull<AtomicU64>;
    /// The address under which device code reaches the byte at `host` (one of the pointers
    /// above). The default is the host address itself (unified addressing, or no device).
    fn device_address(&self, host: *const u8) -> u64 {
        host as usize as u64
    }
}

/// A counter alone on its cache line, so producers bumping `head` do not slow the consumer
/// storing `tail`.
#[derive(Default)]
#[repr(C, align(64))]
struct PaddedCounter(AtomicU64);

/// Ring memory on the host heap.
struct HeapFifoStorage {
    slots: Box<[FifoSlot]>,
    head: Box<PaddedCounter>,
    tail: Box<PaddedCounter>,
}

// SAFETY: every pointer points into an allocation owned by this value (boxes do not move their
// contents when the box moves); slots and counters start zeroed (`Default` of atomics is 0);
// the boxes are separate allocations, so nothing overlaps; the pointers never change; the
// capacity is the slice length, which `TriggerFifo::with_storage` checks to be a power of two.
unsafe impl FifoStorage for HeapFifoStorage {
    fn capacity(&self) -> u32 {
        self.slots.len() as u32
    }
    fn slots(&self) -> NonNull<FifoSlot> {
        // Derived from the whole slice (not its first element), so it may reach every slot.
        NonNull::from(&*self.slots).cast::<FifoSlot>()
    }
    fn head(&self) -> NonNull<AtomicU64> {
        NonNull::from(&self.head.0)
    }
    fn tail(&self) -> NonNull<AtomicU64> {
        NonNull::from(&self.tail.0)
    }
}

/// The FIFO as device code sees it: plain data a kernel receives by value (`#[repr(C)]`,
/// 32 bytes; the C++ mirror must match field for field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct FifoDeviceHandle {
    /// Device address of slot 0 (`capacity` slots of 16 bytes follow).
    pub triggers: u64,
    /// Device address of the `u64` head counter.
    pub head: u64,
    /// Device address of the `u64` tail counter.
    pub tail: u64,
    /// Number of slots, a power of two.
    pub capacity: u32,
    /// Zero; keeps the size a multiple of 8 bytes.
    pub reserved: u32,
}

/// The trigger ring: many producers, one consumer. See the [module docs](self) for the layout
/// and the protocol.
pub struct TriggerFifo {
    // The pointers below point into `storage`, which is declared last so it drops last.
    slots: NonNull<FifoSlot>,
    head: NonNull<AtomicU64>,
    tail: NonNull<AtomicU64>,
    mask: u64,
    lap_shift: u32,
    storage: Box<dyn FifoStorage>,
}

// SAFETY: the raw pointers refer to memory owned by `storage` (which is Send + Sync) and every
// access through them is atomic, so sharing or sending the FIFO across threads is sound.
unsafe impl Send for TriggerFifo {}
// SAFETY: see Send: all shared access is through atomics.
unsafe impl Sync for TriggerFifo {}

impl fmt::Debug for TriggerFifo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TriggerFifo")
            .field("capacity", &self.capacity())
            .field("head", &self.head())
            .field("tail", &self.tail())
            .finish()
    }
}

fn check_capacity(capacity: u32) -> Result<()> {
    if capacity == 0 || !capacity.is_power_of_two() || capacity > MAX_FIFO_CAPACITY {
        return Err(Error::invalid(format!(
            "FIFO capacity {capacity} must be a power of two between 1 and {MAX_FIFO_CAPACITY}"
        )));
    }
    Ok(())
}

impl TriggerFifo {
    /// A FIFO of `capacity` slots (a power of two, at most [`MAX_FIFO_CAPACITY`]) on the host heap.
    pub fn new(capacity: u32) -> Result<Self> {
        check_capacity(capacity)?;
        let slots: Box<[FifoSlot]> = (0..capacity).map(|_| FifoSlot::default()).collect();
        Self::with_storage(Box::new(HeapFifoStorage { slots, head: Box::default(), tail: Box::default() }))
    }

    /// A FIFO over memory a transport provides (e.g. pinned, device-mapped host memory). Checks
    /// the capacity, the alignment, and that the counters and slots are zero.
    pub fn with_storage(storage: Box<dyn FifoStorage>) -> Result<Self> {
        let capacity = storage.capacity();
        check_capacity(capacity)?;
        let (slots, head, tail) = (storage.slots(), storage.head(), storage.tail());
        if !(slots.as_ptr() as usize).is_multiple_of(16)
            || !(head.as_ptr() as usize).is_multiple_of(8)
            || !(tail.as_ptr() as usize).is_multiple_of(8)
        {
            return Err(Error::invalid("FIFO storage is misaligned (slots need 16 bytes, counters 8)"));
        }
        let fifo = TriggerFifo {
            slots,
            head,
            tail,
            mask: u64::from(capacity) - 1,
            lap_shift: capacity.trailing_zeros(),
            storage,
        };
        let dirty = (0..u64::from(capacity)).any(|s| {
            let slot = fifo.slot(s);
            slot.words[0].load(Ordering::Relaxed) != 0 || slot.words[1].load(Ordering::Relaxed) != 0
        });
        if fifo.head() != 0 || fifo.tail() != 0 || dirty {
            return Err(Error::invalid("FIFO storage must start zeroed (slots, head and tail)"));
        }
        Ok(fifo)
    }

    /// Number of slots.
    pub fn capacity(&self) -> u32 {
        (self.mask + 1) as u32
    }

    /// Sequence numbers reserved so far (the next push gets this one).
    pub fn head(&self) -> u64 {
        // Relaxed: a statistic; it orders nothing.
        self.head_counter().load(Ordering::Relaxed)
    }

    /// Triggers popped so far; ticket `t` has been processed once this exceeds `t`.
    pub fn tail(&self) -> u64 {
        // Acquire: a caller that sees tail > t also sees what the consumer did for trigger t.
        self.tail_counter().load(Ordering::Acquire)
    }

    /// The addresses and size for device code.
    pub fn device_handle(&self) -> FifoDeviceHandle {
        FifoDeviceHandle {
            triggers: self.storage.device_address(self.slots.as_ptr().cast::<u8>()),
            head: self.storage.device_address(self.head.as_ptr().cast::<u8>()),
            tail: self.storage.device_address(self.tail.as_ptr().cast::<u8>()),
            capacity: self.capacity(),
            reserved: 0,
        }
    }

    fn head_counter(&self) -> &AtomicU64 {
        // SAFETY: `FifoStorage` guarantees a valid, aligned counter for as long as `storage`
        // lives, and `storage` lives as long as `self`. Only atomic access is made through it.
        unsafe { self.head.as_ref() }
    }

    fn tail_counter(&self) -> &AtomicU64 {
        // SAFETY: as for `head_counter`.
        unsafe { self.tail.as_ref() }
    }

    fn slot(&self, seq: u64) -> &FifoSlot {
        let index = (seq & self.mask) as usize;
        // SAFETY: index < capacity, and `FifoStorage` guarantees `capacity` valid slots from
        // `slots` for as long as `storage` (owned by self) lives. Slots hold only atomics.
        unsafe { &*self.slots.as_ptr().add(index) }
    }

    /// The commit bit a valid trigger with sequence number `seq` carries.
    fn commit_for(&self, seq: u64) -> u64 {
        ((seq >> self.lap_shift) & 1) ^ 1
    }

    /// Pushes `trigger` and returns its sequence number (the ticket for
    /// [`wait_processed`](Self::wait_processed)). Waits, bounded by `ctx`, while the ring is
    /// full. On error nothing was reserved or written.
    pub fn push(&self, trigger: Trigger, ctx: &WaitContext<'_>) -> Result<u64> {
        let capacity = self.mask + 1;
        let (head, tail) = (self.head_counter(), self.tail_counter());
        let mut seq = 0;
        spin_until(ctx, || {
            loop {
                // Relaxed: the reservation itself publishes nothing; the slot contents are
                // published by the release store of word 1 below.
                let h = head.load(Ordering::Relaxed);
                // Acquire: pairs with the consumer's release in `pop`, so its reads of the slot's
                // previous trigger happen before we overwrite the slot.
                let t = tail.load(Ordering::Acquire);
                if h.wrapping_sub(t) >= capacity {
                    return false; // full (or `h` is stale: retry with fresh loads)
                }
                if head.compare_exchange_weak(h, h + 1, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                    seq = h;
                    return true;
                }
            }
        })?;
        let slot = self.slot(seq);
        let [w0, w1] = trigger.words();
        // Relaxed: published by the release store of word 1.
        slot.words[0].store(w0, Ordering::Relaxed);
        // Release: word 0, and everything this thread wrote before pushing (e.g. the source
        // buffer), is visible to the consumer once its acquire load sees the commit bit.
        slot.words[1].store(w1 | (self.commit_for(seq) << COMMIT_SHIFT), Ordering::Release);
        Ok(seq)
    }

    /// The trigger at the tail, if it has been committed; never blocks. Consumer side: only one
    /// thread (the proxy) may poll and pop a FIFO.
    pub fn poll(&self) -> Option<Trigger> {
        // Relaxed: only the consumer stores tail.
        let seq = self.tail_counter().load(Ordering::Relaxed);
        let slot = self.slot(seq);
        // Acquire: pairs with the producer's release store of word 1 (see `push`).
        let w1 = slot.words[1].load(Ordering::Acquire);
        if w1 >> COMMIT_SHIFT != self.commit_for(seq) {
            return None;
        }
        // Relaxed: ordered after the acquire load above.
        let w0 = slot.words[0].load(Ordering::Relaxed);
        Some(Trigger::from_words([w0, w1]))
    }

    /// Frees the slot at the tail after its trigger was handled; false (and no change) when the
    /// tail slot holds no committed trigger. Consumer side only.
    pub fn pop(&self) -> bool {
        let tail = self.tail_counter();
        // Relaxed: only the consumer stores tail.
        let seq = tail.load(Ordering::Relaxed);
        // Relaxed: only the commit bit is needed; the data was read (acquire) in `poll`.
        let w1 = self.slot(seq).words[1].load(Ordering::Relaxed);
        if w1 >> COMMIT_SHIFT != self.commit_for(seq) {
            return false;
        }
        // Release: the handling of this trigger (and our reads of its slot) happen before a
        // producer reuses the slot or a waiter in `wait_processed` returns.
        tail.store(seq + 1, Ordering::Release);
        true
    }

    /// Waits, bounded by `ctx`, until the trigger with sequence number `ticket` was popped, i.e.
    /// the consumer finished handling it.
    pub fn wait_processed(&self, ticket: u64, ctx: &WaitContext<'_>) -> Result<()> {
        let tail = self.tail_counter();
        // Acquire: pairs with the release in `pop`: what the consumer did is visible to us.
        spin_until(ctx, || tail.load(Ordering::Acquire) > ticket)
    }
}
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::trigger::COMMIT_BIT;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    fn ok() -> Result<()> {
        Ok(())
    }

    fn ctx(abort: &AtomicBool, timeout: Duration) -> WaitContext<'_> {
        WaitContext { operation: "fifo test", peer: None, timeout, abort, check_peer: &ok }
    }

    fn fields(size: u64, src_offset: u64, dst_offset: u64, src: u32, dst: u32, sem: u32) -> TriggerFields {
        TriggerFields::new(TriggerType::DATA, size, (src, src_offset), (dst, dst_offset), sem)
    }

    #[test]
    fn capacity_is_checked() {
        for c in [0, 3, 6, MAX_FIFO_CAPACITY * 2] {
            assert!(matches!(TriggerFifo::new(c), Err(Error::InvalidArgument(_))), "capacity {c}");
        }
        for c in [1, 2, 4, DEFAULT_FIFO_CAPACITY] {
            assert_eq!(TriggerFifo::new(c).unwrap().capacity(), c);
        }
    }

    #[test]
    fn zeroed_slots_are_not_valid_and_parity_alternates_over_laps() {
        let abort = AtomicBool::new(false);
        let c = ctx(&abort, Duration::from_secs(2));
        let fifo = TriggerFifo::new(2).unwrap();
        assert!(fifo.poll().is_none(), "a zeroed slot must not read as a trigger");
        assert!(!fifo.pop(), "nothing to pop");
        for seq in 0..10u64 {
            let t = Trigger::new(fields(seq, seq + 1, seq + 2, 1, 2, 3)).unwrap();
            assert_eq!(fifo.push(t, &c).unwrap(), seq);
            let lap = seq / 2;
            let w1 = fifo.slot(seq).words[1].load(Ordering::Relaxed);
            assert_eq!(w1 >> 63, 1 - (lap & 1), "commit bit of seq {seq}");
            assert_eq!(fifo.poll(), Some(t));
            assert_eq!(fifo.poll(), Some(t), "poll does not consume");
            assert!(fifo.pop());
            // The other slot still holds the previous lap's trigger: not valid for the next seq
            // unless it was written in this lap.
            assert!(fifo.poll().is_none(), "stale slot read as valid after seq {seq}");
            assert!(!fifo.pop());
            assert_eq!(fifo.tail(), seq + 1);
        }
        assert_eq!(fifo.head(), 10);
    }

    #[test]
    fn device_handle_describes_the_ring() {
        let fifo = TriggerFifo::new(8).unwrap();
        let h = fifo.device_handle();
        assert_eq!(h.capacity, 8);
        assert_eq!(h.triggers % 16, 0);
        assert_eq!(h.head, fifo.head.as_ptr() as u64);
        assert_eq!(h.tail, fifo.tail.as_ptr() as u64);
        assert_ne!(h.head, h.tail);
    }

    #[test]
    fn many_producers_one_consumer_each_trigger_once() {
        const THREADS: u32 = 4;
        const PER_THREAD: u64 = 10_000;
        let fifo = TriggerFifo::new(64).unwrap();
        let abort = AtomicBool::new(false);
        let mut seen = HashSet::new();
        std::thread::scope(|s| {
            for thread in 0..THREADS {
                let (fifo, abort) = (&fifo, &abort);
                s.spawn(move || {
                    let c = ctx(abort, Duration::from_secs(10));
                    for i in 0..PER_THREAD {
                        let t = Trigger::new(fields(i, 0, 0, thread, 0, 0)).unwrap();
                        fifo.push(t, &c).unwrap();
                    }
                });
            }
            let mut last = [None::<u64>; THREADS as usize];
            let deadline = Instant::now() + Duration::from_secs(20);
            while seen.len() < (THREADS as u64 * PER_THREAD) as usize {
                assert!(Instant::now() < deadline, "consumer starved at {} triggers", seen.len());
                let Some(t) = fifo.poll() else {
                    std::hint::spin_loop();
                    continue;
                };
                let (thread, i) = (t.src_memory().0, t.size());
                assert!(seen.insert((thread, i)), "trigger ({thread}, {i}) received twice");
                let prev = last[thread as usize].replace(i);
                assert!(prev.is_none_or(|p| p < i), "thread {thread}: {i} after {prev:?}");
                assert!(fifo.pop());
            }
        });
        assert_eq!(fifo.head(), THREADS as u64 * PER_THREAD);
        assert_eq!(fifo.tail(), fifo.head());
        assert!(fifo.poll().is_none());
    }

    #[test]
    fn slow_consumer_throttles_producers() {
        const N: u64 = 40;
        let fifo = TriggerFifo::new(4).unwrap();
        let abort = AtomicBool::new(false);
        let start = Instant::now();
        std::thread::scope(|s| {
            let (f, a) = (&fifo, &abort);
            s.spawn(move || {
                let c = ctx(a, Duration::from_secs(5));
                for i in 0..N {
                    let ticket = f.push(Trigger::new(fields(i, 0, 0, 0, 0, 0)).unwrap(), &c).unwrap();
                    assert_eq!(ticket, i);
                    assert!(ticket < f.tail() + 4, "ticket {ticket} pushed with tail {}", f.tail());
                }
            });
            let mut got = 0;
            while got < N {
                assert!(fifo.head() - fifo.tail() <= 4);
                if let Some(t) = fifo.poll() {
                    assert_eq!(t.size(), got);
                    std::thread::sleep(Duration::from_millis(1));
                    assert!(fifo.pop());
                    got += 1;
                }
            }
        });
        // 36 pushes had to wait for a pop that comes after a 1 ms sleep each.
        assert!(start.elapsed() >= Duration::from_millis(30), "{:?}", start.elapsed());
    }

    #[test]
    fn full_ring_times_out_without_reserving() {
        let abort = AtomicBool::new(false);
        let fifo = TriggerFifo::new(4).unwrap();
        let c = ctx(&abort, Duration::from_secs(2));
        let t = Trigger::new(fields(7, 0, 0, 0, 0, 0)).unwrap();
        for _ in 0..4 {
            fifo.push(t, &c).unwrap();
        }
        let short = ctx(&abort, Duration::from_millis(30));
        assert!(matches!(fifo.push(t, &short), Err(Error::Timeout { .. })));
        assert_eq!(fifo.head(), 4, "a failed push reserves nothing");
        assert!(matches!(fifo.wait_processed(0, &short), Err(Error::Timeout { .. })));
        abort.store(true, Ordering::Relaxed);
        assert!(matches!(fifo.push(t, &c), Err(Error::Aborted(_))));
        abort.store(false, Ordering::Relaxed);
        assert!(fifo.poll().is_some() && fifo.pop());
        fifo.wait_processed(0, &short).unwrap();
        assert_eq!(fifo.push(t, &c).unwrap(), 4);
    }

    #[test]
    fn dirty_storage_is_refused() {
        let storage = HeapFifoStorage {
            slots: (0..4).map(|_| FifoSlot::default()).collect(),
            head: Box::default(),
            tail: Box::default(),
        };
        storage.slots[2].words[1].store(COMMIT_BIT, Ordering::Relaxed);
        assert!(matches!(TriggerFifo::with_storage(Box::new(storage)), Err(Error::InvalidArgument(_))));
        let storage = HeapFifoStorage {
            slots: (0..4).map(|_| FifoSlot::default()).collect(),
            head: Box::default(),
            tail: Box::default(),
        };
        storage.head.0.store(1, Ordering::Relaxed);
        assert!(TriggerFifo::with_storage(Box::new(storage)).is_err());
    }
}
