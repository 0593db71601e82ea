//! Writes whose source is device memory that the device cannot read directly: copied chunk
//! by chunk through the connection's staging ring in pinned host memory (made at the first such
//! write) and written from there, each chunk a signaled RDMA write so that the ring learns when
//! its slot is free.

use comm_core::connection::CheckedWrite;
use comm_core::{Error, Result};

use super::{IbConnection, RemoteKey, State};
use crate::device_sources::PinnedBuffer;
use crate::staging::{ChunkSink, CopyEngine, StagingRing};
use crate::verbs::{Operation, Registration, WorkRequest};

/// Slots of a connection's staging ring, and bytes of each: four writes of 1 MiB in flight
/// while the next chunk is copied.
const STAGING_SLOTS: usize = 4;
const STAGING_SLOT_BYTES: usize = 1 << 20;

/// A connection's staging ring in pinned host memory registered with the device.
pub(super) struct Staging {
    ring: StagingRing,
    /// Declared before the memory: deregistered first.
    registration: Registration,
    _memory: Box<dyn PinnedBuffer>,
}

impl IbConnection {
    /// `write`, whose source is device memory, copied chunk by chunk through this connection's
    /// staging ring (made the first time) and written from there.
    pub(super) fn write_staged(
        &self,
        state: &mut State,
        write: &CheckedWrite<'_>,
        remote: RemoteKey,
        engine: &dyn CopyEngine,
        ordinal: u32,
    ) -> Result<()> {
        let mut staging = match state.staging.take() {
            Some(s) => s,
            None => {
                let len = STAGING_SLOTS * STAGING_SLOT_BYTES;
                let memory = self.sources.device.pinned(ordinal, len)?;
                if memory.len() < len {
                    return Err(Error::transport(
                        crate::NAME,
                        format!("ib staging: asked for {len} bytes of pinned memory, got {}", memory.len()),
                    ));
                }
                // SAFETY: the staging value drops the registration before the memory.
                let registration = unsafe { Registration::new(&self.pd, memory.as_ptr(), len)? };
                // SAFETY: the ring's memory is the pinned buffer kept beside it, registered above.
                let ring = unsafe { StagingRing::new(memory.as_ptr(), STAGING_SLOT_BYTES, STAGING_SLOTS) };
                Staging { ring, registration, _memory: memory }
            }
        };
        let lkey = staging.registration.lkey();
        let dst = remote.addr + write.dst_offset as u64;
        let mut sink = StagedSink { connection: self, state, lkey, dst, rkey: remote.rkey };
        let src = write.src.as_ptr() as u64 + write.src_offset as u64;
        // SAFETY: the source range lies inside the device region `write.src` (checked), on the
        // device whose engine this is.
        let result = unsafe { staging.ring.write(engine, src, write.len, 0, &mut sink) };
        state.staging = Some(staging);
        result
    }
}

/// Posts a staging ring's chunks on a connection: each write asks for a completion, so the
/// ring learns when its slot is free.
struct StagedSink<'a> {
    connection: &'a IbConnection,
    state: &'a mut State,
    lkey: u32,
    dst: u64,
    rkey: u32,
}

impl ChunkSink for StagedSink<'_> {
    unsafe fn post(&mut self, local: *const u8, len: usize, dst_offset: usize) -> Result<u64> {
        let mut write = [WorkRequest {
            wr_id: 0,
            op: Operation::Write,
            local,
            len: len as u32,
            lkey: self.lkey,
            remote: self.dst + dst_offset as u64,
            rkey: self.rkey,
            signaled: true,
        }];
        // SAFETY: the slot stays untouched until the write retires (the ring's contract), and
        // the remote range lies inside the peer's registration (the write was checked).
        unsafe { self.connection.post(self.state, &mut write, None, true, "ib staged write")? };
        Ok(self.state.posted)
    }

    fn retire(&mut self, seq: u64) -> Result<()> {
        // Requests complete in order, so `seq` has retired once no more than the ones posted
        // after it are outstanding.
        let after = self.state.posted.saturating_sub(seq);
        self.connection.reap(self.state, "ib staged write", |outstanding| u64::from(outstanding) <= after)
    }
}
