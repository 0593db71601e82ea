//! GPU tests of transport-cudaipc. Each prints `SKIPPED: no CUDA driver/device` and returns when
//! there is no driver or no device (on CPU-only hosts they do not count as a real pass).
//!
//! Ranks are backends of this one process (two ranks may share one GPU: the mechanics are the
//! same), built directly with a hand-made `TransportContext`; the cross-process tests re-run this
//! test binary as the second rank (`WEAVE_CUDAIPC_CHILD` set), so the FD server, `SO_PEERCRED`
//! and `cuIpcOpenMemHandle` are exercised between real processes.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use comm_core::config::Config;
use comm_core::device::DeviceError;
use comm_core::error::Error;
use comm_core::memory::{HeapRegion, MemoryDescriptor, MemoryKind, MemoryRegion, RegisteredMemory};
use comm_core::transport::{PeerExport, TransportBackend, TransportContext, TransportFactory};
use cudarc::driver::{PushKernelArg, sys};
use transport_cudaipc::{CudaIpcBackend, CudaIpcTransport, import_cache_entries};
use weave_cuda::{
    CudaContext, DeviceRegion, PacketBuffers, device_count, device_semaphore, driver_available, memory_channel_handle,
};

const CHILD_ENV: &str = "WEAVE_CUDAIPC_CHILD";
const TIMEOUT: Duration = Duration::from_secs(20);

/// Serializes the GPU tests of this process: the leak test measures process-wide free memory,
/// open descriptors and import-cache entries, which concurrent tests would disturb.
static GPU_LOCK: Mutex<()> = Mutex::new(());

/// The GPU test lock when a driver and a device exist; otherwise says so, and the test returns.
fn gpu() -> Option<MutexGuard<'static, ()>> {
    if !driver_available() || device_count().unwrap_or(0) == 0 {
        println!("SKIPPED: no CUDA driver/device");
        return None;
    }
    Some(GPU_LOCK.lock().unwrap_or_else(|p| p.into_inner()))
}

fn job_key(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("gpu{tag}_{}_{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn context(rank: usize, world_size: usize, job: &str) -> TransportContext {
    TransportContext {
        rank,
        world_size,
        job_key: job.into(),
        communicator_id: 1,
        config: Config { timeout: TIMEOUT, ..Config::default() },
        abort: Arc::new(AtomicBool::new(false)),
        liveness: Default::default(),
    }
}

fn backend(rank: usize, world_size: usize, job: &str) -> CudaIpcBackend {
    CudaIpcBackend::open(&context(rank, world_size, job), None).expect("open cudaipc backend")
}

fn registered(region: Arc<dyn MemoryRegion>, owner: usize, local: bool, kind: MemoryKind) -> RegisteredMemory {
    let d = MemoryDescriptor::new(owner, 0, "buf", kind, region.len(), vec![]);
    RegisteredMemory::new(d, region, transport_cudaipc::transport(), local).unwrap()
}

fn bind(ctx: &CudaContext) {
    ctx.bind_to_thread().unwrap();
}

fn write_device(ctx: &CudaContext, ptr: u64, data: &[u8]) {
    bind(ctx);
    // SAFETY: `ptr` is device memory with at least data.len() bytes (the caller's region).
    let r = unsafe { sys::cuMemcpyHtoD_v2(ptr, data.as_ptr().cast::<c_void>(), data.len()) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuMemcpyHtoD");
}

fn read_device(ctx: &CudaContext, ptr: u64, len: usize) -> Vec<u8> {
    bind(ctx);
    let mut out = vec![0u8; len];
    // SAFETY: `ptr` is device memory with at least `len` bytes; `out` has `len` bytes.
    let r = unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast::<c_void>(), ptr, len) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuMemcpyDtoH");
    out
}

fn free_memory(ctx: &CudaContext) -> usize {
    bind(ctx);
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: writes two values through valid pointers.
    let r = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    free
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed)).collect()
}

fn ptr_of(m: &RegisteredMemory) -> u64 {
    m.as_ptr() as u64
}

/// `backend`'s import of what `peer` (endpoint `peer_endpoint`) exported as `payload`.
fn import_from(
    backend: &CudaIpcBackend,
    peer: usize,
    peer_endpoint: &[u8],
    payload: &[u8],
    len: usize,
    kind: MemoryKind,
) -> comm_core::Result<Arc<dyn MemoryRegion>> {
    backend.import(PeerExport { peer, peer_endpoint, payload, len, kind })
}

fn device_kind(b: &CudaIpcBackend) -> MemoryKind {
    MemoryKind::Device(b.device_ordinal())
}

fn open_reports_devices_and_refuses_duplicates_and_bad_ordinals() {
    let Some(_gpu) = gpu() else { return };
    let job = job_key("open");
    let count = device_count().unwrap();
    let b = CudaIpcTransport::new().open(&context(0, 2, &job)).unwrap();
    assert_eq!(b.transport(), transport_cudaipc::transport());
    assert!(b.direct_access());
    let cb = b.as_any().downcast_ref::<CudaIpcBackend>().unwrap();
    assert_eq!(cb.device_ordinal(), 0);
    assert!(cb.granularity().is_power_of_two());
    assert!(!cb.pci_bus_id().is_empty());
    assert_eq!(cb.socket_name(), format!("weave-{job}-r0-c1"));
    // The same job, rank and communicator again: the socket name is taken.
    let dup = CudaIpcTransport::new().open(&context(0, 2, &job));
    assert!(
        matches!(&dup, Err(Error::Transport { message, .. }) if message.contains("already bound")),
        "{:?}",
        dup.err()
    );
    let bad = CudaIpcTransport::on_device(count as u32).open(&context(1, 2, &job));
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{:?}", bad.err());
    // Rank 1 defaults to device 1 % count.
    let b1 = backend(1, 2, &job);
    assert_eq!(b1.device_ordinal() as usize, 1 % count);
    let ep = (b.local_endpoint().unwrap(), b1.local_endpoint().unwrap());
    assert!(b.can_reach(&ep.0, &ep.1).unwrap() && b1.can_reach(&ep.1, &ep.0).unwrap());
    println!(
        "devices: {count}; rank 0 on {} ({}), rank 1 on {}",
        cb.device_ordinal(),
        cb.pci_bus_id(),
        b1.device_ordinal()
    );
}

fn vmm_allocate_export_import_write_and_read_back() {
    let Some(_gpu) = gpu() else { return };
    let job = job_key("vmm");
    let (b0, b1) = (backend(0, 2, &job), backend(1, 2, &job));
    let (ep0, k0, k1) = (b0.local_endpoint().unwrap(), device_kind(&b0), device_kind(&b1));
    let len = 3 * 1024 * 1024 + 17;

    // Host memory and other devices are not this transport's to allocate.
    assert!(matches!(b0.allocate(64, MemoryKind::Host), Err(Error::Unsupported(_))));
    assert!(matches!(b0.allocate(64, MemoryKind::Device(999)), Err(Error::InvalidArgument(_))));

    let owned = b0.allocate(len, k0).unwrap();
    assert_eq!((owned.len(), owned.kind()), (len, k0));
    let r = owned.as_any().downcast_ref::<DeviceRegion>().unwrap();
    assert!(!r.is_imported() && r.device_ptr() % b0.granularity() as u64 == 0);
    assert!(read_device(b0.context(), r.device_ptr(), len).iter().all(|&b| b == 0), "allocation is zeroed");
    let payload = b0.export(&owned).unwrap().expect("cudaipc exports its own allocations");
    // Another backend does not export what it did not allocate.
    assert!(b1.export(&owned).unwrap().is_none());

    let before = import_cache_entries();
    let imported = import_from(&b1, 0, &ep0, &payload, len, k0).unwrap();
    assert_eq!((imported.len(), imported.kind()), (len, k0));
    assert!(imported.as_any().downcast_ref::<DeviceRegion>().unwrap().is_imported());
    // A second import of the same allocation shares the mapping.
    let again = import_from(&b1, 0, &ep0, &payload, 4096, k0).unwrap();
    assert_eq!(again.as_ptr(), imported.as_ptr());
    assert_eq!(import_cache_entries(), before + 1);
    drop(again);
    // Imported memory is not re-exported.
    assert!(b1.export(&imported).unwrap().is_none());

    // Garbage and lies in payloads are protocol errors.
    assert!(matches!(import_from(&b1, 0, &ep0, &payload, len + (4 << 20), k0), Err(Error::Protocol(_))));
    assert!(matches!(import_from(&b1, 0, &ep0, &payload[..payload.len() - 1], len, k0), Err(Error::Protocol(_))));
    assert!(matches!(import_from(&b1, 0, &ep0, b"garbage", len, k0), Err(Error::Protocol(_))));
    assert!(matches!(import_from(&b1, 0, &b"junk"[..], &payload, len, k0), Err(Error::Protocol(_))));
    assert!(matches!(import_from(&b1, 0, &ep0, &payload, len, MemoryKind::Host), Err(Error::Unsupported(_))));
    assert!(matches!(import_from(&b1, 5, &ep0, &payload, len, k0), Err(Error::InvalidArgument(_))));

    // Rank 1 writes into rank 0's memory through its connection, then raises a flag.
    let on_owner = registered(owned.clone(), 0, true, k0);
    let on_peer = registered(imported.clone(), 0, false, k0);
    let src = registered(b1.allocate(len, k1).unwrap(), 1, true, k1);
    let data = pattern(len, 7);
    write_device(b1.context(), ptr_of(&src), &data);
    let flag_owned = b0.allocate(64, k0).unwrap();
    let flag_payload = b0.export(&flag_owned).unwrap().unwrap();
    let flag = registered(import_from(&b1, 0, &ep0, &flag_payload, 64, k0).unwrap(), 0, false, k0);
    let conn = b1.connect(0, &ep0).unwrap();
    assert_eq!((conn.transport(), conn.peer()), (transport_cudaipc::transport(), 0));
    conn.write(&on_peer, 0, &src, 0, len).unwrap();
    conn.update_and_sync(&flag, 8, 0xabcd_0000_0000_0001).unwrap();
    conn.flush().unwrap();
    conn.check_peer().unwrap();
    assert!(read_device(b0.context(), ptr_of(&on_owner), len) == data, "owner sees the peer's write");
    let word = read_device(b0.context(), flag_owned.as_ptr() as u64 + 8, 8);
    assert_eq!(u64::from_le_bytes(word.try_into().unwrap()), 0xabcd_0000_0000_0001);

    // Offsets, partial copies, zero-length copies.
    conn.write(&on_peer, 1, &src, 0, 100).unwrap();
    conn.write(&on_peer, 0, &src, 0, 0).unwrap();
    conn.flush().unwrap();
    assert_eq!(read_device(b0.context(), ptr_of(&on_owner) + 1, 100), data[..100]);

    // Bad ranges, alignment and memory kinds are argument errors.
    assert!(matches!(conn.write(&on_peer, len - 1, &src, 0, 2), Err(Error::InvalidArgument(_))));
    assert!(matches!(conn.write(&on_peer, 0, &src, len, 1), Err(Error::InvalidArgument(_))));
    assert!(matches!(conn.update_and_sync(&flag, 4, 1), Err(Error::InvalidArgument(_))));
    assert!(matches!(conn.update_and_sync(&flag, 60, 1), Err(Error::InvalidArgument(_))));
    let host = registered(Arc::new(HeapRegion::new(64).unwrap()), 0, false, MemoryKind::Host);
    assert!(matches!(conn.write(&host, 0, &src, 0, 8), Err(Error::InvalidArgument(_))));
    // A host flag (a shared-memory token) is stored after the copies complete.
    conn.update_and_sync(&host, 16, 42).unwrap();
    assert_eq!(host.load_u64(16).unwrap(), 42);

    // A freed allocation can no longer be imported: the FD server refuses its id.
    let gone = b0.allocate(4096, k0).unwrap();
    let gone_payload = b0.export(&gone).unwrap().unwrap();
    drop(gone);
    let r = import_from(&b1, 0, &ep0, &gone_payload, 4096, k0);
    assert!(matches!(&r, Err(Error::Transport { message, .. }) if message.contains("not exported")), "{:?}", r.err());

    drop((imported, on_peer, flag, conn));
    assert_eq!(import_cache_entries(), before, "mappings are released with their last region");
}

fn legacy_ipc_path_on_a_cumemalloc_buffer() {
    let Some(_gpu) = gpu() else { return };
    let job = job_key("legacy");
    let (b0, b1) = (backend(0, 2, &job), backend(1, 2, &job));
    let (ep0, k0, k1) = (b0.local_endpoint().unwrap(), device_kind(&b0), device_kind(&b1));
    bind(b0.context());
    let mut base: u64 = 0;
    // SAFETY: writes one device address; 1 MiB is a valid size.
    let r = unsafe { sys::cuMemAlloc_v2(&mut base, 1 << 20) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    let (offset, len) = (4096usize, 64 * 1024);
    let user = b0.register_device_memory(base + offset as u64, len).unwrap();
    assert_eq!((user.as_ptr() as u64, user.len()), (base + offset as u64, len));
    assert!(matches!(b0.register_device_memory(base + (1 << 20) - 8, 16), Err(Error::InvalidArgument(_))));
    assert!(matches!(b0.register_device_memory(0, 16), Err(Error::InvalidArgument(_))));
    let payload = b0.export(&user).unwrap().expect("registered memory is exported");
    // Same process: the handle cannot be opened here, the memory is used in place.
    let imported = import_from(&b1, 0, &ep0, &payload, len, k0).unwrap();
    assert_eq!(imported.as_ptr(), user.as_ptr());
    assert!(matches!(import_from(&b1, 0, &ep0, &payload, (1 << 20) - offset + 1, k0), Err(Error::Protocol(_))));

    let src = registered(b1.allocate(len, k1).unwrap(), 1, true, k1);
    let data = pattern(len, 3);
    write_device(b1.context(), ptr_of(&src), &data);
    let conn = b1.connect(0, &ep0).unwrap();
    let dst = registered(imported, 0, false, k0);
    conn.write(&dst, 0, &src, 0, len).unwrap();
    conn.flush().unwrap();
    assert!(read_device(b0.context(), base + offset as u64, len) == data);
    drop((dst, user, conn));
    bind(b0.context());
    // SAFETY: `base` came from cuMemAlloc and nothing uses it any more.
    assert_eq!(unsafe { sys::cuMemFree_v2(base) }, sys::CUresult::CUDA_SUCCESS);
}

fn pool_memory_is_unsupported() {
    let Some(_gpu) = gpu() else { return };
    let job = job_key("pool");
    let b0 = backend(0, 1, &job);
    bind(b0.context());
    let pools = {
        let mut v = 0;
        // SAFETY: writes one int.
        let r = unsafe {
            sys::cuDeviceGetAttribute(
                &mut v,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
                b0.context().cu_device(),
            )
        };
        r == sys::CUresult::CUDA_SUCCESS && v != 0
    };
    if !pools {
        println!("SKIPPED: device has no memory pools");
        return;
    }
    let mut p: u64 = 0;
    // SAFETY: writes one device address; the legacy stream (null) of the bound context.
    let r = unsafe { sys::cuMemAllocAsync(&mut p, 1 << 16, std::ptr::null_mut()) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    // SAFETY: synchronizes the legacy stream of the bound context.
    assert_eq!(unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) }, sys::CUresult::CUDA_SUCCESS);
    let r = b0.register_device_memory(p, 4096);
    assert!(
        matches!(&r, Err(Error::Unsupported(m)) if m.contains("pool") && m.contains("through weave")),
        "{:?}",
        r.err()
    );
    // SAFETY: `p` came from cuMemAllocAsync and is unused.
    assert_eq!(unsafe { sys::cuMemFreeAsync(p, std::ptr::null_mut()) }, sys::CUresult::CUDA_SUCCESS);
    // SAFETY: as above.
    assert_eq!(unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) }, sys::CUresult::CUDA_SUCCESS);
}

fn ten_thousand_cycles_leak_neither_memory_nor_descriptors() {
    let Some(_gpu) = gpu() else { return };
    let job = job_key("cycles");
    let (b0, b1) = (backend(0, 2, &job), backend(1, 2, &job));
    let (ep0, k0) = (b0.local_endpoint().unwrap(), device_kind(&b0));
    let cycle = || {
        let owned = b0.allocate(64 * 1024, k0).unwrap();
        let payload = b0.export(&owned).unwrap().unwrap();
        let imported = import_from(&b1, 0, &ep0, &payload, 64 * 1024, k0).unwrap();
        drop(imported);
        drop(owned);
    };
    // Warm up (driver pools, lazily loaded symbols), then measure.
    for _ in 0..20 {
        cycle();
    }
    let (free_before, fds_before) = (free_memory(b0.context()), open_fds());
    let started = Instant::now();
    for _ in 0..10_000 {
        cycle();
    }
    let elapsed = started.elapsed();
    let (free_after, fds_after) = (free_memory(b0.context()), open_fds());
    println!(
        "10000 cycles in {elapsed:?}; free device memory {free_before} -> {free_after}; open fds {fds_before} -> {fds_after}"
    );
    assert!(free_after + (8 << 20) >= free_before, "device memory shrank by {} bytes", free_before - free_after);
    assert!(fds_after <= fds_before + 2, "file descriptors leaked: {fds_before} -> {fds_after}");
    assert_eq!(import_cache_entries(), 0);
}

fn device_status_and_handle_builders() {
    let Some(_gpu) = gpu() else { return };
    let job = job_key("handles");
    let (b0, b1) = (backend(0, 2, &job), backend(1, 2, &job));
    let (ep0, k0, k1) = (b0.local_endpoint().unwrap(), device_kind(&b0), device_kind(&b1));

    let status = b1.device_status().unwrap();
    let h = status.handle(Duration::from_secs(1));
    assert!(h.error != 0 && h.abort == h.error + 64);
    assert!(h.timeout_cycles >= 100_000_000, "{} cycles for 1 s at {} kHz", h.timeout_cycles, status.clock_khz());
    assert_eq!(status.handle(Duration::MAX).timeout_cycles, u64::MAX);
    assert_eq!(status.error(), None);
    // The GPU writes the error word; the host sees it without synchronizing with a kernel.
    bind(b1.context());
    // SAFETY: h.error is the device address of a mapped pinned word; legacy stream.
    let r = unsafe { sys::cuStreamWriteValue32_v2(std::ptr::null_mut(), h.error, 1, 0) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    // SAFETY: synchronizes the legacy stream of the bound context.
    assert_eq!(unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) }, sys::CUresult::CUDA_SUCCESS);
    assert_eq!(status.error(), Some(DeviceError::SemaphoreTimeout));
    status.abort();
    assert!(status.is_aborted());
    status.clear();
    assert_eq!((status.error(), status.is_aborted()), (None, false));

    // Rank 1's view: its own tokens and buffers, rank 0's imported.
    let import = |len: usize| {
        let owned = b0.allocate(len, k0).unwrap();
        let payload = b0.export(&owned).unwrap().unwrap();
        let imported = import_from(&b1, 0, &ep0, &payload, len, k0).unwrap();
        (registered(owned, 0, true, k0), registered(imported, 0, false, k0))
    };
    let (_owner_tokens, remote_tokens) = import(4096);
    let (_owner_buf, remote_buf) = import(1 << 20);
    let tokens = registered(b1.allocate(4096, k1).unwrap(), 1, true, k1);
    let buf = registered(b1.allocate(1 << 20, k1).unwrap(), 1, true, k1);

    let sem = device_semaphore((&tokens, 0), (&remote_tokens, 64), (&tokens, 8)).unwrap();
    assert_eq!(
        (sem.inbound, sem.remote_inbound, sem.expected_inbound),
        (ptr_of(&tokens), ptr_of(&remote_tokens) + 64, ptr_of(&tokens) + 8)
    );
    // (inbound, remote inbound, expected): misaligned, out of range, a local "remote", an
    // imported inbound, and inbound and expected on one word.
    let refused = [
        ((&tokens, 4), (&remote_tokens, 0), (&tokens, 8)),
        ((&tokens, 0), (&remote_tokens, 4092), (&tokens, 8)),
        ((&tokens, 0), (&tokens, 16), (&tokens, 8)),
        ((&remote_tokens, 0), (&remote_tokens, 16), (&tokens, 8)),
        ((&tokens, 0), (&remote_tokens, 0), (&tokens, 0)),
    ];
    for (i, (inbound, remote_inbound, expected)) in refused.into_iter().enumerate() {
        let r = device_semaphore(inbound, remote_inbound, expected);
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "case {i}: {r:?}");
    }

    let ch = memory_channel_handle(sem, (&remote_buf, 4096), (&buf, 0), None).unwrap();
    assert_eq!((ch.dst, ch.src, ch.remote_packets, ch.local_packets), (ptr_of(&remote_buf) + 4096, ptr_of(&buf), 0, 0));
    let packets = PacketBuffers { remote: (&remote_buf, 1 << 19), local: (&buf, 1 << 19) };
    let ch = memory_channel_handle(sem, (&remote_buf, 0), (&buf, 0), Some(packets)).unwrap();
    assert_eq!((ch.remote_packets, ch.local_packets), (ptr_of(&remote_buf) + (1 << 19), ptr_of(&buf) + (1 << 19)));
    let misaligned = PacketBuffers { remote: (&remote_buf, 8), local: (&buf, 0) };
    assert!(matches!(
        memory_channel_handle(sem, (&remote_buf, 0), (&buf, 0), Some(misaligned)),
        Err(Error::InvalidArgument(_))
    ));
    let swapped = PacketBuffers { remote: (&buf, 0), local: (&remote_buf, 0) };
    assert!(matches!(
        memory_channel_handle(sem, (&remote_buf, 0), (&buf, 0), Some(swapped)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(memory_channel_handle(sem, (&buf, 0), (&remote_buf, 0), None), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        memory_channel_handle(sem, (&remote_buf, (1 << 20) + 1), (&buf, 0), None),
        Err(Error::InvalidArgument(_))
    ));
    let host = registered(Arc::new(HeapRegion::new(4096).unwrap()), 1, true, MemoryKind::Host);
    assert!(matches!(memory_channel_handle(sem, (&remote_buf, 0), (&host, 0), None), Err(Error::InvalidArgument(_))));
}

// ---------------------------------------------------------------------------------------------
// Cross-process tests: the parent re-runs this binary, filtered to one test, as the other rank.

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, lines.join("\n")).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn wait_for_lines(path: &Path, timeout: Duration) -> Vec<String> {
    let started = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return s.lines().map(str::to_string).collect();
        }
        assert!(started.elapsed() < timeout, "no {} after {timeout:?}", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn scratch_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weave-cudaipc-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs test `name` of this binary as a child with `env`; returns it running.
fn spawn_child(name: &str, env: &[(&str, String)]) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn wait_child(mut child: std::process::Child, timeout: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child rank did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn cross_process_import_of_both_export_kinds() {
    const NAME: &str = "cross_process_import_of_both_export_kinds";
    let len = 256 * 1024;
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        // Rank 1, in its own process.
        let dir = PathBuf::from(dir);
        let lines = wait_for_lines(&dir.join("owner"), TIMEOUT);
        let (job, ep0, vmm, legacy) = (&lines[0], unhex(&lines[1]), unhex(&lines[2]), unhex(&lines[3]));
        let b1 = backend(1, 2, job);
        let k1 = device_kind(&b1);
        let k0 = MemoryKind::Device(lines[4].parse().unwrap());
        let conn = b1.connect(0, &ep0).unwrap();
        let src = registered(b1.allocate(len, k1).unwrap(), 1, true, k1);
        for (payload, seed) in [(&vmm, 1u8), (&legacy, 2u8)] {
            let imported = registered(import_from(&b1, 0, &ep0, payload, len, k0).unwrap(), 0, false, k0);
            assert!(read_device(b1.context(), ptr_of(&imported), len) == pattern(len, seed), "child reads seed {seed}");
            write_device(b1.context(), ptr_of(&src), &pattern(len, seed + 10));
            conn.write(&imported, 0, &src, 0, len).unwrap();
            conn.update_and_sync(&imported, len - 8, 0x5eed_0000 + u64::from(seed)).unwrap();
            conn.flush().unwrap();
        }
        return;
    }
    let Some(_gpu) = gpu() else { return };
    let job = job_key("xproc");
    let dir = scratch_dir("xproc");
    let b0 = backend(0, 2, &job);
    let k0 = device_kind(&b0);
    let vmm = b0.allocate(len, k0).unwrap();
    write_device(b0.context(), vmm.as_ptr() as u64, &pattern(len, 1));
    bind(b0.context());
    let mut base: u64 = 0;
    // SAFETY: writes one device address.
    assert_eq!(unsafe { sys::cuMemAlloc_v2(&mut base, len + 4096) }, sys::CUresult::CUDA_SUCCESS);
    let user = b0.register_device_memory(base + 4096, len).unwrap();
    write_device(b0.context(), base + 4096, &pattern(len, 2));
    let lines = [
        job.clone(),
        hex(&b0.local_endpoint().unwrap()),
        hex(&b0.export(&vmm).unwrap().unwrap()),
        hex(&b0.export(&user).unwrap().unwrap()),
        b0.device_ordinal().to_string(),
    ];
    let child = spawn_child(NAME, &[(CHILD_ENV, dir.display().to_string())]);
    write_lines(&dir.join("owner"), &lines);
    let status = wait_child(child, Duration::from_secs(120));
    assert!(status.success(), "child rank failed: {status}");
    for (ptr, seed) in [(vmm.as_ptr() as u64, 1u8), (base + 4096, 2u8)] {
        let mut want = pattern(len, seed + 10);
        want[len - 8..].copy_from_slice(&(0x5eed_0000 + u64::from(seed)).to_le_bytes());
        assert!(read_device(b0.context(), ptr, len) == want, "owner sees the child's writes (seed {seed})");
    }
    drop((user, vmm));
    bind(b0.context());
    // SAFETY: `base` came from cuMemAlloc and nothing uses it any more.
    assert_eq!(unsafe { sys::cuMemFree_v2(base) }, sys::CUresult::CUDA_SUCCESS);
    let _ = std::fs::remove_dir_all(&dir);
}

fn a_dead_owner_is_peer_lost_for_imports_and_connections() {
    const NAME: &str = "a_dead_owner_is_peer_lost_for_imports_and_connections";
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        // Rank 0, in its own process: allocate, publish, exit (its memory and socket go with it).
        let dir = PathBuf::from(dir);
        let job = std::env::var("WEAVE_CUDAIPC_JOB").unwrap();
        let b0 = backend(0, 2, &job);
        let owned = b0.allocate(4096, device_kind(&b0)).unwrap();
        let lines = [
            hex(&b0.local_endpoint().unwrap()),
            hex(&b0.export(&owned).unwrap().unwrap()),
            b0.device_ordinal().to_string(),
        ];
        write_lines(&dir.join("owner"), &lines);
        return;
    }
    let Some(_gpu) = gpu() else { return };
    let job = job_key("dead");
    let dir = scratch_dir("dead");
    let child = spawn_child(NAME, &[(CHILD_ENV, dir.display().to_string()), ("WEAVE_CUDAIPC_JOB", job.clone())]);
    let status = wait_child(child, Duration::from_secs(120));
    assert!(status.success(), "child rank failed: {status}");
    let lines = wait_for_lines(&dir.join("owner"), TIMEOUT);
    let (ep0, payload, k0) = (unhex(&lines[0]), unhex(&lines[1]), MemoryKind::Device(lines[2].parse().unwrap()));
    let b1 = backend(1, 2, &job);
    let started = Instant::now();
    let r = import_from(&b1, 0, &ep0, &payload, 4096, k0);
    assert!(matches!(r, Err(Error::PeerLost { peer: 0, .. })), "{:?}", r.err());
    let conn = b1.connect(0, &ep0).unwrap();
    assert!(matches!(conn.check_peer(), Err(Error::PeerLost { peer: 0, .. })));
    assert!(matches!(conn.flush(), Err(Error::PeerLost { peer: 0, .. })));
    assert!(started.elapsed() < Duration::from_secs(5), "noticed in {:?}", started.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}

const PROBE_KERNEL: &str = r#"
extern "C" __global__ void weave_probe(unsigned long long dst, unsigned int n,
                                       unsigned long long remote_token, unsigned long long status_error) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ((unsigned int*)dst)[i] = i * 3u + 1u;
    if (i == 0) {
        atomicAdd((unsigned long long*)remote_token, 1ULL);
        *(volatile unsigned int*)status_error = 5u;
    }
}
"#;

fn a_kernel_stores_into_imported_memory_through_the_handles() {
    let Some(_gpu) = gpu() else { return };
    // SAFETY: only probes for the library, calls nothing in it.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        println!("SKIPPED: no NVRTC library to compile the probe kernel");
        return;
    }
    let job = job_key("kernel");
    let (b0, b1) = (backend(0, 2, &job), backend(1, 2, &job));
    let (ep0, k0, k1) = (b0.local_endpoint().unwrap(), device_kind(&b0), device_kind(&b1));
    let n: u32 = 1 << 16;
    let len = n as usize * 4;
    let import = |len: usize| {
        let owned = b0.allocate(len, k0).unwrap();
        let payload = b0.export(&owned).unwrap().unwrap();
        let imported = import_from(&b1, 0, &ep0, &payload, len, k0).unwrap();
        (registered(owned, 0, true, k0), registered(imported, 0, false, k0))
    };
    let (owner_buf, remote_buf) = import(len);
    let (owner_tokens, remote_tokens) = import(4096);
    let tokens = registered(b1.allocate(4096, k1).unwrap(), 1, true, k1);
    let buf = registered(b1.allocate(len, k1).unwrap(), 1, true, k1);
    let sem = device_semaphore((&tokens, 0), (&remote_tokens, 64), (&tokens, 8)).unwrap();
    let ch = memory_channel_handle(sem, (&remote_buf, 0), (&buf, 0), None).unwrap();
    let status = b1.device_status().unwrap();
    let sh = status.handle(Duration::from_secs(5));

    let ptx = cudarc::nvrtc::compile_ptx(PROBE_KERNEL).expect("NVRTC compiles the probe");
    let ctx = b1.context().clone();
    let module = ctx.load_module(ptx).unwrap();
    let f = module.load_function("weave_probe").unwrap();
    let stream = ctx.default_stream();
    let mut launch = stream.launch_builder(&f);
    launch.arg(&ch.dst).arg(&n).arg(&ch.semaphore.remote_inbound).arg(&sh.error);
    // SAFETY: the kernel writes n u32s at dst (len bytes mapped for this device), one u64 at the
    // remote token (8-byte aligned, mapped here) and one u32 at the host-mapped status word.
    unsafe { launch.launch(cudarc::driver::LaunchConfig::for_num_elems(n)) }.unwrap();
    stream.synchronize().unwrap();

    let got = read_device(b0.context(), ptr_of(&owner_buf), len);
    let want: Vec<u8> = (0..n).flat_map(|i| (i * 3 + 1).to_le_bytes()).collect();
    assert!(got == want, "rank 0 sees the kernel's stores");
    let token = read_device(b0.context(), ptr_of(&owner_tokens) + 64, 8);
    assert_eq!(u64::from_le_bytes(token.try_into().unwrap()), 1, "rank 0's inbound token was signalled");
    assert_eq!(status.error(), Some(DeviceError::BadArgument));
    println!("kernel on device {} stored into device {}'s memory", b1.device_ordinal(), b0.device_ordinal());
}

/// Every test, by name.
const TESTS: &[(&str, fn())] = &[
    (
        "open_reports_devices_and_refuses_duplicates_and_bad_ordinals",
        open_reports_devices_and_refuses_duplicates_and_bad_ordinals,
    ),
    ("vmm_allocate_export_import_write_and_read_back", vmm_allocate_export_import_write_and_read_back),
    ("legacy_ipc_path_on_a_cumemalloc_buffer", legacy_ipc_path_on_a_cumemalloc_buffer),
    ("pool_memory_is_unsupported", pool_memory_is_unsupported),
    (
        "ten_thousand_cycles_leak_neither_memory_nor_descriptors",
        ten_thousand_cycles_leak_neither_memory_nor_descriptors,
    ),
    ("device_status_and_handle_builders", device_status_and_handle_builders),
    ("cross_process_import_of_both_export_kinds", cross_process_import_of_both_export_kinds),
    ("a_dead_owner_is_peer_lost_for_imports_and_connections", a_dead_owner_is_peer_lost_for_imports_and_connections),
    (
        "a_kernel_stores_into_imported_memory_through_the_handles",
        a_kernel_stores_into_imported_memory_through_the_handles,
    ),
];

/// A custom harness (`harness = false`): without a CUDA driver and device every test is
/// reported SKIPPED and the summary says 0 passed — a GPU test never counts as passed on a
/// machine without a GPU. A name argument runs the tests whose names contain it (the
/// cross-process tests re-run this binary with their own name and `--exact`).
fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let exact = args.iter().any(|a| a == "--exact");
    let filter = args.iter().find(|a| !a.starts_with('-')).cloned();
    let selected: Vec<_> = TESTS
        .iter()
        .filter(|(n, _)| match &filter {
            Some(f) if exact => n == f,
            Some(f) => n.contains(f.as_str()),
            None => true,
        })
        .collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _) in &selected {
            println!("{name}: test");
        }
        return std::process::ExitCode::SUCCESS;
    }
    if !driver_available() || device_count().unwrap_or(0) == 0 {
        let names = selected.iter().map(|(name, _)| *name);
        return comm_core::testing::report_skipped(names, "transport-cudaipc GPU", "no CUDA driver/device");
    }
    comm_core::testing::run_named_tests(selected, 0, |test| test())
}
