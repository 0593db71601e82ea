//! Two IB backends in one process, joined through one verbs device: data integrity across
//! message edges, flags after data, bad input. The tests that need a device are ignored where
//! there is none; `softroce-guest.sh` runs them in a SoftRoCE guest.

use std::sync::Arc;
use std::time::Duration;

use comm_core::Error;
use comm_core::connection::Connection;
use comm_core::memory::RegisteredMemory;
use comm_core::testing::{descriptor, patterned_source, remote_region, same_bytes};
use comm_core::transport::TransportBackend;

use crate::{IbBackend, PortChoice, transport};

fn context(rank: usize, timeout: Duration) -> comm_core::transport::TransportContext {
    comm_core::testing::context(rank, "ibtest", timeout)
}

/// Two backends on the default port and rank 0's connection to rank 1 (rank 1 connects too, as
/// a communicator's ranks both do).
fn pair() -> (IbBackend, IbBackend, Arc<dyn Connection>, Arc<dyn Connection>) {
    pair_with_timeout(Duration::from_secs(20))
}

/// Waits (5 s at most) until the word at `offset` of `mine` holds `value`, making `from`'s receive
/// progress as a waiting rank does (`from`: this rank's connection to the peer that stores it).
fn wait_for(from: Option<&dyn Connection>, mine: &RegisteredMemory, offset: usize, value: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(c) = from {
            c.progress().unwrap();
        }
        let now = mine.load_u64(offset).unwrap();
        if now == value {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the word at {offset} holds {now} after 5 s, not {value}");
        std::thread::yield_now();
    }
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
    let (a, b, conn, back) = pair();
    for len in [1, 4095, 4096, (1 << 20) + 3] {
        let (theirs_local, theirs) = remote_region(&b, &a, len + 64).unwrap();
        let src = patterned_source(&a, len, len as u8).unwrap();
        conn.write(&theirs, 64, &src, 0, len).unwrap();
        // A record (the word's first store), then an immediate (a step of 2).
        conn.update_and_sync(&theirs, 0, 7).unwrap();
        conn.update_and_sync(&theirs, 0, 9).unwrap();
        conn.flush().unwrap();
        wait_for(Some(back.as_ref()), &theirs_local, 0, 9);
        assert!(same_bytes(&theirs_local, 64, &src, 0, len).unwrap(), "{len} bytes differ");
        // Data and flag in one operation: the flag rides on the last write's immediate.
        let src = patterned_source(&a, len, len as u8 ^ 0x55).unwrap();
        let write = comm_core::connection::CheckedWrite::new(&theirs, 64, &src, 0, len).unwrap();
        conn.write_and_sync(write, 0, 10).unwrap();
        wait_for(Some(back.as_ref()), &theirs_local, 0, 10);
        assert!(same_bytes(&theirs_local, 64, &src, 0, len).unwrap(), "{len} bytes with their flag differ");
    }
}

#[test]
#[ignore = "needs an RDMA device: transport-ib/vm/softroce-guest.sh runs it"]
fn write_and_sync_chains_more_messages_than_the_send_queue_holds() {
    let (a, b, conn, back) = pair();
    // Each message a chain of a write and an add (one request for an empty write): 3 queue
    // depths of them must retire their completions as they go, or a post finds no room.
    let messages = 3 * crate::connection::SEND_QUEUE_DEPTH as u64;
    for len in [0usize, 8, 4096 + 5] {
        let (theirs_local, theirs) = remote_region(&b, &a, len + 64).unwrap();
        // One source for every message: a source must stay untouched until its write is done.
        let src = patterned_source(&a, len, len as u8).unwrap();
        for m in 1..=messages {
            let write = comm_core::connection::CheckedWrite::new(&theirs, 64, &src, 0, len).unwrap();
            conn.write_and_sync(write, 0, m).unwrap();
            // The receiver applies flags as it goes (a waiter would), so its ring never runs dry.
            back.progress().unwrap();
            if m == messages {
                conn.flush().unwrap();
                wait_for(Some(back.as_ref()), &theirs_local, 0, messages);
                assert!(same_bytes(&theirs_local, 64, &src, 0, len).unwrap(), "the last {len}-byte message differs");
            }
        }
    }
}

#[test]
#[ignore = "needs an RDMA device: transport-ib/vm/softroce-guest.sh runs it"]
fn sources_from_other_memory_are_registered_on_first_use() {
    let (a, b, conn, _back) = pair();
    let (theirs_local, theirs) = remote_region(&b, &a, 8192).unwrap();
    let heap = comm_core::memory::HeapRegion::new(8192).unwrap();
    let region: Arc<dyn comm_core::memory::MemoryRegion> = Arc::new(heap);
    // SAFETY: a fresh private region of 8192 bytes.
    unsafe { std::ptr::write_bytes(region.as_ptr(), 0x5a, 8192) };
    let src = RegisteredMemory::new_local(descriptor(0, 8192), region, transport()).unwrap();
    for _ in 0..3 {
        conn.write(&theirs, 0, &src, 0, 8192).unwrap();
    }
    conn.flush().unwrap();
    assert!(same_bytes(&theirs_local, 0, &src, 0, 8192).unwrap());
}

#[test]
#[ignore = "needs an RDMA device: transport-ib/vm/softroce-guest.sh runs it"]
fn out_of_range_and_foreign_destinations_are_refused_before_any_post() {
    let (a, b, conn, _back) = pair();
    let (_theirs_local, theirs) = remote_region(&b, &a, 4096).unwrap();
    let src = patterned_source(&a, 8192, 1).unwrap();
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
    let (_theirs_local, theirs) = remote_region(&b, &a, 4096).unwrap();
    let src = patterned_source(&a, 4096, 2).unwrap();
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
#[ignore = "needs an RDMA device: transport-ib/vm/softroce-guest.sh runs it"]
fn flags_nobody_waits_on_are_stored_by_the_watcher_in_order() {
    let (a, b, conn, _back) = pair();
    let (theirs_local, theirs) = remote_region(&b, &a, 4096).unwrap();
    // Two words, records and immediates, steps that fit 20 bits and ones that do not, more
    // flags than the receive ring holds: nobody on rank 1 calls progress.
    let values = [1u64, 2, 3, 1 << 40, (1 << 40) + 5, 4, u64::MAX, 0];
    for round in 0..40u64 {
        for (i, v) in values.iter().enumerate() {
            conn.update_and_sync(&theirs, 8 * (i % 2), v.wrapping_add(round)).unwrap();
        }
    }
    conn.flush().unwrap();
    wait_for(None, &theirs_local, 0, values[6].wrapping_add(39));
    wait_for(None, &theirs_local, 8, values[7].wrapping_add(39));
}

#[test]
#[ignore = "needs an RDMA device: transport-ib/vm/softroce-guest.sh runs it"]
fn a_word_its_owner_set_first_takes_each_value_stored_into_it() {
    let (a, b, conn, back) = pair();
    let (theirs_local, theirs) = remote_region(&b, &a, 4096).unwrap();
    // The owner's value before the first store (atomic flags read it; immediates overwrite it),
    // then values that go up, down and wrap.
    theirs_local.atomic_u64(64).unwrap().store(100, std::sync::atomic::Ordering::Release);
    for v in [7u64, 9, 3, u64::MAX, 1, 1] {
        conn.update_and_sync(&theirs, 64, v).unwrap();
        wait_for(Some(back.as_ref()), &theirs_local, 64, v);
    }
    // Another word of the same region, behind data.
    let src = patterned_source(&a, 200, 3).unwrap();
    let write = comm_core::connection::CheckedWrite::new(&theirs, 256, &src, 0, 200).unwrap();
    conn.write_and_sync(write, 128, 42).unwrap();
    wait_for(Some(back.as_ref()), &theirs_local, 128, 42);
    assert!(same_bytes(&theirs_local, 256, &src, 0, 200).unwrap(), "the data before the flag differs");
}

#[test]
#[ignore = "needs an RDMA device: transport-ib/vm/softroce-guest.sh runs it"]
fn a_flag_for_a_region_the_receiver_never_had_breaks_the_connection_naming_the_peer() {
    let (a, b, conn, back) = pair();
    let (theirs_local, theirs) = remote_region(&b, &a, 4096).unwrap();
    // The same memory under a region number rank 1 never gave out (an export that lies).
    let region = theirs.region().as_any().downcast_ref::<crate::region::RemoteRegion>().unwrap();
    let mut e = comm_core::wire::Encoder::new(*b"WVIR", 2);
    let key = region.key();
    e.u64(key.addr).u32(key.rkey).usize(4096).u32(key.id + 1000);
    let ep = b.local_endpoint().unwrap();
    let export = comm_core::transport::PeerExport {
        peer: 1,
        peer_endpoint: &ep,
        payload: &e.finish(),
        len: 4096,
        kind: comm_core::memory::MemoryKind::Host,
    };
    let forged = a.import(export).unwrap();
    let forged = RegisteredMemory::new_imported(descriptor(1, 4096), forged, transport()).unwrap();
    conn.update_and_sync(&forged, 0, 1).unwrap();
    conn.flush().unwrap();
    if crate::flags::FlagPath::from_env().unwrap() == crate::flags::FlagPath::Atomic {
        // An atomic names the word by address and key, both real here: the region number the
        // receiver would check is not on the wire, and the store lands.
        wait_for(Some(back.as_ref()), &theirs_local, 0, 1);
        return;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let e = loop {
        if let Err(e) = back.progress().and_then(|()| back.check_peer()) {
            break e;
        }
        assert!(std::time::Instant::now() < deadline, "the forged flag was not refused in 5 s");
        std::thread::yield_now();
    };
    assert!(matches!(e, Error::PeerLost { peer: 0, .. }), "{e}");
    assert!(e.to_string().contains("region"), "{e}");
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

/// Host memory that poses as device 0's, for the staging path over a real verbs device where
/// there is no GPU: copied with memcpy, staged in heap memory.
struct HostAsDevice;

/// A host allocation that says it is device memory.
struct DeviceStandIn(comm_core::memory::HeapRegion);

impl comm_core::memory::MemoryRegion for DeviceStandIn {
    fn as_ptr(&self) -> *mut u8 {
        comm_core::memory::MemoryRegion::as_ptr(&self.0)
    }
    fn len(&self) -> usize {
        comm_core::memory::MemoryRegion::len(&self.0)
    }
    fn kind(&self) -> comm_core::memory::MemoryKind {
        comm_core::memory::MemoryKind::Device(0)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct MemCopy;

impl crate::staging::CopyEngine for MemCopy {
    unsafe fn device_to_host(&self, dst: *mut u8, src: u64, len: usize) -> comm_core::Result<()> {
        // SAFETY: the "device" address is a host pointer of a DeviceStandIn (the test's).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, len) };
        Ok(())
    }
}

struct HeapPinned(comm_core::memory::HeapRegion);

impl crate::device_sources::PinnedBuffer for HeapPinned {
    fn as_ptr(&self) -> *mut u8 {
        comm_core::memory::MemoryRegion::as_ptr(&self.0)
    }
    fn len(&self) -> usize {
        comm_core::memory::MemoryRegion::len(&self.0)
    }
}

impl crate::device_sources::CudaAccess for HostAsDevice {
    fn support(&self, _: u32) -> crate::gpu_direct::GpuDirectSupport {
        crate::gpu_direct::GpuDirectSupport { staging: true, ..Default::default() }
    }
    fn dmabuf(&self, _: u32, _: u64, _: usize) -> comm_core::Result<(std::os::fd::OwnedFd, u64)> {
        Err(Error::Unsupported("no GPU here".into()))
    }
    fn copy_engine(&self, _: u32) -> comm_core::Result<Arc<dyn crate::staging::CopyEngine>> {
        Ok(Arc::new(MemCopy))
    }
    fn pinned(&self, _: u32, len: usize) -> comm_core::Result<Box<dyn crate::device_sources::PinnedBuffer>> {
        Ok(Box::new(HeapPinned(comm_core::memory::HeapRegion::new(len)?)))
    }
}

/// `len` bytes of host memory posing as device memory, filled with a pattern of `seed`.
fn device_stand_in(len: usize) -> (RegisteredMemory, *mut u8) {
    let region: Arc<dyn comm_core::memory::MemoryRegion> =
        Arc::new(DeviceStandIn(comm_core::memory::HeapRegion::new(len).unwrap()));
    let at = region.as_ptr();
    let d = comm_core::memory::MemoryDescriptor::new(0, 0, "t", comm_core::memory::MemoryKind::Device(0), len, vec![]);
    (RegisteredMemory::new_local(d, region, transport()).unwrap(), at)
}

#[test]
#[ignore = "needs an RDMA device: transport-ib/vm/softroce-guest.sh runs it"]
fn device_sources_without_gpudirect_are_staged_through_host_memory() {
    let t = Duration::from_secs(20);
    let a = IbBackend::open_with(&context(0, t), &PortChoice::default(), Some(Arc::new(HostAsDevice))).unwrap();
    let b = IbBackend::open(&context(1, t), &PortChoice::default()).unwrap();
    let conn = a.connect(1, &b.local_endpoint().unwrap()).unwrap();
    let back = b.connect(0, &a.local_endpoint().unwrap()).unwrap();
    // Five chunks of the ring's four 1 MiB slots: the fifth waits for the first one's write.
    let len = 4 * (1 << 20) + 12_345;
    let (theirs_local, theirs) = remote_region(&b, &a, len + 64).unwrap();
    let (src, at) = device_stand_in(len);
    for round in 1..=2u64 {
        // SAFETY: `at` holds `len` bytes of the stand-in, which no write reads any more (the
        // previous round's flag came after its data).
        let bytes = unsafe { std::slice::from_raw_parts_mut(at, len) };
        for (i, v) in bytes.iter_mut().enumerate() {
            *v = (i as u8).wrapping_mul(13).wrapping_add(round as u8);
        }
        let write = comm_core::connection::CheckedWrite::new(&theirs, 64, &src, 0, len).unwrap();
        conn.write_and_sync(write, 0, round).unwrap();
        wait_for(Some(back.as_ref()), &theirs_local, 0, round);
        // SAFETY: the destination's bytes were placed before the flag that was just seen.
        let arrived = unsafe { std::slice::from_raw_parts(theirs_local.as_ptr().add(64), len) };
        assert!(arrived == bytes, "round {round}: the staged bytes differ");
    }
    // Rank 1 has no CUDA stand-in: its device memory cannot be sent, and says so.
    let (mine_local, mine) = remote_region(&a, &b, 4096).unwrap();
    let (src, _) = device_stand_in(4096);
    let e = back.write(&mine, 0, &src, 0, 4096).unwrap_err();
    assert!(matches!(&e, Error::Unsupported(m) if m.contains("device memory")), "{e}");
    drop(mine_local);
}
