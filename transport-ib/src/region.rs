//! Memory of the IB transport: host memory registered with the device (peers write into it), the
//! table of this rank's registered regions by number (where peers' flags land), the handles that
//! name a peer's registration, and on-demand registrations of other host memory a connection
//! sends from.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex, Weak};

use comm_core::memory::{HeapRegion, HostRegion, MemoryKind, MemoryRegion};
use comm_core::wire::{Decoder, Encoder};
use comm_core::{Error, Result};

use crate::verbs::{ProtectionDomain, Registration};

const EXPORT_MAGIC: [u8; 4] = *b"WVIR";
const EXPORT_VERSION: u16 = 2;

/// The number of a region that is no destination (receive rings, record outboxes): no peer's
/// flag names it.
pub(crate) const PRIVATE: u32 = 0;

/// Host memory of this rank, registered so that peers may write and update it.
pub(crate) struct IbRegion {
    /// Declared first: dropped (deregistered) before the memory is freed.
    registration: Registration,
    memory: HeapRegion,
    /// Its number in the backend's [`LocalRegions`] ([`PRIVATE`] outside it).
    id: u32,
}

impl IbRegion {
    /// `len` zeroed bytes, registered with `pd`, numbered `id`.
    pub(crate) fn new(pd: &Arc<ProtectionDomain>, len: usize, id: u32) -> Result<Self> {
        let memory = HeapRegion::new(len)?;
        // SAFETY: the registration is dropped before `memory` (field order).
        let registration = unsafe { Registration::new(pd, memory.as_ptr(), len)? };
        Ok(IbRegion { registration, memory, id })
    }

    /// The key of this memory in local work requests.
    pub(crate) fn lkey(&self) -> u32 {
        self.registration.lkey()
    }

    /// What a peer needs to write here: address, key, length, number.
    pub(crate) fn export(&self) -> Vec<u8> {
        let key = RemoteKey { addr: self.memory.as_ptr() as u64, rkey: self.registration.rkey(), id: self.id };
        encode_export(key, self.memory.len())
    }

    /// The 8-byte word at `offset`, where a peer's flag is stored; `None` when it does not lie
    /// inside the region or is not 8-byte aligned.
    pub(crate) fn word(&self, offset: u64) -> Option<&AtomicU64> {
        let offset = usize::try_from(offset).ok()?;
        if offset.checked_add(8)? > self.memory.len() || !offset.is_multiple_of(8) {
            return None;
        }
        // SAFETY: inside the region (checked), 8-byte aligned (the heap region is 64-byte
        // aligned), live while `self` is; peers' flag words are only accessed atomically.
        Some(unsafe { AtomicU64::from_ptr(self.memory.as_ptr().add(offset).cast()) })
    }
}

/// This rank's regions that peers write into, by number: a flag record names its word by
/// (region number, offset), and the receiving side finds the memory here. Holds them weakly: a
/// region dropped by its owner is gone from the table too.
#[derive(Default)]
pub(crate) struct LocalRegions {
    last: AtomicU32,
    by_id: Mutex<HashMap<u32, Weak<IbRegion>>>,
}

impl LocalRegions {
    /// A new region of `len` zeroed bytes, registered with `pd` and numbered in this table.
    pub(crate) fn allocate(&self, pd: &Arc<ProtectionDomain>, len: usize) -> Result<Arc<IbRegion>> {
        let id = self.last.fetch_add(1, std::sync::atomic::Ordering::Relaxed).wrapping_add(1);
        if id == PRIVATE {
            return Err(Error::invalid("ib: this communicator numbered 2^32 regions; make a new one"));
        }
        let region = Arc::new(IbRegion::new(pd, len, id)?);
        let mut map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= 64 && map.len().is_power_of_two() {
            map.retain(|_, r| r.strong_count() > 0);
        }
        map.insert(id, Arc::downgrade(&region));
        Ok(region)
    }

    /// The live region numbered `id`.
    pub(crate) fn get(&self, id: u32) -> Option<Arc<IbRegion>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner()).get(&id).and_then(Weak::upgrade)
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

/// A peer's registered memory as this rank names it: its key (see [`RemoteKey`]; its owner is
/// the registration's) and its length. Not mapped here.
#[derive(Debug)]
pub(crate) struct RemoteRegion {
    key: RemoteKey,
    len: usize,
}

/// What a work request needs of a peer's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RemoteKey {
    /// The region's address in the peer.
    pub(crate) addr: u64,
    /// The peer's remote key for it.
    pub(crate) rkey: u32,
    /// Its number among the peer's regions (what flags name).
    pub(crate) id: u32,
}

/// The export of a region of `len` bytes that peers reach with `key` (see [`RemoteRegion::decode`]).
pub(crate) fn encode_export(key: RemoteKey, len: usize) -> Vec<u8> {
    Encoder::new(EXPORT_MAGIC, EXPORT_VERSION).u64(key.addr).u32(key.rkey).usize(len).u32(key.id).finish()
}

impl RemoteRegion {
    /// Its address, key and number.
    pub(crate) fn key(&self) -> RemoteKey {
        self.key
    }

    /// Decodes `owner`'s export, which must describe exactly `len` bytes.
    pub(crate) fn decode(owner: usize, payload: &[u8], len: usize) -> Result<Self> {
        let mut d = Decoder::new(payload, EXPORT_MAGIC, EXPORT_VERSION, "ib memory export")?;
        let (addr, rkey, their_len, id) = (d.u64()?, d.u32()?, d.usize()?, d.u32()?);
        d.finish()?;
        if their_len != len {
            return Err(Error::protocol(format!(
                "rank {owner} exported {their_len} bytes over ib where its descriptor says {len}"
            )));
        }
        if addr.checked_add(len as u64).is_none() {
            return Err(Error::protocol(format!("rank {owner} exported an ib region that wraps the address space")));
        }
        if id == PRIVATE {
            return Err(Error::protocol(format!("rank {owner} exported an ib region without a number")));
        }
        Ok(RemoteRegion { key: RemoteKey { addr, rkey, id }, len })
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

/// The keys of the regions a connection last wrote from and into. A channel link posts message
/// after message from the same outbox into the same peer buffer, and finding a region's key
/// anew means calls through its trait object (on an emulated CPU, where every indirect call
/// is a lookup, a good part of a small message's own work). Regions are known by the address
/// of their allocation; the `Weak` kept with each pins that allocation, so a region at the
/// remembered address is the remembered one, never a new one where a dropped one was.
#[derive(Default)]
pub(crate) struct RecentRegions {
    destination: Option<(Weak<dyn MemoryRegion>, RemoteKey)>,
    source: Option<(Weak<dyn MemoryRegion>, u32)>,
}

impl RecentRegions {
    /// The remembered key of the peer's region `region`, if it is the last destination.
    pub(crate) fn destination(&self, region: &Arc<dyn MemoryRegion>) -> Option<RemoteKey> {
        let (last, key) = self.destination.as_ref()?;
        std::ptr::addr_eq(last.as_ptr(), Arc::as_ptr(region)).then_some(*key)
    }

    /// Remembers `key` as that of the peer's region `region`.
    pub(crate) fn remember_destination(&mut self, region: &Arc<dyn MemoryRegion>, key: RemoteKey) {
        self.destination = Some((Arc::downgrade(region), key));
    }

    /// The remembered local key of `region`, if it is the last source.
    pub(crate) fn source(&self, region: &Arc<dyn MemoryRegion>) -> Option<u32> {
        let (last, lkey) = self.source.as_ref()?;
        std::ptr::addr_eq(last.as_ptr(), Arc::as_ptr(region)).then_some(*lkey)
    }

    /// Remembers `lkey` as the key the device reads `region` under (valid while the region
    /// lives: its registration lives as long).
    pub(crate) fn remember_source(&mut self, region: &Arc<dyn MemoryRegion>, lkey: u32) {
        self.source = Some((Arc::downgrade(region), lkey));
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
