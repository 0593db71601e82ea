//! Runs every test kernel of `cuda/primitives_test.cu` on device 0 and checks the results.
//!
//! A custom harness (`harness = false`), so a machine without a GPU reports the tests as
//! skipped instead of passed: it prints `SKIPPED: no CUDA device (...)` and the summary
//! `gpu_primitives: 0 passed, 0 failed, N skipped`. Where a device exists, NVRTC must be found
//! too (a GPU host without it fails rather than skips). Tests run one after another on one
//! context; arguments: an optional name filter (substring); libtest flags such as
//! `--test-threads=1` are accepted and ignored; `--list` lists the tests.

use std::process::ExitCode;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use comm_core::device::{DeviceError, DeviceSemaphoreHandle, DeviceStatusHandle, MemoryChannelDeviceHandle};
use comm_core::fifo::{FifoDeviceHandle, FifoSlot, FifoStorage, Trigger, TriggerFields, TriggerFifo, TriggerType};
use comm_core::port_channel::PortChannelDeviceHandle;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg, result, sys};
use kernels::compile::{Compiler, nvrtc_available};
use kernels::source::PRIMITIVES_TEST;
use kernels::{KernelArg, KernelModule};

/// Spin budget for waits that must succeed (about a second or more on any GPU).
const LONG_CYCLES: u64 = 4_000_000_000;
/// Spin budget for waits that must give up (about a millisecond).
const SHORT_CYCLES: u64 = 2_000_000;

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: Arc<KernelModule>,
}

/// Device 0 with the test kernels loaded; `Err(reason)` when there is no GPU to test on.
fn gpu() -> Result<Gpu, String> {
    // SAFETY: only tries to dlopen the driver library; no symbol is called.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library".into());
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => return Err("the driver reports 0 devices".into()),
        Err(e) => return Err(format!("cuInit/cuDeviceGetCount: {e}")),
    }
    assert!(nvrtc_available(), "a CUDA device is present but NVRTC is not: put libnvrtc on LD_LIBRARY_PATH");
    let ctx = CudaContext::new(0).expect("context on device 0");
    let stream = ctx.default_stream();
    let module = KernelModule::compile_and_load(&ctx, &Compiler::from_env(), PRIMITIVES_TEST)
        .unwrap_or_else(|e| panic!("compiling/loading the test kernels: {e}"));
    Ok(Gpu { ctx, stream, module })
}

macro_rules! launch {
    ($gpu:expr, $name:expr, ($grid:expr, $block:expr), $($arg:expr),* $(,)?) => {{
        let f = $gpu.module.function($name).expect("kernel function");
        let mut builder = $gpu.stream.launch_builder(&f);
        $( builder.arg($arg); )*
        let cfg = LaunchConfig { grid_dim: ($grid, 1, 1), block_dim: ($block, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match the kernel's parameters in primitives_test.cu, and every
        // address passed points into an allocation this test keeps alive until it synchronizes.
        unsafe { builder.launch(cfg) }.expect("kernel launch");
    }};
}

impl Gpu {
    fn sync(&self) {
        self.stream.synchronize().expect("stream synchronize (a kernel faulted?)");
    }

    fn zeros(&self, n: usize) -> CudaSlice<u8> {
        self.stream.alloc_zeros::<u8>(n.max(1)).expect("device allocation")
    }

    fn upload(&self, data: &[u8]) -> CudaSlice<u8> {
        let mut d = self.zeros(data.len());
        if !data.is_empty() {
            self.stream.memcpy_htod(data, &mut d).expect("copy to device");
        }
        d
    }

    fn addr(&self, s: &CudaSlice<u8>) -> u64 {
        s.device_ptr(&self.stream).0
    }

    fn download(&self, s: &CudaSlice<u8>) -> Vec<u8> {
        self.stream.clone_dtoh(s).expect("copy to host")
    }

    fn u64s(&self, s: &CudaSlice<u8>) -> Vec<u64> {
        self.download(s).chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect()
    }

    fn pinned(&self, len: usize) -> Pinned {
        Pinned::new(&self.ctx, len)
    }
}

/// Pinned host memory mapped for the device, zeroed; freed on drop.
struct Pinned {
    ctx: Arc<CudaContext>,
    host: NonNull<u8>,
    device: u64,
    len: usize,
}

// SAFETY: the allocation is plain memory owned by this value; all shared access in these tests
// goes through atomics.
unsafe impl Send for Pinned {}
// SAFETY: as for Send.
unsafe impl Sync for Pinned {}

impl Pinned {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Pinned {
        ctx.bind_to_thread().expect("bind context");
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a plain allocation call; the result is checked below.
        let raw = unsafe { result::malloc_host(len, flags) }.expect("cuMemHostAlloc");
        let host = NonNull::new(raw.cast::<u8>()).expect("non-null pinned allocation");
        // SAFETY: `host` points to `len` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(host.as_ptr(), 0, len) };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` was allocated with DEVICEMAP in the current context; `device` is
        // valid for writes.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, raw, 0) }.result().expect("device pointer");
        Pinned { ctx: ctx.clone(), host, device, len }
    }

    fn device(&self, offset: usize) -> u64 {
        assert!(offset < self.len);
        self.device + offset as u64
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= self.len);
        // SAFETY: in bounds, aligned, and only accessed atomically (here and by kernels).
        unsafe { &*self.host.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: as for u32_at.
        unsafe { &*self.host.as_ptr().add(offset).cast::<AtomicU64>() }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_host, freed once; no kernel uses it any more (tests
        // synchronize before dropping).
        let _ = unsafe { result::free_host(self.host.as_ptr().cast()) };
    }
}

/// Error and abort words in pinned memory, and a status handle over them.
struct Status {
    words: Pinned,
}

impl Status {
    fn new(gpu: &Gpu) -> Status {
        Status { words: gpu.pinned(64) }
    }

    fn handle(&self, timeout_cycles: u64) -> KernelArg<DeviceStatusHandle> {
        KernelArg(DeviceStatusHandle {
            error: self.words.device(0),
            abort: self.words.device(8),
            timeout_cycles,
            ..DeviceStatusHandle::default()
        })
    }

    fn error(&self) -> u32 {
        self.words.u32_at(0).load(Ordering::Acquire)
    }

    fn reset(&self) {
        self.words.u32_at(0).store(0, Ordering::Release);
        self.words.u32_at(8).store(0, Ordering::Release);
    }

    fn abort(&self) {
        self.words.u32_at(8).store(1, Ordering::Release);
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8).collect()
}

fn copy_handles_any_size_and_alignment(gpu: &Gpu) {
    const N: usize = 8192;
    let src_data = pattern(N, 7);
    let src = gpu.upload(&src_data);
    let cases = [
        (0, 0, 0),
        (0, 0, 1),
        (1, 0, 17),
        (3, 5, 1000),
        (16, 16, 4096),
        (15, 1, 333),
        (8, 0, 2055),
        (4, 8, 100),
        (2, 6, 77),
        (0, 16, 7000),
        (13, 13, 5),
    ];
    for (dst_off, src_off, len) in cases {
        let dst = gpu.upload(&vec![0xEE; N]);
        let (d, s, n) = (gpu.addr(&dst) + dst_off as u64, gpu.addr(&src) + src_off as u64, len as u64);
        launch!(gpu, "weave_test_copy", (3, 64), &d, &s, &n);
        gpu.sync();
        let out = gpu.download(&dst);
        assert_eq!(&out[dst_off..dst_off + len], &src_data[src_off..src_off + len], "case {dst_off},{src_off},{len}");
        assert!(out[..dst_off].iter().all(|&b| b == 0xEE), "wrote before the range: {dst_off},{src_off},{len}");
        assert!(out[dst_off + len..].iter().all(|&b| b == 0xEE), "wrote past the range: {dst_off},{src_off},{len}");
    }
}

fn memory_channel_put_and_get(gpu: &Gpu) {
    const N: usize = 4096;
    for (use_get, remote_off, local_off, len) in [(0u32, 0, 0, 4096), (0, 3, 1, 1500), (1, 0, 0, 4096), (1, 9, 2, 999)]
    {
        let (remote_data, local_data) = (pattern(N, 1), pattern(N, 2));
        let (remote, local) = (gpu.upload(&remote_data), gpu.upload(&local_data));
        let handle = KernelArg(MemoryChannelDeviceHandle {
            dst: gpu.addr(&remote),
            src: gpu.addr(&local),
            ..MemoryChannelDeviceHandle::default()
        });
        let (r, l, n) = (remote_off as u64, local_off as u64, (len - remote_off.max(local_off)) as u64);
        launch!(gpu, "weave_test_channel_copy", (2, 128), &handle, &r, &l, &n, &use_get);
        gpu.sync();
        let n = n as usize;
        let (remote_out, local_out) = (gpu.download(&remote), gpu.download(&local));
        if use_get == 0 {
            assert_eq!(&remote_out[remote_off..remote_off + n], &local_data[local_off..local_off + n]);
            assert_eq!(local_out, local_data, "put leaves the source alone");
        } else {
            assert_eq!(&local_out[local_off..local_off + n], &remote_data[remote_off..remote_off + n]);
            assert_eq!(remote_out, remote_data, "get leaves the remote alone");
        }
    }
}

fn packets_round_trip(gpu: &Gpu, kernel: &str, packet_size: usize, payload: usize) {
    let status = Status::new(gpu);
    const N: usize = 5000;
    let input = gpu.upload(&pattern(N + 8, 3));
    let input_data = gpu.download(&input);
    let packets = gpu.zeros((N / payload + 2) * packet_size);
    let result = gpu.zeros(8);
    for (case, (in_off, out_off, len)) in
        [(0usize, 0usize, 0usize), (0, 0, 1), (0, 0, 7), (0, 0, 8), (1, 3, 9), (2, 0, 100), (0, 5, 1001), (3, 1, 4099)]
            .into_iter()
            .enumerate()
    {
        let output = gpu.upload(&vec![0xEE; N + 8]);
        let flag = case as u32 + 1; // new, non-zero flag for every use of the packet buffer
        let (o, i, n) = (gpu.addr(&output) + out_off as u64, gpu.addr(&input) + in_off as u64, len as u64);
        let (p, r, st) = (gpu.addr(&packets), gpu.addr(&result), status.handle(LONG_CYCLES));
        launch!(gpu, kernel, (2, 128), &o, &i, &n, &p, &flag, &st, &r);
        gpu.sync();
        assert_eq!(gpu.u64s(&result)[0], 0, "{kernel} case {case}: a receiving thread gave up");
        assert_eq!(status.error(), 0, "{kernel} case {case}: error word");
        let out = gpu.download(&output);
        assert_eq!(&out[out_off..out_off + len], &input_data[in_off..in_off + len], "{kernel} case {case}");
        assert!(out[..out_off].iter().chain(&out[out_off + len..]).all(|&b| b == 0xEE), "{kernel} case {case}");
    }
}

fn ll16_packets_round_trip_between_blocks(gpu: &Gpu) {
    packets_round_trip(gpu, "weave_test_ll16", 16, 8);
}

fn ll8_packets_round_trip_between_blocks(gpu: &Gpu) {
    packets_round_trip(gpu, "weave_test_ll8", 8, 4);
}

fn memory_channel_packets_round_trip(gpu: &Gpu) {
    let status = Status::new(gpu);
    let len = 1234usize;
    let dst_offset = 2048usize;
    let data = pattern(len, 9);
    let mut buffer = data.clone();
    buffer.resize(4096, 0xEE);
    let local = gpu.upload(&buffer);
    let packets = gpu.zeros(len.div_ceil(8) * 16);
    let result = gpu.zeros(8);
    let handle = KernelArg(MemoryChannelDeviceHandle {
        src: gpu.addr(&local),
        remote_packets: gpu.addr(&packets),
        local_packets: gpu.addr(&packets),
        ..MemoryChannelDeviceHandle::default()
    });
    let (d, n, flag, st, r) = (dst_offset as u64, len as u64, 42u32, status.handle(LONG_CYCLES), gpu.addr(&result));
    launch!(gpu, "weave_test_channel_packets", (2, 256), &handle, &d, &n, &flag, &st, &r);
    gpu.sync();
    assert_eq!(gpu.u64s(&result)[0], 0);
    assert_eq!(status.error(), 0);
    assert_eq!(&gpu.download(&local)[dst_offset..dst_offset + len], &data[..]);
}

fn semaphore_ping_pong_between_blocks(gpu: &Gpu) {
    let status = Status::new(gpu);
    let counters = gpu.zeros(4 * 8); // in0, in1, exp0, exp1
    let c = gpu.addr(&counters);
    let a = KernelArg(DeviceSemaphoreHandle { inbound: c, remote_inbound: c + 8, expected_inbound: c + 16 });
    let b = KernelArg(DeviceSemaphoreHandle { inbound: c + 8, remote_inbound: c, expected_inbound: c + 24 });
    let data = gpu.zeros(16);
    let result = gpu.zeros(16);
    let rounds = 1000u32;
    for launch_no in 1..=2u64 {
        let (d, st, r) = (gpu.addr(&data), status.handle(LONG_CYCLES), gpu.addr(&result));
        launch!(gpu, "weave_test_semaphore", (2, 32), &a, &b, &d, &rounds, &st, &r);
        gpu.sync();
        assert_eq!(gpu.u64s(&result), [0, 0], "mismatches, failed waits (launch {launch_no})");
        assert_eq!(status.error(), 0);
        // Counters are monotonic and persist across launches.
        let n = u64::from(rounds) * launch_no;
        assert_eq!(gpu.u64s(&counters), [n, n, n, n], "launch {launch_no}");
    }
    // poll: nothing pending, then one signal consumed exactly once.
    let sem = gpu.zeros(16);
    let s = gpu.addr(&sem);
    let self_loop = KernelArg(DeviceSemaphoreHandle { inbound: s, remote_inbound: s, expected_inbound: s + 8 });
    let out = gpu.zeros(24);
    let o = gpu.addr(&out);
    launch!(gpu, "weave_test_semaphore_poll", (1, 1), &self_loop, &o);
    gpu.sync();
    assert_eq!(gpu.u64s(&out), [0, 1, 0]);
    assert_eq!(gpu.u64s(&sem), [1, 1]);
}

fn waits_give_up_and_report_the_error(gpu: &Gpu) {
    let status = Status::new(gpu);
    let sem_words = gpu.zeros(24);
    let s = gpu.addr(&sem_words);
    let sem = KernelArg(DeviceSemaphoreHandle { inbound: s, remote_inbound: s + 8, expected_inbound: s + 16 });
    let packets = gpu.zeros(64);
    let result = gpu.zeros(8);
    let (p, r) = (gpu.addr(&packets), gpu.addr(&result));
    for (kind, code) in
        [(0u32, DeviceError::SemaphoreTimeout), (1, DeviceError::PacketTimeout), (2, DeviceError::PacketTimeout)]
    {
        status.reset();
        let st = status.handle(SHORT_CYCLES);
        let start = Instant::now();
        launch!(gpu, "weave_test_timeout", (1, 32), &kind, &sem, &p, &st, &r);
        gpu.sync();
        assert_eq!(gpu.u64s(&result)[0], 1, "kind {kind}: the wait returned true");
        assert_eq!(status.error(), code as u32, "kind {kind}");
        assert!(start.elapsed() < Duration::from_secs(5), "kind {kind} took {:?}", start.elapsed());
    }
    // The host's abort word stops a long wait early.
    status.reset();
    status.abort();
    let (kind, st) = (0u32, status.handle(LONG_CYCLES * 100));
    let start = Instant::now();
    launch!(gpu, "weave_test_timeout", (1, 32), &kind, &sem, &p, &st, &r);
    gpu.sync();
    assert_eq!(gpu.u64s(&result)[0], 1);
    assert_eq!(status.error(), DeviceError::Aborted as u32);
    assert!(start.elapsed() < Duration::from_secs(5), "abort took {:?}", start.elapsed());
}

/// A trigger FIFO in pinned, device-mapped memory: slots, then head and tail on their own lines.
struct PinnedFifo {
    mem: Pinned,
    capacity: u32,
}

impl PinnedFifo {
    fn new(gpu: &Gpu, capacity: u32) -> PinnedFifo {
        PinnedFifo { mem: gpu.pinned(capacity as usize * 16 + 128), capacity }
    }
}

// SAFETY: the slots (16-byte aligned: the allocation is page-aligned) and the two counters lie
// in one allocation owned by this value, zeroed at creation, never overlapping, and the
// pointers never change; kernels touch them only atomically, following the FIFO protocol.
unsafe impl FifoStorage for PinnedFifo {
    fn capacity(&self) -> u32 {
        self.capacity
    }
    fn slots(&self) -> NonNull<FifoSlot> {
        self.mem.host.cast::<FifoSlot>()
    }
    fn head(&self) -> NonNull<AtomicU64> {
        NonNull::from(self.mem.u64_at(self.capacity as usize * 16))
    }
    fn tail(&self) -> NonNull<AtomicU64> {
        NonNull::from(self.mem.u64_at(self.capacity as usize * 16 + 64))
    }
    fn device_address(&self, host: *const u8) -> u64 {
        self.mem.device + (host as u64 - self.mem.host.as_ptr() as u64)
    }
}

fn fields(kind: TriggerType, size: u64, src: (u32, u64), dst: (u32, u64), sem: u32) -> TriggerFields {
    TriggerFields::new(kind, size, src, dst, sem)
}

/// Polls `fifo` until `want` triggers were popped (or the deadline: then aborts the kernel).
fn consume(fifo: &TriggerFifo, want: usize, status: &Status) -> Vec<Trigger> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    while got.len() < want {
        if Instant::now() > deadline {
            status.abort();
            panic!("only {} of {want} triggers arrived", got.len());
        }
        match fifo.poll() {
            Some(t) => {
                got.push(t);
                assert!(fifo.pop());
            }
            None => std::hint::spin_loop(),
        }
    }
    got
}

fn device_pushes_decode_on_the_host(gpu: &Gpu) {
    let status = Status::new(gpu);
    let fifo = TriggerFifo::with_storage(Box::new(PinnedFifo::new(gpu, 8))).expect("fifo over pinned memory");
    let count = 64u32; // 8 laps of an 8-slot ring: producers wait for room
    let seqs = gpu.zeros(count as usize * 8);
    let (handle, st, s) = (KernelArg(fifo.device_handle()), status.handle(LONG_CYCLES), gpu.addr(&seqs));
    launch!(gpu, "weave_test_fifo_push", (2, 32), &handle, &count, &st, &s);
    let popped = consume(&fifo, count as usize, &status);
    gpu.sync();
    assert_eq!(status.error(), 0);
    assert!(fifo.poll().is_none());
    let seqs = gpu.u64s(&seqs);
    let mut seen = vec![false; count as usize];
    for (i, &seq) in seqs.iter().enumerate() {
        assert!(seq < u64::from(count), "thread {i}: push failed or bad sequence {seq}");
        assert!(!std::mem::replace(&mut seen[seq as usize], true), "sequence {seq} twice");
        let i = i as u64;
        let want = Trigger::new(fields(TriggerType::DATA, i, (1, 16 * i), (2, 32 * i), 3)).unwrap();
        assert_eq!(popped[seq as usize], want, "thread {i}'s trigger at sequence {seq}");
    }
    assert_eq!((fifo.head(), fifo.tail()), (u64::from(count), u64::from(count)));
}

fn device_trigger_encoding_matches_comm_core(gpu: &Gpu) {
    let status = Status::new(gpu);
    let max_size = comm_core::fifo::MAX_TRIGGER_SIZE;
    let max_off = comm_core::fifo::MAX_TRIGGER_OFFSET;
    let max_id = comm_core::fifo::MAX_MEMORIES as u32 - 1;
    let max_sem = comm_core::fifo::MAX_SEMAPHORES as u32 - 1;
    let good = [
        fields(TriggerType::DATA, 0, (0, 0), (0, 0), 0),
        fields(TriggerType::all(), max_size, (max_id, max_off), (max_id, max_off), max_sem),
        fields(TriggerType::DATA | TriggerType::FLAG, 0x1234_5678, (0x155, 0x9abc_def0), (0xaa, 0x0fed_cba9), 0x2aa),
        fields(TriggerType::SYNC, 1, (1, 1), (1, 1), 1),
    ];
    // (type bits, size, src id, src offset, dst id, dst offset, semaphore) that do not fit.
    let bad: [[u64; 7]; 6] = [
        [0, 1, 0, 0, 0, 0, 0],
        [8, 1, 0, 0, 0, 0, 0],
        [1, max_size + 1, 0, 0, 0, 0, 0],
        [1, 0, 0, max_off + 1, 0, 0, 0],
        [1, 0, 0, 0, u64::from(max_id) + 1, 0, 0],
        [1, 0, 0, 0, 0, 0, u64::from(max_sem) + 1],
    ];
    let mut input: Vec<u64> = Vec::new();
    for f in &good {
        input.extend([
            u64::from(f.kind.bits()),
            f.size,
            u64::from(f.src_memory.0),
            f.src_offset,
            u64::from(f.dst_memory.0),
            f.dst_offset,
            u64::from(f.semaphore.0),
        ]);
    }
    for b in &bad {
        input.extend(b);
    }
    let bytes: Vec<u8> = input.iter().flat_map(|v| v.to_le_bytes()).collect();
    let dev_in = gpu.upload(&bytes);
    let count = (good.len() + bad.len()) as u32;
    let out = gpu.zeros(count as usize * 16);
    let (i, st, o) = (gpu.addr(&dev_in), status.handle(LONG_CYCLES), gpu.addr(&out));
    launch!(gpu, "weave_test_trigger_encode", (1, 32), &i, &count, &st, &o);
    gpu.sync();
    let words = gpu.u64s(&out);
    for (k, f) in good.iter().enumerate() {
        assert_eq!([words[2 * k], words[2 * k + 1]], Trigger::new(*f).unwrap().words(), "sample {k}");
    }
    for k in good.len()..count as usize {
        assert_eq!([words[2 * k], words[2 * k + 1]], [u64::MAX, u64::MAX], "bad sample {k} was encoded");
    }
    assert_eq!(status.error(), DeviceError::BadArgument as u32);
}

fn port_channel_put_signal_flush_and_wait(gpu: &Gpu) {
    let status = Status::new(gpu);
    let fifo = TriggerFifo::with_storage(Box::new(PinnedFifo::new(gpu, 4))).expect("fifo over pinned memory");
    let tokens = gpu.pinned(64); // inbound at 0, expected at 8
    let handle = KernelArg(PortChannelDeviceHandle {
        fifo: fifo.device_handle(),
        inbound_token: tokens.device(0),
        expected_inbound_token: tokens.device(8),
        semaphore_id: 5,
        dst: 7,
        src: 9,
        reserved: 0,
    });
    let result = gpu.zeros(8);
    let (d, s, n, st, r) = (4096u64, 128u64, 1000u64, status.handle(LONG_CYCLES), gpu.addr(&result));
    launch!(gpu, "weave_test_port_channel", (1, 32), &handle, &d, &s, &n, &st, &r);
    let got = consume(&fifo, 2, &status);
    assert_eq!(
        got[0],
        Trigger::new(fields(TriggerType::DATA | TriggerType::FLAG, 1000, (9, 128), (7, 4096), 5)).unwrap()
    );
    assert_eq!(got[1], Trigger::new(fields(TriggerType::SYNC, 0, (9, 0), (7, 0), 5)).unwrap());
    // The kernel's flush returned (the SYNC trigger was popped); now it waits for a signal.
    tokens.u64_at(0).fetch_add(1, Ordering::Release);
    gpu.sync();
    assert_eq!(status.error(), 0);
    assert_eq!(gpu.u64s(&result)[0], 1);
    assert_eq!(tokens.u64_at(8).load(Ordering::Acquire), 1, "expected token bumped once");
}

type Bytes = Vec<u8>;

fn f32_bits(v: f32) -> u32 {
    v.to_bits()
}

fn f16_and_bf16_conversions_and_sums(gpu: &Gpu) {
    // (a, b) -> [f16(a), bf16(a), f16 sum, bf16 sum, f32(f16(a)), f32(bf16(a))]
    let cases: [(f32, f32, [u32; 6]); 5] = [
        (1.5, 2.25, [0x3E00, 0x3FC0, 0x4380, 0x4070, f32_bits(1.5), f32_bits(1.5)]),
        (-2.5, 0.5, [0xC100, 0xC020, 0xC000, 0xC000, f32_bits(-2.5), f32_bits(-2.5)]),
        // 1 + 2^-8: exact in f16; a bf16 tie, rounded to even (down).
        (f32::from_bits(0x3F80_8000), 0.0, [0x3C04, 0x3F80, 0x3C04, 0x3F80, 0x3F80_8000, 0x3F80_0000]),
        // 1 + 3 * 2^-8: a bf16 tie, rounded to even (up).
        (f32::from_bits(0x3F81_8000), 0.0, [0x3C0C, 0x3F82, 0x3C0C, 0x3F82, 0x3F81_8000, 0x3F82_0000]),
        // f16 max + f16 max overflows to +inf; bf16 rounds 65504 up to 65536.
        (65504.0, 65504.0, [0x7BFF, 0x4780, 0x7C00, 0x4800, f32_bits(65504.0), f32_bits(65536.0)]),
    ];
    let input: Vec<u8> = cases.iter().flat_map(|c| [c.0.to_le_bytes(), c.1.to_le_bytes()]).flatten().collect();
    let dev_in = gpu.upload(&input);
    let out = gpu.zeros(cases.len() * 24);
    let (i, n, o) = (gpu.addr(&dev_in), cases.len() as u32, gpu.addr(&out));
    launch!(gpu, "weave_test_dtype", (1, 32), &i, &n, &o);
    gpu.sync();
    let words: Vec<u32> =
        gpu.download(&out).chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    for (k, c) in cases.iter().enumerate() {
        assert_eq!(words[6 * k..6 * k + 6], c.2, "case {k}: ({}, {})", c.0, c.1);
    }

    // 16-byte vector sums.
    let vectors = 4usize;
    let rep = |bytes: &[u8]| -> Vec<u8> { bytes.iter().copied().cycle().take(16 * vectors).collect() };
    let f32s = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let i32s = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    // (kind, a, b, a + b)
    let kinds: [(u32, Bytes, Bytes, Bytes); 5] = [
        (0, rep(&0x3E00u16.to_le_bytes()), rep(&0x4080u16.to_le_bytes()), rep(&0x4380u16.to_le_bytes())),
        (1, rep(&0x3FC0u16.to_le_bytes()), rep(&0x4010u16.to_le_bytes()), rep(&0x4070u16.to_le_bytes())),
        (
            2,
            rep(&f32s(&[1.0, 2.0, -3.5, 1e30])),
            rep(&f32s(&[0.5, 2.0, 1.5, 1e30])),
            rep(&f32s(&[1.5, 4.0, -2.0, 2e30])),
        ),
        (3, rep(&i32s(&[i32::MAX, -1, 5, 0])), rep(&i32s(&[1, -1, -7, 0])), rep(&i32s(&[i32::MIN, -2, -2, 0]))),
        (4, rep(&[250, 1, 2, 3]), rep(&[10, 1, 2, 3]), rep(&[4, 2, 4, 6])),
    ];
    for (kind, a, b, want) in kinds {
        let (da, db, dout) = (gpu.upload(&a), gpu.upload(&b), gpu.zeros(16 * vectors));
        let (pa, pb, po, v) = (gpu.addr(&da), gpu.addr(&db), gpu.addr(&dout), vectors as u32);
        launch!(gpu, "weave_test_reduce_vec", (1, 32), &pa, &pb, &po, &v, &kind);
        gpu.sync();
        assert_eq!(gpu.download(&dout), want, "reduce kind {kind}");
    }
}

fn modules_are_shared_per_context_and_missing_kernels_are_errors(gpu: &Gpu) {
    let again = KernelModule::compile_and_load(&gpu.ctx, &Compiler::from_env(), PRIMITIVES_TEST).unwrap();
    assert!(Arc::ptr_eq(&again, &gpu.module), "same code, same context: one module");
    assert_eq!(
        kernels::device_arch(&gpu.ctx).unwrap(),
        format!("sm_{}{}", gpu.ctx.compute_capability().unwrap().0, gpu.ctx.compute_capability().unwrap().1)
    );
    let e = gpu.module.function("no_such_kernel").unwrap_err();
    assert!(e.to_string().contains("no_such_kernel"), "{e}");
    assert!(gpu.module.function("bad\0name").is_err());
    let _: FifoDeviceHandle = FifoDeviceHandle::default();
}

type TestFn = fn(&Gpu);

/// Every test, in the order they run.
const TESTS: &[(&str, TestFn)] = &[
    ("copy_handles_any_size_and_alignment", copy_handles_any_size_and_alignment),
    ("memory_channel_put_and_get", memory_channel_put_and_get),
    ("ll16_packets_round_trip_between_blocks", ll16_packets_round_trip_between_blocks),
    ("ll8_packets_round_trip_between_blocks", ll8_packets_round_trip_between_blocks),
    ("memory_channel_packets_round_trip", memory_channel_packets_round_trip),
    ("semaphore_ping_pong_between_blocks", semaphore_ping_pong_between_blocks),
    ("waits_give_up_and_report_the_error", waits_give_up_and_report_the_error),
    ("device_pushes_decode_on_the_host", device_pushes_decode_on_the_host),
    ("device_trigger_encoding_matches_comm_core", device_trigger_encoding_matches_comm_core),
    ("port_channel_put_signal_flush_and_wait", port_channel_put_signal_flush_and_wait),
    ("f16_and_bf16_conversions_and_sums", f16_and_bf16_conversions_and_sums),
    (
        "modules_are_shared_per_context_and_missing_kernels_are_errors",
        modules_are_shared_per_context_and_missing_kernels_are_errors,
    ),
];

fn main() -> ExitCode {
    let mut filter = None;
    let mut list = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--list" => list = true,
            a if a.starts_with('-') => {} // libtest flags (--test-threads=1, --nocapture, -q, ...)
            a => filter = Some(a.to_string()),
        }
    }
    let selected: Vec<_> = TESTS.iter().filter(|(n, _)| filter.as_deref().is_none_or(|f| n.contains(f))).collect();
    if list {
        for (name, _) in &selected {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let gpu = match std::panic::catch_unwind(gpu) {
        Ok(Ok(gpu)) => gpu,
        Ok(Err(why)) => {
            for (name, _) in &selected {
                println!("test {name} ... SKIPPED");
            }
            println!("SKIPPED: no CUDA device ({why}): the GPU primitive tests did not run");
            println!("gpu_primitives: 0 passed, 0 failed, {} skipped", selected.len());
            return ExitCode::SUCCESS;
        }
        Err(_) => {
            println!("gpu_primitives: 0 passed, {} failed (setup failed, see above)", selected.len());
            return ExitCode::FAILURE;
        }
    };
    let (mut passed, mut failed) = (0, Vec::new());
    for (name, test) in &selected {
        let start = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(&gpu)));
        let took = start.elapsed();
        match outcome {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({took:.2?})");
            }
            Err(_) => {
                failed.push(*name);
                println!("test {name} ... FAILED ({took:.2?})");
                // A fault leaves the context unusable: later tests would only repeat it.
                if gpu.stream.synchronize().is_err() {
                    println!("the CUDA context is broken after {name}; stopping");
                    break;
                }
            }
        }
    }
    let not_run = selected.len() - passed - failed.len();
    if !failed.is_empty() {
        println!("failures: {}", failed.join(", "));
    }
    println!("gpu_primitives: {passed} passed, {} failed, {not_run} skipped", failed.len());
    if failed.is_empty() && not_run == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
