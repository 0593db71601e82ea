//! Staging: device memory written to a peer without the NIC reading it. Each chunk is copied
//! into a slot of a ring of pinned host memory registered with the NIC, then written from
//! there; a slot is filled again only once the write that reads it has retired, and the copy of
//! one chunk overlaps the NIC's write of the one before.
//!
//! The copy is a [`CopyEngine`] (CUDA's, under the feature `cuda`) and the writes go to a
//! [`ChunkSink`] (the connection), so the pipeline itself is tested against host memory.

use comm_core::Result;

/// Copies device memory into host memory.
pub(crate) trait CopyEngine: Send + Sync {
    /// Copies `len` bytes at device address `src` to `dst`; the bytes are there when it returns.
    ///
    /// # Safety
    /// `dst` is valid for writes of `len` bytes; `[src, src + len)` is device memory this engine
    /// may read.
    unsafe fn device_to_host(&self, dst: *mut u8, src: u64, len: usize) -> Result<()>;
}

/// Where staged chunks are written from: the connection's send queue.
pub(crate) trait ChunkSink {
    /// Posts the write of `len` bytes at `local` (a slot of the ring) to offset `dst_offset` of
    /// the destination; returns the write's number (increasing from one post to the next).
    ///
    /// # Safety
    /// `local` is valid for `len` bytes until [`retire`](Self::retire) of the returned number
    /// returns.
    unsafe fn post(&mut self, local: *const u8, len: usize, dst_offset: usize) -> Result<u64>;

    /// Returns once the write numbered `seq`, and every one before it, no longer reads its slot.
    fn retire(&mut self, seq: u64) -> Result<()>;
}

/// A ring of equal slots of host memory registered with the NIC, and the write (if any) still
/// reading each one.
pub(crate) struct StagingRing {
    base: *mut u8,
    slot_bytes: usize,
    /// The number of the write that reads each slot, until it is known retired.
    reading: Vec<Option<u64>>,
    next: usize,
}

// SAFETY: the ring only hands out addresses inside memory its owner keeps alive; the slots'
// use is serialized by the owner (a connection's send lock).
unsafe impl Send for StagingRing {}

impl StagingRing {
    /// A ring of `slots` slots of `slot_bytes` each at `base`.
    ///
    /// # Safety
    /// `base` is valid for `slots * slot_bytes` bytes of reads and writes for as long as the
    /// ring is used, and the NIC may read it under the key the sink posts with.
    pub(crate) unsafe fn new(base: *mut u8, slot_bytes: usize, slots: usize) -> Self {
        StagingRing { base, slot_bytes: slot_bytes.max(1), reading: vec![None; slots.max(1)], next: 0 }
    }

    /// Writes `len` bytes at device address `src` to `dst_offset` onwards: each chunk copied by
    /// `engine` into the next slot (after the write that read that slot retired), then posted to
    /// `sink`. Returns once every chunk is posted; the last ones may still be in flight.
    ///
    /// # Safety
    /// `[src, src + len)` is device memory `engine` may read.
    pub(crate) unsafe fn write(
        &mut self,
        engine: &dyn CopyEngine,
        src: u64,
        len: usize,
        dst_offset: usize,
        sink: &mut dyn ChunkSink,
    ) -> Result<()> {
        let mut done = 0;
        while done < len {
            let k = (len - done).min(self.slot_bytes);
            let slot = self.next;
            self.next = (self.next + 1) % self.reading.len();
            if let Some(seq) = self.reading[slot].take() {
                sink.retire(seq)?;
            }
            // SAFETY: slot < slots, so the slot lies inside the ring's memory (`new`).
            let at = unsafe { self.base.add(slot * self.slot_bytes) };
            // SAFETY: `at` is valid for `k <= slot_bytes` bytes and no write reads the slot
            // (retired above); the source range lies inside the caller's.
            unsafe { engine.device_to_host(at, src + done as u64, k)? };
            // SAFETY: the slot stays untouched until this write is retired (`reading`).
            self.reading[slot] = Some(unsafe { sink.post(at, k, dst_offset + done)? });
            done += k;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm_core::Error;
    use std::collections::VecDeque;

    /// "Device" memory that is host memory: the address is a host pointer.
    struct HostCopy;

    impl CopyEngine for HostCopy {
        unsafe fn device_to_host(&self, dst: *mut u8, src: u64, len: usize) -> Result<()> {
            // SAFETY: the tests pass host pointers as device addresses, valid for `len`.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, len) };
            Ok(())
        }
    }

    /// A NIC that reads a slot only when its write retires (as late as a real one may): a slot
    /// filled again too early would land the newer bytes at the older write's place.
    #[derive(Default)]
    struct LazyNic {
        pending: VecDeque<(u64, *const u8, usize, usize)>,
        dst: Vec<u8>,
        posted: u64,
        most_in_flight: usize,
    }

    impl ChunkSink for LazyNic {
        unsafe fn post(&mut self, local: *const u8, len: usize, dst_offset: usize) -> Result<u64> {
            self.posted += 1;
            self.pending.push_back((self.posted, local, len, dst_offset));
            self.most_in_flight = self.most_in_flight.max(self.pending.len());
            Ok(self.posted)
        }

        fn retire(&mut self, seq: u64) -> Result<()> {
            while self.pending.front().is_some_and(|p| p.0 <= seq) {
                let (_, local, len, at) = self.pending.pop_front().unwrap();
                // SAFETY: the ring keeps the slot untouched until this retire (what is tested).
                let bytes = unsafe { std::slice::from_raw_parts(local, len) };
                self.dst[at..at + len].copy_from_slice(bytes);
            }
            Ok(())
        }
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn chunks_arrive_whole_and_a_slot_waits_for_its_write() {
        let mut memory = vec![0u8; 4 * 1000];
        // SAFETY: `memory` outlives the ring.
        let mut ring = unsafe { StagingRing::new(memory.as_mut_ptr(), 1000, 4) };
        let src = pattern(10_500);
        let mut nic = LazyNic { dst: vec![0; 10_600], ..LazyNic::default() };
        // SAFETY: host memory stands for device memory (HostCopy).
        unsafe { ring.write(&HostCopy, src.as_ptr() as u64, src.len(), 100, &mut nic).unwrap() };
        assert_eq!(nic.posted, 11, "10,500 bytes in chunks of 1,000");
        assert_eq!(nic.most_in_flight, 4, "the ring's four slots in flight, never more");
        nic.retire(u64::MAX).unwrap();
        assert_eq!(&nic.dst[..100], &[0; 100][..]);
        assert_eq!(&nic.dst[100..], &src[..], "every chunk at its place, none overwritten early");
    }

    #[test]
    fn a_second_write_reuses_the_ring_after_the_first_retires() {
        let mut memory = vec![0u8; 2 * 64];
        // SAFETY: `memory` outlives the ring.
        let mut ring = unsafe { StagingRing::new(memory.as_mut_ptr(), 64, 2) };
        let (a, b) = (pattern(100), vec![0xab; 150]);
        let mut nic = LazyNic { dst: vec![0; 250], ..LazyNic::default() };
        // SAFETY: as above.
        unsafe {
            ring.write(&HostCopy, a.as_ptr() as u64, a.len(), 0, &mut nic).unwrap();
            ring.write(&HostCopy, b.as_ptr() as u64, b.len(), 100, &mut nic).unwrap();
        }
        nic.retire(u64::MAX).unwrap();
        assert_eq!(&nic.dst[..100], &a[..]);
        assert_eq!(&nic.dst[100..], &b[..]);
        assert_eq!(nic.most_in_flight, 2);
    }

    #[test]
    fn a_failed_copy_posts_nothing_more() {
        struct Broken;
        impl CopyEngine for Broken {
            unsafe fn device_to_host(&self, _: *mut u8, src: u64, _: usize) -> Result<()> {
                Err(Error::Cuda { operation: "cuMemcpyDtoH".into(), message: format!("bad address {src:#x}") })
            }
        }
        let mut memory = vec![0u8; 64];
        // SAFETY: `memory` outlives the ring.
        let mut ring = unsafe { StagingRing::new(memory.as_mut_ptr(), 32, 2) };
        let mut nic = LazyNic { dst: vec![0; 64], ..LazyNic::default() };
        // SAFETY: the engine reads nothing.
        let e = unsafe { ring.write(&Broken, 0x1000, 64, 0, &mut nic) }.unwrap_err();
        assert!(matches!(&e, Error::Cuda { message, .. } if message.contains("0x1000")), "{e}");
        assert_eq!(nic.posted, 0);
    }
}
