//! Memory of the IB transport: host memory registered with the device (peers write into it), the
//! handles that name a peer's registration, and on-demand registrations of other host memory a
//! connection sends from.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use comm_core::memory::{HeapRegion, HostRegion, MemoryKind, MemoryRegion};
use comm_core::wire::{Decoder, Encoder};
use comm_core::{Error, Result};

use crate::verbs::{ProtectionDomain, Registration};

const EXPORT_MAGIC: [u8; 4] = *b"WVIR";
const EXPORT_VERSION: u16 = 1;

/// Host memory of this rank, registered so that peers may write and update it.
pub(crate) struct IbRegion {
    /// Declared first: dropped (deregistered) before the memory is freed.
    registration: Registration,
    memory: HeapRegion,
}

impl IbRegion {
    /// `len` zeroed bytes, registered with `pd`.
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, len: usize) -> Result<Self> {
        let memory = HeapRegion::new(len)?;
        // SAFETY: the registration is dropped before `memory` (field order).
        let registration = unsafe { Registration::new(pd, memory.as_ptr(), len)? };
        Ok(IbRegion { registration, memory })
    }

    /// The key of this memory in local work requests.
    pub(crate) fn lkey(&self) -> u32 {
        self.registration.lkey()
    }

    /// What a peer needs to write here: address, key, length.
    pub(crate) fn export(&self) -> Vec<u8> {
        let mut e = Encoder::new(EXPORT_MAGIC, EXPORT_VERSION);
        e.u64(self.memory.as_ptr() as u64).u32(self.registration.rkey()).usize(self.memory.len());
        e.finish()
    }
}

impl HostRegion for IbRegion {
    fn host_base(&self) -> *mut u8 {
        self.memory.as_ptr()
    }
    fn host_len(&self) -> usize {
        self.memory.len()
    }
}

/// A peer's registered memory as this rank names it: its address in the peer and its key (its
/// owner is the registration's). Not mapped here.
#[derive(Debug)]
pub(crate) struct RemoteRegion {
    pub(crate) addr: u64,
    pub(crate) rkey: u32,
    len: usize,
    /// The last value `update_and_sync` stored at each word (by offset): a store travels as
    /// the fetch-and-add of the difference (see the connection module).
    stored: Mutex<HashMap<usize, u64>>,
}

impl RemoteRegion {
    /// Decodes `owner`'s export, which must describe exactly `len` bytes.
    pub(crate) fn decode(owner: usize, payload: &[u8], len: usize) -> Result<Self> {
        let mut d = Decoder::new(payload, EXPORT_MAGIC, EXPORT_VERSION, "ib memory export")?;
        let (addr, rkey, their_len) = (d.u64()?, d.u32()?, d.usize()?);
        d.finish()?;
        if their_len != len {
            return Err(Error::protocol(format!(
                "rank {owner} exported {their_len} bytes over ib where its descriptor says {len}"
            )));
        }
        if addr.checked_add(len as u64).is_none() {
            return Err(Error::protocol(format!("rank {owner} exported an ib region that wraps the address space")));
        }
        Ok(RemoteRegion { addr, rkey, len, stored: Mutex::default() })
    }

    /// The value last stored at the word at `offset` through this handle (0 at first: regions
    /// start zeroed).
    pub(crate) fn stored(&self, offset: usize) -> u64 {
        self.stored.lock().unwrap_or_else(|p| p.into_inner()).get(&offset).copied().unwrap_or(0)
    }

    /// Records that the word at `offset` now holds `value`.
    pub(crate) fn record(&self, offset: usize, value: u64) {
        self.stored.lock().unwrap_or_else(|p| p.into_inner()).insert(offset, value);
    }
}

impl HostRegion for RemoteRegion {
    fn host_base(&self) -> *mut u8 {
        std::ptr::null_mut()
    }
    fn host_len(&self) -> usize {
        self.len
    }
}

/// Registrations of host memory this transport did not allocate (a private outbox from another
/// transport, say), made the first time a connection sends from it. Each keeps its region alive,
/// so memory is never freed while the device may read it; they go with the backend.
#[derive(Default)]
pub(crate) struct SourceRegistrations {
    /// By the address of the region's allocation (a region's identity while it lives, and it
    /// lives as long as its entry).
    by_region: Mutex<HashMap<usize, SourceRegistration>>,
}

/// One registered source and the region it covers.
struct SourceRegistration {
    /// Declared first: deregistered before the region may be freed.
    registration: Registration,
    _region: Arc<dyn MemoryRegion>,
}

impl SourceRegistrations {
    /// The local key under which the device may read `region` (host memory mapped here).
    pub(crate) fn lkey(&self, pd: &Arc<ProtectionDomain>, region: &Arc<dyn MemoryRegion>) -> Result<u32> {
        if let Some(mine) = region.as_any().downcast_ref::<IbRegion>() {
            return Ok(mine.lkey());
        }
        if region.kind() != MemoryKind::Host || region.as_ptr().is_null() {
            return Err(Error::Unsupported(format!(
                "ib: cannot send from {:?} memory that is not mapped here (device memory over ib is not built yet)",
                region.kind()
            )));
        }
        let key = Arc::as_ptr(region).cast::<u8>() as usize;
        let mut map = self.by_region.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = map.get(&key) {
            return Ok(entry.registration.lkey());
        }
        // SAFETY: the entry keeps a clone of the region, so its memory outlives the
        // registration, which the entry drops first (field order).
        let registration = unsafe { Registration::new(pd, region.as_ptr(), region.len())? };
        let lkey = registration.lkey();
        map.insert(key, SourceRegistration { registration, _region: region.clone() });
        Ok(lkey)
    }
}
