//! Two IB backends in one process, joined through one verbs device: data integrity across
//! message edges, flags after data, bad input. The tests that need a device are ignored where
//! there is none; `softroce-guest.sh` runs them in a SoftRoCE guest.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use comm_core::Error;
use comm_core::config::Config;
use comm_core::connection::Connection;
use comm_core::memory::{MemoryDescriptor, MemoryKind, RegisteredMemory};
use comm_core::transport::{TransportBackend, TransportContext};

use crate::{IbBackend, PortChoice, transport};

fn context(rank: usize, timeout: Duration) -> TransportContext {
    TransportContext {
        rank,
        world_size: 2,
        job_key: "ibtest".into(),
        communicator_id: 1,
        config: Config { timeout, ..Config::default() },
        abort: Arc::new(AtomicBool::new(false)),
    }
}

fn descriptor(owner: usize, len: usize) -> MemoryDescriptor {
    MemoryDescriptor {
        owner,
        seq: 0,
        digest: MemoryDescriptor::digest_for(0, "t", MemoryKind::Host),
        kind: MemoryKind::Host,
        len,
        label: "t".into(),
        exports: Vec::new(),
    }
}

/// Rank 1's region of `len` bytes as rank 1 sees it and as rank 0 names it.
fn remote_region(owner: &IbBackend, viewer: &IbBackend, len: usize) -> (RegisteredMemory, RegisteredMemory) {
    let region = owner.allocate(len, MemoryKind::Host).unwrap();
    let payload = owner.export(&region).unwrap().expect("exported");
    let local = RegisteredMemory::new_local(descriptor(1, len), region, transport()).unwrap();
    let imported = viewer.import(1, &owner.local_endpoint().unwrap(), &payload, len, MemoryKind::Host).unwrap();
    (local, RegisteredMemory::new_imported(descriptor(1, len), imported, transport()).unwrap())
}

/// Rank 0's source of `len` bytes with a pattern.
fn source(b: &IbBackend, len: usize, seed: u8) -> RegisteredMemory {
    let region = b.allocate(len, MemoryKind::Host).unwrap();
    // SAFETY: a fresh, private region of `len` bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), len) };
    for (i, v) in bytes.iter_mut().enumerate() {
        *v = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    RegisteredMemory::new_local(descriptor(0, len), region, transport()).unwrap()
}

fn same(a: &RegisteredMemory, a_off: usize, b: &RegisteredMemory, b_off: usize, len: usize) -> bool {
    // SAFETY: both are local host regions holding the ranges (the callers' sizes).
    unsafe {
        std::slice::from_raw_parts(a.as_ptr().add(a_off), len) == std::slice::from_raw_parts(b.as_ptr().add(b_off), len)
    }
}

/// Two backends on the default port and rank 0's connection to rank 1 (rank 1 connects too, as
/// a communicator's ranks both do).
fn pair() -> (IbBackend, IbBackend, Arc<dyn Connection>, Arc<dyn Connection>) {
    pair_with_timeout(Duration::from_secs(20))
}

fn pair_with_timeout(t: Duration) -> (IbBackend, IbBackend, Arc<dyn Connection>, Arc<dyn Connection>) {
    let a = IbBackend::open(&context(0, t), &PortChoice::default()).unwrap();
    let b = IbBackend::open(&context(1, t), &PortChoice::default()).unwrap();
    let ab = a.connect(1, &b.local_endpoint().unwrap()).unwrap();
    let ba = b.connect(0, &a.local_endpoint().unwrap()).unwrap();
    (a, b, ab, ba)
}

#[test]
#[ignore = "needs an RDMA device: transport-ib/vm/softroce-guest.sh runs it"]
fn writes_arrive_intact_and_the_flag_lands_after_them() {
    let (a, b, conn, _back) = pair();
    for len in [1, 4095, 4096, (1 << 20) + 3] {
        let (theirs_local, theirs) = remote_region(&b, &a, len + 64);
        let src = source(&a, len, len as u8);
        conn.write(&theirs, 64, &src, 0, len).unwrap();
        conn.update_and_sync(&theirs, 0, 7).unwrap();
        conn.update_and_sync(&theirs, 0, 9).unwrap();
        conn.flush().unwrap();
        assert_eq!(theirs_local.load_u64(0).unwrap(), 9, "the flag of a {len}-byte write");
        assert!(same(&theirs_local, 64, &src, 0, len), "{len} bytes differ");
    }
}

#[test]
#[ignore = "needs an RDMA device: transport-ib/vm/softroce-guest.sh runs it"]
fn sources_from_other_memory_are_registered_on_first_use() {
    let (a, b, conn, _back) = pair();
    let (theirs_local, theirs) = remote_region(&b, &a, 8192);
    let heap = comm_core::memory::HeapRegion::new(8192).unwrap();
    let region: Arc<dyn comm_core::memory::MemoryRegion> = Arc::new(heap);
    // SAFETY: a fresh private region of 8192 bytes.
    unsafe { std::ptr::write_bytes(region.as_ptr(), 0x5a, 8192) };
    let src = RegisteredMemory::new_local(descriptor(0, 8192), region, transport()).unwrap();
    for _ in 0..3 {
        conn.write(&theirs, 0, &src, 0, 8192).unwrap();
    }
    conn.flush().unwrap();
    assert!(same(&theirs_local, 0, &src, 0, 8192));
}

#[test]
#[ignore = "needs an RDMA device: transport-ib/vm/softroce-guest.sh runs it"]
fn out_of_range_and_foreign_destinations_are_refused_before_any_post() {
    let (a, b, conn, _back) = pair();
    let (_theirs_local, theirs) = remote_region(&b, &a, 4096);
    let src = source(&a, 8192, 1);
    let e = conn.write(&theirs, 1, &src, 0, 4096).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = conn.update_and_sync(&theirs, 4092, 1).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = conn.update_and_sync(&theirs, 4, 1).unwrap_err();
    assert!(e.to_string().contains("aligned"), "{e}");
    // Rank 0's own memory is not a destination of its connection to rank 1.
    let e = conn.write(&src, 0, &src, 0, 8).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    conn.flush().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: transport-ib/vm/softroce-guest.sh runs it"]
fn a_peer_whose_queue_pair_is_gone_is_lost_not_a_hang() {
    // SoftRoCE drops packets for a queue pair that is gone without failing the sender's request
    // in time, so the bound here is the communicator's timeout (a real HCA reports "retry
    // exceeded", which is PeerLost).
    let (a, b, conn, back) = pair_with_timeout(Duration::from_secs(3));
    let (_theirs_local, theirs) = remote_region(&b, &a, 4096);
    let src = source(&a, 4096, 2);
    // Rank 1 goes away: its connection (queue pair) and its backend are destroyed.
    drop(back);
    drop(b);
    let started = std::time::Instant::now();
    let r = conn.write(&theirs, 0, &src, 0, 4096).and_then(|()| conn.flush());
    let e = r.unwrap_err();
    println!("a lost peer after {:?}: {e}", started.elapsed());
    assert!(matches!(e, Error::PeerLost { peer: 1, .. } | Error::Timeout { .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(6), "took {:?}", started.elapsed());
    assert!(conn.check_peer().is_err() || matches!(e, Error::Timeout { .. }));
}

#[test]
fn without_a_device_the_backend_is_unsupported() {
    match IbBackend::open(&context(0, Duration::from_secs(1)), &PortChoice::default()) {
        Ok(b) => assert!(!b.local_endpoint().unwrap().is_empty()),
        Err(e) => assert!(matches!(e, Error::Unsupported(_)), "{e}"),
    }
    let asked = PortChoice { device: Some("no_such_hca".into()), port: None, gid_index: None };
    let e = IbBackend::open(&context(0, Duration::from_secs(1)), &asked).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
}
