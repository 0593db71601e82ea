//! A trigger FIFO in pinned, device-mapped host memory: kernels push triggers into it and the
//! proxy thread pops them without any copy.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use comm_core::error::{Error, Result};
use comm_core::fifo::{FifoSlot, FifoStorage};
use cudarc::driver::CudaContext;

use crate::host_memory::PinnedHostMemory;

/// Bytes between the slots and each counter: the head and the tail sit on cache lines of their
/// own, so producers bumping one do not slow the consumer storing the other.
const COUNTER_STRIDE: usize = 64;

/// [`FifoStorage`] over one block of [`PinnedHostMemory`]: `capacity` slots of 16 bytes, then
/// the head counter, then the tail counter, each on its own cache line.
#[derive(Debug)]
pub struct PinnedFifoStorage {
    memory: PinnedHostMemory,
    capacity: u32,
}

impl PinnedFifoStorage {
    /// Zeroed storage for `capacity` triggers (a power of two, as
    /// [`TriggerFifo::with_storage`](comm_core::fifo::TriggerFifo::with_storage) checks) for
    /// kernels of `ctx`'s device.
    pub fn new(ctx: &Arc<CudaContext>, capacity: u32) -> Result<Self> {
        if capacity == 0 || !capacity.is_power_of_two() {
            return Err(Error::invalid(format!("FIFO capacity {capacity} is not a power of two")));
        }
        let slots = capacity as usize * std::mem::size_of::<FifoSlot>();
        let memory = PinnedHostMemory::new(ctx, slots.next_multiple_of(COUNTER_STRIDE) + 2 * COUNTER_STRIDE)?;
        Ok(PinnedFifoStorage { memory, capacity })
    }

    fn counter(&self, index: usize) -> NonNull<AtomicU64> {
        let slots = self.capacity as usize * std::mem::size_of::<FifoSlot>();
        let offset = slots.next_multiple_of(COUNTER_STRIDE) + index * COUNTER_STRIDE;
        // SAFETY: offset + 8 <= len by the size computed in `new`; the block is page-aligned, so
        // the counter is 8-byte aligned.
        let p = unsafe { self.memory.host_ptr().add(offset) };
        NonNull::new(p.cast::<AtomicU64>()).unwrap_or(NonNull::dangling())
    }
}

// SAFETY: the slots (16-byte aligned: the block is page-aligned) and the two counters lie in one
// allocation owned by this value, zeroed at creation and never overlapping; the pointers never
// change (the allocation does not move with the value); kernels touch the words only
// atomically, following the FIFO protocol.
unsafe impl FifoStorage for PinnedFifoStorage {
    fn capacity(&self) -> u32 {
        self.capacity
    }
    fn slots(&self) -> NonNull<FifoSlot> {
        NonNull::new(self.memory.host_ptr().cast::<FifoSlot>()).unwrap_or(NonNull::dangling())
    }
    fn head(&self) -> NonNull<AtomicU64> {
        self.counter(0)
    }
    fn tail(&self) -> NonNull<AtomicU64> {
        self.counter(1)
    }
    fn device_address(&self, host: *const u8) -> u64 {
        self.memory.device_ptr() + (host as u64 - self.memory.host_ptr() as u64)
    }
}
