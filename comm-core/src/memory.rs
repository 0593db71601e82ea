//! Registered memory: regions a transport allocated or mapped, and bounds-checked access (their
//! serialized descriptor is `memory_descriptor.rs`).
//!
//! A rank registers memory with its communicator (which asks a transport to allocate it), then
//! exchanges the [`MemoryDescriptor`] with peers, who import it through the transport that
//! connects them. Every access through a [`RegisteredMemory`] checks its range.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::transport::Transport;
use nix::sys::mman::{MapFlags, ProtFlags, mmap_anonymous, munmap};

pub use crate::memory_descriptor::MemoryDescriptor;

/// Largest registration weave accepts (256 TiB): anything larger in a descriptor is garbage.
pub const MAX_REGISTRATION_LEN: usize = 1 << 48;

/// Where memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Host (CPU) memory.
    Host,
    /// Memory of the CUDA device with this ordinal (as the owning process numbers it).
    Device(u32),
}

/// A span of memory a transport allocated or mapped into this process.
///
/// Implementations free or unmap it on drop.
pub trait MemoryRegion: Send + Sync + Any {
    /// Address of the first byte in this process (host virtual address, or CUDA device address
    /// for device memory); null when the region is not mapped here (e.g. an RDMA-only import).
    /// It must not change while the region lives: registrations read it once.
    fn as_ptr(&self) -> *mut u8;

    /// Length in bytes.
    fn len(&self) -> usize;

    /// True when the region has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the bytes live.
    fn kind(&self) -> MemoryKind;

    /// Called on the owner once every peer that should import the region has done so: a
    /// transport that gave the region a name (a shared-memory segment) removes the name here, so
    /// nothing is left behind if the process dies later. Idempotent.
    fn seal(&self) -> Result<()> {
        Ok(())
    }

    /// Lets a transport reach its own region type (an rkey, a CUDA handle).
    fn as_any(&self) -> &dyn Any;
}

/// A region of host memory (kind [`MemoryKind::Host`]) with nothing to seal: implementing this
/// implements [`MemoryRegion`], so a transport's plain host region states only where its bytes are.
pub trait HostRegion: Send + Sync + Any {
    /// Address of the first byte in this process, or null when the region is not mapped here
    /// (a peer's region written through messages); [`MemoryRegion::as_ptr`].
    fn host_base(&self) -> *mut u8;

    /// Length in bytes; [`MemoryRegion::len`].
    fn host_len(&self) -> usize;
}

impl<R: HostRegion> MemoryRegion for R {
    fn as_ptr(&self) -> *mut u8 {
        self.host_base()
    }
    fn len(&self) -> usize {
        self.host_len()
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct Registration {
    descriptor: MemoryDescriptor,
    /// Id of the communicator that registered (local) or imported it; 0 when made by hand.
    communicator: u64,
    region: Arc<dyn MemoryRegion>,
    /// `region.as_ptr()`, read once (it is stable): accessors on hot paths need no virtual call.
    address: usize,
    transport: Transport,
    local: bool,
    /// The owner's rank as `transport` knows it: the owner's rank, except in a communicator
    /// that carries over the transports of one it was shrunk from (see
    /// [`Communicator::carry_over`](crate::communicator::Communicator::carry_over)).
    transport_owner: usize,
}

/// Memory registered with a communicator: either this rank's own (local) or a peer's, imported.
///
/// Cloning is cheap and shares the mapping; the memory is freed or unmapped when the last clone
/// drops. Contents change under other ranks' writes: read them only after a semaphore wait (or
/// another synchronization) says they are ready.
#[derive(Clone)]
pub struct RegisteredMemory {
    inner: Arc<Registration>,
}

impl fmt::Debug for RegisteredMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredMemory")
            .field("label", &self.inner.descriptor.label)
            .field("owner", &self.inner.descriptor.owner)
            .field("seq", &self.inner.descriptor.seq)
            .field("len", &self.inner.descriptor.len)
            .field("kind", &self.inner.descriptor.kind)
            .field("transport", &self.inner.transport.name())
            .field("local", &self.inner.local)
            .finish()
    }
}

impl RegisteredMemory {
    /// Wraps a region this rank owns. `descriptor.len` must equal the region's length.
    pub fn new_local(
        descriptor: MemoryDescriptor,
        region: Arc<dyn MemoryRegion>,
        transport: Transport,
    ) -> Result<Self> {
        Self::new(descriptor, region, transport, true)
    }

    /// Wraps a peer's region that `transport` imported.
    pub fn new_imported(
        descriptor: MemoryDescriptor,
        region: Arc<dyn MemoryRegion>,
        transport: Transport,
    ) -> Result<Self> {
        Self::new(descriptor, region, transport, false)
    }

    /// [`new_local`](Self::new_local) when `local`, else [`new_imported`](Self::new_imported).
    pub fn new(
        descriptor: MemoryDescriptor,
        region: Arc<dyn MemoryRegion>,
        transport: Transport,
        local: bool,
    ) -> Result<Self> {
        if region.len() < descriptor.len {
            return Err(Error::transport(
                transport.name(),
                format!(
                    "region for {:?} is {} bytes, descriptor says {}",
                    descriptor.label,
                    region.len(),
                    descriptor.len
                ),
            ));
        }
        let address = region.as_ptr() as usize;
        let transport_owner = descriptor.owner;
        Ok(RegisteredMemory {
            inner: Arc::new(Registration {
                descriptor,
                communicator: 0,
                region,
                address,
                transport,
                local,
                transport_owner,
            }),
        })
    }

    /// Marks the registration as belonging to communicator `id`, whose transports know its
    /// owner as rank `transport_owner` (right after construction; see
    /// [`transport_owner`](Self::transport_owner)).
    pub(crate) fn in_communicator(mut self, id: u64, transport_owner: usize) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.communicator = id;
            inner.transport_owner = transport_owner;
        }
        self
    }

    /// The owner's rank as this memory's transport knows it — what a connection compares with
    /// its peer. The same as [`owner`](Self::owner) except in a communicator that carries over
    /// the transports of the communicator it was shrunk from, whose ranks the transports keep
    /// (see [`Communicator::carry_over`](crate::communicator::Communicator::carry_over)).
    pub fn transport_owner(&self) -> usize {
        self.inner.transport_owner
    }

    /// Id of the communicator this registration belongs to (0 when built by hand).
    pub fn communicator_id(&self) -> u64 {
        self.inner.communicator
    }

    /// The descriptor peers import.
    pub fn descriptor(&self) -> &MemoryDescriptor {
        &self.inner.descriptor
    }

    /// The name given at registration.
    pub fn label(&self) -> &str {
        &self.inner.descriptor.label
    }

    /// The rank that owns the memory.
    pub fn owner(&self) -> usize {
        self.inner.descriptor.owner
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.descriptor.len
    }

    /// True for a zero-length registration.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the bytes live.
    pub fn kind(&self) -> MemoryKind {
        self.inner.descriptor.kind
    }

    /// True when this rank owns the memory.
    pub fn is_local(&self) -> bool {
        self.inner.local
    }

    /// The transport that allocated (local) or imported (peer) the region.
    pub fn transport(&self) -> Transport {
        self.inner.transport
    }

    /// The underlying region, for transports.
    pub fn region(&self) -> &Arc<dyn MemoryRegion> {
        &self.inner.region
    }

    /// Address of the first byte in this process; null when not mapped here. Dereferencing it
    /// is `unsafe`: stay within [`len`](Self::len) and synchronize with the other ranks.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.address as *mut u8
    }

    /// True when the memory is host memory mapped into this process.
    pub fn is_host_mapped(&self) -> bool {
        self.kind() == MemoryKind::Host && !self.as_ptr().is_null()
    }

    /// `Err(InvalidArgument)` unless `[offset, offset + len)` lies inside the registration.
    /// Inlined (every write checks two ranges; the error is built out of line).
    #[inline]
    pub fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(self.range_error(offset, len)),
        }
    }

    #[cold]
    fn range_error(&self, offset: usize, len: usize) -> Error {
        Error::invalid(format!(
            "range [{offset}, {offset}+{len}) is outside {:?} (rank {}, {} bytes)",
            self.label(),
            self.owner(),
            self.len()
        ))
    }

    fn host_ptr(&self, offset: usize, len: usize) -> Result<*mut u8> {
        self.check_range(offset, len)?;
        if !self.is_host_mapped() {
            return Err(Error::invalid(format!(
                "{:?} (rank {}) is {:?} memory not mapped into this process; use a channel to move it",
                self.label(),
                self.owner(),
                self.kind()
            )));
        }
        // SAFETY: offset + len <= self.len() <= region length, checked above, so the result stays
        // inside (or one past) the mapped region.
        Ok(unsafe { self.as_ptr().add(offset) })
    }

    /// Copies `data` into the memory at `offset` (host memory mapped here only).
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<()> {
        let dst = self.host_ptr(offset, data.len())?;
        // SAFETY: dst..dst+len is inside the mapped region (host_ptr checked it); `data` is a
        // separate Rust slice, so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Copies bytes at `offset` into `out` (host memory mapped here only).
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let src = self.host_ptr(offset, out.len())?;
        // SAFETY: src..src+len is inside the mapped region; `out` is an exclusive Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// The 8-byte word at `offset` as an atomic (host memory mapped here, 8-byte aligned).
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64> {
        let p = self.host_ptr(offset, 8)?;
        if !(p as usize).is_multiple_of(8) {
            return Err(Error::invalid(format!("offset {offset} in {:?} is not 8-byte aligned", self.label())));
        }
        // SAFETY: p is 8-byte aligned, inside the mapping, and the mapping lives as long as
        // `self` (the returned reference borrows self). Other processes only touch this word
        // atomically, so viewing it as an AtomicU64 is sound.
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

    /// Loads the 8-byte word at `offset` with acquire ordering.
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        Ok(self.atomic_u64(offset)?.load(Ordering::Acquire))
    }
}

/// A host region on the Rust heap, 64-byte aligned; used by the loopback transport and for
/// private scratch.
pub struct HeapRegion {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: HeapRegion owns its allocation; the raw pointer is only a handle to it, and all access
// through it is synchronized by the channel protocols (atomics, semaphores).
unsafe impl Send for HeapRegion {}
// SAFETY: see Send: shared access goes through raw pointers with explicit synchronization.
unsafe impl Sync for HeapRegion {}

/// Pages: a heap region owns whole pages, so that it can be page-locked for a GPU
/// (`cuMemHostRegister`) without touching a neighbour's memory.
const HEAP_PAGE: usize = 4096;

impl HeapRegion {
    /// Allocates `len` zeroed bytes in whole pages of their own (at least one, so the pointer
    /// is never dangling). The pages come from an anonymous mapping, so the ones never written
    /// cost no memory: a world of many thread-ranks allocates mailboxes for every peer.
    pub fn new(len: usize) -> Result<Self> {
        let size = Self::size(len)?;
        // SAFETY: a fresh private anonymous mapping of `size` bytes (non-zero), placed by the
        // kernel: it aliases nothing.
        let ptr =
            unsafe { mmap_anonymous(None, size, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_PRIVATE) }
                .map_err(|e| Error::Unsupported(format!("out of host memory allocating {len} bytes: {e}")))?;
        Ok(HeapRegion { ptr: ptr.as_ptr().cast(), len })
    }

    fn size(len: usize) -> Result<std::num::NonZeroUsize> {
        len.max(1)
            .checked_next_multiple_of(HEAP_PAGE)
            .and_then(std::num::NonZeroUsize::new)
            .ok_or_else(|| Error::invalid(format!("cannot allocate {len} bytes")))
    }
}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // The size was valid at allocation, so it is now.
        if let (Ok(size), Some(ptr)) = (Self::size(self.len), std::ptr::NonNull::new(self.ptr)) {
            // SAFETY: ptr and size are the mapping made in `new`, unmapped once; nothing
            // borrows it any more (the region is being dropped).
            let _ = unsafe { munmap(ptr.cast(), size.get()) };
        }
    }
}

impl HostRegion for HeapRegion {
    fn host_base(&self) -> *mut u8 {
        self.ptr
    }
    fn host_len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(len: usize) -> MemoryDescriptor {
        MemoryDescriptor::new(3, 9, "buf", MemoryKind::Host, len, vec![(named("mem-test-a"), vec![1, 2, 3])])
    }

    fn named(name: &str) -> Transport {
        Transport::named(name).unwrap()
    }

    #[test]
    fn access_is_bounds_checked() {
        let region: Arc<dyn MemoryRegion> = Arc::new(HeapRegion::new(64).unwrap());
        let m = RegisteredMemory::new_local(descriptor(64), region, named("mem-test-a")).unwrap();
        m.write_bytes(60, &[1, 2, 3, 4]).unwrap();
        let mut out = [0u8; 4];
        m.read_bytes(60, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        assert!(matches!(m.write_bytes(61, &[0; 4]), Err(Error::InvalidArgument(_))));
        assert!(matches!(m.check_range(usize::MAX, 2), Err(Error::InvalidArgument(_))));
        assert!(m.atomic_u64(4).is_err());
        m.atomic_u64(8).unwrap().store(5, Ordering::Release);
        assert_eq!(m.load_u64(8).unwrap(), 5);
    }

    #[test]
    fn region_shorter_than_descriptor_is_refused() {
        let region: Arc<dyn MemoryRegion> = Arc::new(HeapRegion::new(64).unwrap());
        assert!(RegisteredMemory::new_local(descriptor(65), region, named("mem-test-a")).is_err());
    }
}
