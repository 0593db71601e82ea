//! The copy-engine connection: device-to-device copies into a peer's mapped memory on a stream
//! of this connection's own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use comm_core::connection::{CheckedWrite, Connection, spin_until_peer};
use comm_core::error::{Error, Result};
use comm_core::memory::RegisteredMemory;
use comm_core::transport::Transport;
use cudarc::driver::CudaContext;
use cudarc::driver::sys::CUstream;
use weave_cuda::{DeviceRegion, bind};

use crate::cu;
use comm_core::peer_watch::PeerWatch;

/// A connection to one peer GPU over CUDA IPC: [`write`](Connection::write) is an asynchronous
/// `cuMemcpyDtoDAsync` on the connection's own non-blocking stream,
/// [`update_and_sync`](Connection::update_and_sync) a `cuStreamWriteValue64` on the same stream
/// (so it lands after every earlier write), [`flush`](Connection::flush) a bounded wait for the
/// stream. Both memories of a write must be device memory mapped into this connection's GPU by
/// transport cudaipc.
pub struct CudaIpcConnection {
    ctx: Arc<CudaContext>,
    device: u32,
    stream: CUstream,
    peer: usize,
    watch: PeerWatch,
    timeout: Duration,
    abort: Arc<AtomicBool>,
    memops: bool,
}

// SAFETY: a CUstream handle may be used from any thread (the driver synchronizes access to
// it); this type only destroys it in Drop, when no other reference exists.
unsafe impl Send for CudaIpcConnection {}
// SAFETY: see Send; every method binds the context and issues independent driver calls.
unsafe impl Sync for CudaIpcConnection {}

impl std::fmt::Debug for CudaIpcConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaIpcConnection")
            .field("peer", &self.peer)
            .field("device", &self.device)
            .field("stream_memops", &self.memops)
            .finish_non_exhaustive()
    }
}

impl CudaIpcConnection {
    /// A connection to `peer` (watched through `watch`) from device `device` of `ctx`.
    pub(crate) fn new(
        ctx: Arc<CudaContext>,
        device: u32,
        peer: usize,
        watch: PeerWatch,
        timeout: Duration,
        abort: Arc<AtomicBool>,
    ) -> Result<Self> {
        bind(&ctx)?;
        // Stream memory operations are always available from CUDA 12 on; the attribute still
        // tells when a device (or a virtualized one) lacks them, and then a synchronous copy
        // stands in.
        let memops = weave_cuda::driver::attribute(
            ctx.cu_device(),
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
        )
        .map_or(true, |v| v != 0);
        let stream = cu::stream_create_non_blocking()?;
        Ok(CudaIpcConnection { ctx, device, stream, peer, watch, timeout, abort, memops })
    }

    /// The connection's stream (raw driver handle, owned by the connection): work a caller
    /// enqueues on it is ordered with the connection's copies. Do not destroy it.
    pub fn cu_stream(&self) -> CUstream {
        self.stream
    }

    /// The device ordinal whose copy engines this connection uses.
    pub fn device_ordinal(&self) -> u32 {
        self.device
    }

    /// The device address of `m` plus `offset`, after checking that `m` is device memory mapped
    /// for this connection's device.
    fn device_addr(&self, m: &RegisteredMemory, offset: usize, what: &str) -> Result<u64> {
        let Some(region) = DeviceRegion::of(m) else {
            return Err(Error::invalid(format!(
                "cudaipc connection to rank {}: {what} {:?} (rank {}, {:?}) is not device memory mapped by transport \
                 cudaipc",
                self.peer,
                m.label(),
                m.owner(),
                m.kind()
            )));
        };
        if region.mapped_device() != self.device {
            return Err(Error::invalid(format!(
                "cudaipc connection to rank {}: {what} {:?} is mapped for device {}, this connection copies on device {}",
                self.peer,
                m.label(),
                region.mapped_device(),
                self.device
            )));
        }
        // offset <= len was checked by the caller; the region is at most 2^48 bytes.
        Ok(region.device_ptr() + offset as u64)
    }
}

impl Connection for CudaIpcConnection {
    fn transport(&self) -> Transport {
        crate::transport()
    }

    fn peer(&self) -> usize {
        self.peer
    }

    fn write_checked(&self, write: CheckedWrite<'_>) -> Result<()> {
        let d = self.device_addr(write.dst, write.dst_offset, "destination")?;
        let s = self.device_addr(write.src, write.src_offset, "source")?;
        if write.len == 0 {
            return Ok(());
        }
        bind(&self.ctx)?;
        cu::memcpy_dtod_async(d, s, write.len, self.stream)
    }

    fn update_and_sync(&self, dst: &RegisteredMemory, dst_offset: usize, value: u64) -> Result<()> {
        dst.check_range(dst_offset, 8)?;
        if DeviceRegion::of(dst).is_some() {
            let addr = self.device_addr(dst, dst_offset, "flag")?;
            if addr % 8 != 0 {
                return Err(Error::invalid(format!(
                    "offset {dst_offset} in {:?} is not 8-byte aligned (address {addr:#x})",
                    dst.label()
                )));
            }
            bind(&self.ctx)?;
            if self.memops {
                return cu::stream_write_value64(self.stream, addr, value);
            }
            // No stream memory operations: wait for the earlier copies, then store.
            self.flush()?;
            return cu::memcpy_htod(addr, &value.to_le_bytes());
        }
        if dst.is_host_mapped() {
            // Host memory (a shared-memory token): order the store after this connection's
            // copies by waiting for them first.
            let word = dst.atomic_u64(dst_offset)?;
            self.flush()?;
            word.store(value, Ordering::Release);
            return Ok(());
        }
        Err(Error::invalid(format!(
            "cudaipc connection to rank {}: flag memory {:?} is neither device memory mapped here nor host memory",
            self.peer,
            dst.label()
        )))
    }

    fn flush(&self) -> Result<()> {
        bind(&self.ctx)?;
        let operation = format!("cudaipc copies to rank {} (stream flush)", self.peer);
        let mut failure = None;
        spin_until_peer(self, &operation, self.timeout, &self.abort, || match cu::stream_query(self.stream) {
            Ok(done) => done,
            Err(e) => {
                failure = Some(e);
                true
            }
        })?;
        match failure {
            Some(e) => Err(e),
            // Complete here; a peer that is gone will never read it.
            None => self.check_peer(),
        }
    }

    fn check_peer(&self) -> Result<()> {
        self.watch.check()
    }
}

impl Drop for CudaIpcConnection {
    fn drop(&mut self) {
        // Pending copies still complete: the driver releases the stream once they are done.
        let _ = bind(&self.ctx);
        let _ = cu::stream_destroy(self.stream);
    }
}
