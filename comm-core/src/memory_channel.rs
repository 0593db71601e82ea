//! Memory channels: direct load/store into a peer's memory that is mapped into this process,
//! paired with a semaphore.
//!
//! On the host a memory channel copies with the calling thread; the GPU path gives kernels a
//! `#[repr(C)]` handle with the same meaning.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::memory::RegisteredMemory;
use crate::semaphore::HostSemaphore;

/// A channel from this rank to one peer: `put` writes into the peer's `remote` memory from this
/// rank's `local` memory, `get` reads the other way, `signal`/`wait` synchronize.
#[derive(Debug, Clone)]
pub struct MemoryChannel {
    semaphore: Arc<HostSemaphore>,
    remote: RegisteredMemory,
    local: RegisteredMemory,
}

impl MemoryChannel {
    /// A channel over `semaphore` (whose connection must have direct access) from `local` to
    /// `remote`. Both memories must be host memory mapped into this process.
    pub fn new(semaphore: Arc<HostSemaphore>, local: RegisteredMemory, remote: RegisteredMemory) -> Result<Self> {
        for (m, what) in [(&local, "local"), (&remote, "remote")] {
            if !m.is_host_mapped() {
                return Err(Error::invalid(format!(
                    "memory channel needs {what} memory {:?} mapped into this process (it is {:?})",
                    m.label(),
                    m.kind()
                )));
            }
        }
        if !local.is_local() {
            return Err(Error::invalid(format!(
                "memory channel local side {:?} belongs to another rank",
                local.label()
            )));
        }
        if remote.owner() != semaphore.peer() {
            return Err(Error::invalid(format!(
                "memory channel to rank {} given memory {:?} owned by rank {}",
                semaphore.peer(),
                remote.label(),
                remote.owner()
            )));
        }
        Ok(MemoryChannel { semaphore, remote, local })
    }

    /// The peer rank.
    pub fn peer(&self) -> usize {
        self.semaphore.peer()
    }

    /// The peer's memory this channel writes into.
    pub fn remote(&self) -> &RegisteredMemory {
        &self.remote
    }

    /// This rank's memory this channel reads from.
    pub fn local(&self) -> &RegisteredMemory {
        &self.local
    }

    /// The channel's semaphore.
    pub fn semaphore(&self) -> &Arc<HostSemaphore> {
        &self.semaphore
    }

    /// Copies `len` bytes from `local[src_offset..]` to `remote[dst_offset..]`.
    pub fn put(&self, dst_offset: usize, src_offset: usize, len: usize) -> Result<()> {
        self.semaphore.connection().write(&self.remote, dst_offset, &self.local, src_offset, len)
    }

    /// Copies `len` bytes from `remote[src_offset..]` to `local[dst_offset..]`.
    pub fn get(&self, src_offset: usize, dst_offset: usize, len: usize) -> Result<()> {
        self.remote.check_range(src_offset, len)?;
        self.local.check_range(dst_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: both ranges were checked against their registrations, which are host memory
        // mapped into this process (checked in `new`) and stay mapped while `self` lives.
        // `ptr::copy` tolerates overlap.
        unsafe { std::ptr::copy(self.remote.as_ptr().add(src_offset), self.local.as_ptr().add(dst_offset), len) };
        Ok(())
    }

    /// `put` followed by `signal`: the peer's `wait` returns only after the data landed.
    pub fn put_with_signal(&self, dst_offset: usize, src_offset: usize, len: usize) -> Result<()> {
        self.put(dst_offset, src_offset, len)?;
        self.signal()
    }

    /// Tells the peer that earlier puts are complete.
    pub fn signal(&self) -> Result<()> {
        self.semaphore.signal()
    }

    /// Waits (bounded) for the peer's next signal.
    pub fn wait(&self) -> Result<()> {
        self.semaphore.wait()
    }

    /// Consumes the peer's next signal if it has arrived.
    pub fn poll(&self) -> bool {
        self.semaphore.poll()
    }
}
