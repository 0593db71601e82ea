//! Memory of the TCP transport: local regions peers write into (found by id, never by address)
//! and the handles that name a peer's region.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use comm_core::memory::{HeapRegion, HostRegion, MemoryRegion};
use comm_core::wire::{Decoder, Encoder};
use comm_core::{Error, Result};

const EXPORT_MAGIC: [u8; 4] = *b"WVTX";
const EXPORT_VERSION: u16 = 1;

/// Host memory of this rank that peers may write through this transport.
pub(crate) struct TcpRegion {
    id: u64,
    memory: HeapRegion,
}

impl TcpRegion {
    /// This region's id on the wire.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

impl HostRegion for TcpRegion {
    fn host_base(&self) -> *mut u8 {
        self.memory.as_ptr()
    }
    fn host_len(&self) -> usize {
        self.memory.len()
    }
}

/// A peer's region as this rank names it: (id, length); its owner is the registration's. Not
/// mapped here.
#[derive(Debug)]
pub(crate) struct RemoteRegion {
    pub(crate) id: u64,
    len: usize,
}

impl HostRegion for RemoteRegion {
    fn host_base(&self) -> *mut u8 {
        std::ptr::null_mut()
    }
    fn host_len(&self) -> usize {
        self.len
    }
}

/// The regions of one backend, by id; receivers look destinations up here.
#[derive(Default)]
pub(crate) struct Regions {
    next: AtomicU64,
    by_id: Mutex<HashMap<u64, Weak<TcpRegion>>>,
}

impl Regions {
    /// Allocates `len` zeroed bytes under a fresh id.
    pub(crate) fn allocate(&self, len: usize) -> Result<Arc<TcpRegion>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let region = Arc::new(TcpRegion { id, memory: HeapRegion::new(len)? });
        let mut map = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        map.insert(id, Arc::downgrade(&region));
        Ok(region)
    }

    /// The live region with `id`, if any.
    pub(crate) fn find(&self, id: u64) -> Option<Arc<TcpRegion>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner()).get(&id).and_then(Weak::upgrade)
    }
}

/// The export payload of a region: its id.
pub(crate) fn encode_export(id: u64) -> Vec<u8> {
    Encoder::new(EXPORT_MAGIC, EXPORT_VERSION).u64(id).finish()
}

/// A peer's region from its export payload.
pub(crate) fn decode_export(owner: usize, payload: &[u8], len: usize) -> Result<RemoteRegion> {
    let mut d = Decoder::new(payload, EXPORT_MAGIC, EXPORT_VERSION, "tcp export")?;
    let id = d.u64()?;
    d.finish()?;
    if id == 0 {
        return Err(Error::protocol(format!("rank {owner} exported a tcp region with id 0")));
    }
    Ok(RemoteRegion { id, len })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_found_by_id_while_alive() {
        let regions = Regions::default();
        let a = regions.allocate(100).unwrap();
        let b = regions.allocate(8).unwrap();
        assert_ne!(a.id(), b.id());
        assert_eq!(regions.find(a.id()).map(|r| r.len()), Some(100));
        let id = b.id();
        drop(b);
        assert!(regions.find(id).is_none());
        assert!(regions.find(12345).is_none());
    }

    #[test]
    fn exports_round_trip_and_garbage_is_refused() {
        let r = decode_export(2, &encode_export(42), 64).unwrap();
        assert_eq!((r.id, r.len()), (42, 64));
        assert!(r.as_ptr().is_null());
        assert!(decode_export(2, &encode_export(0), 64).is_err());
        let bytes = encode_export(42);
        for cut in 0..bytes.len() {
            assert!(decode_export(2, &bytes[..cut], 64).is_err());
        }
    }
}
