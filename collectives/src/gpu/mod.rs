//! The GPU path: collectives on device buffers, stream-ordered on the caller's CUDA stream.
//!
//! Each rank owns one device workspace (packets for the one-shot kernel, data slots for the
//! others, epoch flags), allocated through the CUDA IPC transport and mapped by every peer.
//! Each kernel family is compiled once per device architecture with NVRTC (cached on disk), and
//! loaded when the communicator sets it up, so that no call loads code behind calls still queued
//! (with CUDA's lazy loading that can deadlock them: `DirectLauncher::preload` says how): the
//! direct kernels (`kernels::direct`, the full program) with the engine, the channel kernels
//! (`kernels::channel`) that the kernel cache holds with the channel family at its first call;
//! a kernel without either is compiled and loaded at the first call that runs it. A call validates its arguments,
//! checks the device error word of earlier launches, picks the algorithm from the same table as
//! the host path, and launches one kernel through `kernels` (`DirectLauncher`,
//! `launch_with_args`) — no host synchronization, so calls can be captured in a CUDA graph.
//!
//! Two layers of calls: the `*_device_raw` calls take bare device addresses (any CUDA framework;
//! `unsafe`, the caller vouches for the memory), and the typed calls (`all_reduce_device`,
//! `broadcast_device_in_place`, `send_device`, `DeviceGroup`, …) take cudarc buffers, check
//! their lengths against each other and the world size and that they live on this GPU, and keep
//! cudarc's stream ordering of the buffers (`checks.rs` says how).

pub(crate) mod channels;
pub mod config;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::device::DeviceError;
use comm_core::diagnostics;
use comm_core::memory::{MemoryKind, RegisteredMemory};
use comm_core::resilience::Resilience;
use comm_core::{Error, Result};
use cudarc::driver::CudaContext;
use kernels::convert::Converter;
use weave_cuda::DeviceStatus;

use crate::api::window::WindowState;
use crate::device_staging::DeviceStaging;
use crate::select::device::{Grid, KernelPlan, SENDRECV_KERNEL};
use channels::DeviceChannels;
pub use config::GpuConfig;
pub use kernels::direct::{
    BLOCK_THREADS, DirectKernel, DirectLauncher, GPU_ARGS_LAYOUT, GpuCollectiveArgs, MAX_GPU_RANKS, PACKET_MAX_BLOCKS,
    PIPE_MAX_BLOCKS, WorkspaceArea, WorkspaceLayout,
};

/// LL16 packets per (writer, parity) unless `WEAVE_GPU_PACKETS` says otherwise: packet
/// messages up to 512 KiB per peer.
const PACKET_CAPACITY: usize = 64 << 10;
/// Bytes of one data slot pair (two parities of 4 MiB).
const CHUNK_BYTES: usize = 8 << 20;
/// Bytes of one point-to-point mailbox slot.
const MAILBOX_BYTES: usize = 2 << 20;
/// Blocks of a block-pipelined kernel unless `WEAVE_GPU_BLOCKS` says otherwise (128 beat 64
/// on 2 and 4 H200s from 4 MiB on: docs/perf-log/gpu.md, "Tuning notes").
const DEFAULT_PIPE_BLOCKS: u32 = 128;
/// Bytes one pipelined block moves per peer and step, unless `WEAVE_GPU_TILE` says otherwise.
const PIPE_TILE_BYTES: usize = 128 << 10;
/// Most bytes of the block-pipelined kernels' slots (larger worlds get smaller tiles).
const PIPE_MAX_AREA_BYTES: usize = 256 << 20;
/// Bytes of the LL128 line area (both parities, every writer), allocated only where every pair
/// of GPUs is joined by NVLink: on 2 and 4 GPUs the LL128 two-shot all-reduce takes messages up
/// to 3.75 MiB.
const LL128_AREA_BYTES: usize = 16 << 20;
/// Least message bytes per block of a pipelined kernel: smaller messages use fewer blocks.
const PIPE_MIN_BYTES_PER_BLOCK: usize = 32 << 10;

/// Least tiles per block a block-pipelined kernel aims for (`WEAVE_GPU_STEPS`).
const DEFAULT_PIPE_STEPS: u32 = 1;

/// Per-communicator GPU state: the device, its status words and peer watch, and the two kernel
/// families — the direct one (every peer's workspace mapped here, up to 8 GPUs) and the channel
/// one (any number of GPUs, through the proxy; built at its first call).
pub(crate) struct GpuEngine {
    ctx: Arc<CudaContext>,
    pub(crate) device: u32,
    /// This GPU's architecture (`sm_90`): what the channel kernels are compiled for.
    arch_name: String,
    status: Arc<DeviceStatus>,
    /// Aborts the kernels when a peer process dies.
    watch: watch::GpuPeerWatch,
    /// The direct family; `None` when it cannot run here (more than 8 GPUs), on every rank.
    direct: Option<DirectKernels>,
    /// The channel family, once a call used it.
    channels: Option<DeviceChannels>,
    rank: usize,
    timeout: Duration,
    broken: Option<String>,
    /// The communicator's revocation state, whose ledger numbers the calls the kernels report
    /// starting (see [`comm_core::ledger::DeviceProgress`]).
    resilience: Arc<Resilience>,
    /// Staging of the communicator's hierarchical device calls, in GPU memory (`device_staging.rs`),
    /// kept between calls.
    pub(crate) hierarchy_staging: std::cell::RefCell<DeviceStaging>,
    /// The FP8 conversion kernels (`kernels::convert`), loaded at setup where they compile or
    /// are cached, else at the first FP8 reduction.
    converter: Option<Arc<Converter>>,
    /// Whether [`suspend`](Self::suspend) released the workspace (device calls are refused until
    /// [`resume`](Self::resume)).
    suspended: bool,
    /// The communicator's windows (`api/window.rs`), in registration order.
    windows: Vec<Arc<WindowState>>,
    /// Windows registered so far (numbering their labels alike on every rank).
    windows_registered: u64,
}

/// The direct family: one workspace per rank mapped by every peer, in four areas each made when
/// a kernel first needs it, and the collective kernels that load and store peers' workspaces.
pub(crate) struct DirectKernels {
    /// Compiles the program at the first launch and launches its kernels (the executor in
    /// `exec.rs` launches through it).
    pub(crate) launcher: DirectLauncher,
    /// Every rank's mapping of each area made so far, indexed by [`WorkspaceArea::index`].
    areas: [Option<Vec<RegisteredMemory>>; 4],
    /// The GPU the areas are allocated on.
    device: u32,
    layout: WorkspaceLayout,
    max_blocks: u32,
    pipeline_blocks: u32,
    arch: Option<u32>,
    /// Least tiles per block of the pipelined kernels, agreed by every rank (`aux[0]`).
    pipeline_steps: u32,
    /// The pipelined kernels' schedule when forced (`WEAVE_GPU_SCHEDULE`), else `None`.
    overlapped_schedule: Option<bool>,
    /// Every pair of ranks' GPUs is joined by NVLink (so LL128 lines may be used), as every
    /// rank found.
    nvlink: bool,
    rank: usize,
    timeout: Duration,
    status: Arc<DeviceStatus>,
}

impl std::fmt::Debug for GpuEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuEngine")
            .field("rank", &self.rank)
            .field("direct", &self.direct.as_ref().map(|d| d.layout))
            .field("channels", &self.channels)
            .finish_non_exhaustive()
    }
}

/// The FP8 conversion kernels, compiled (once per machine, then found in the kernel cache) and
/// loaded where NVRTC is here, so that an FP8 call loads no code behind calls still queued
/// (see `DirectLauncher::preload`); `None` otherwise, and the first FP8 reduction tries again
/// and says what is missing.
fn preload_converter(ctx: &Arc<CudaContext>, rank: usize) -> Option<Arc<Converter>> {
    if !kernels::compile::nvrtc_available() {
        return None;
    }
    match Converter::load(ctx, &kernels::compile::Compiler::from_env()) {
        Ok(c) => Some(Arc::new(c)),
        Err(e) => {
            tracing::info!(target: diagnostics::KERNELS, rank, "FP8 conversion kernels not loaded at setup: {e}");
            None
        }
    }
}

/// The GPU this rank's device calls run on: the one its transports serve (CUDA IPC's), else
/// the one `gpu` names, else device `rank % count` — `None` with `WEAVE_GPU=off` or without a CUDA driver or device.
fn device_of_this_rank(core: &CoreCommunicator, gpu: &GpuConfig) -> Option<u32> {
    if !gpu.enabled {
        tracing::info!(target: diagnostics::INIT, rank = core.rank(), "GPU collectives off on this rank: WEAVE_GPU=off");
        return None;
    }
    if let Some(d) = core.device() {
        return Some(d);
    }
    if !weave_cuda::driver_available() {
        return None;
    }
    let count = match weave_cuda::device_count() {
        Ok(n) if n > 0 => n,
        Ok(_) => return None,
        Err(e) => {
            tracing::info!(target: diagnostics::INIT, rank = core.rank(), "no CUDA device: {e}");
            return None;
        }
    };
    match gpu.device {
        Some(d) if (d as usize) < count => Some(d),
        Some(d) => {
            tracing::warn!(
                target: diagnostics::INIT,
                rank = core.rank(),
                "GpuConfig names device {d}, but this process sees {count}: GPU collectives off"
            );
            None
        }
        None => u32::try_from(core.rank() % count).ok(),
    }
}

impl GpuEngine {
    /// Collective: builds the GPU state when every rank has a CUDA device, else `None` on every
    /// rank (with the reason logged at info level); the direct kernels only where every rank
    /// can run them (every peer reached through CUDA IPC, at most 8 GPUs) — elsewhere device
    /// calls run the channel family, whose links to GPUs of other nodes go through host memory
    /// the GPU maps. `gpu` holds the tuning knobs.
    /// The kernels report into `resilience`'s ledger how far the GPU got.
    pub(crate) fn new(core: &CoreCommunicator, gpu: &GpuConfig, resilience: &Arc<Resilience>) -> Result<Option<Self>> {
        let world = core.world_size();
        let ordinal = device_of_this_rank(core, gpu);
        // The direct family loads and stores the peers' GPU memory: every peer must be reached
        // by a transport that maps peer device memory into this process (CUDA IPC, in one
        // node; posed nodes split it). Every rank computes the same.
        let kind = MemoryKind::Device(ordinal.unwrap_or(0));
        let mut every_peer = true;
        for p in (0..world).filter(|&p| p != core.rank()) {
            every_peer &= core.pair_maps(p, kind)?;
        }
        // The same device, and so the same primary context, as a transport serving it.
        let device = match ordinal.map(weave_cuda::CudaDevice::open) {
            Some(Ok(d)) => Some(d),
            Some(Err(e)) => {
                tracing::info!(target: diagnostics::INIT, rank = core.rank(), "GPU collectives off on this rank: {e}");
                None
            }
            None => None,
        };
        let all = core.bootstrap().all_gather(&[u8::from(device.is_some())])?;
        if all.iter().any(|v| v.first() != Some(&1)) {
            tracing::info!(target: diagnostics::INIT, rank = core.rank(), "GPU collectives off: not every rank has a CUDA device");
            return Ok(None);
        }
        let device = &device.ok_or_else(|| Error::Unsupported("the GPU of this rank vanished".into()))?;
        let ctx = device.context().clone();
        ctx.bind_to_thread().map_err(|e| Error::Cuda { operation: "bind context".into(), message: e.to_string() })?;
        let arch = kernels::arch::device_arch(&ctx)?;
        let status = Arc::new(device.device_status()?);
        resilience.ledger().watch_device(status.clone());
        let mut peers = Vec::with_capacity(world);
        for p in (0..world).filter(|&p| p != core.rank()) {
            peers.push(core.connection(p)?);
        }
        let watch = watch::GpuPeerWatch::start(peers, status.clone())?;
        let direct = if world <= MAX_GPU_RANKS && every_peer {
            Some(DirectKernels::new(core, gpu, &ctx, device, &arch, &status)?)
        } else {
            let why = if every_peer {
                format!("more than {MAX_GPU_RANKS} GPUs")
            } else {
                "some GPUs are on other nodes, or reached by no transport that maps GPU memory".into()
            };
            tracing::info!(
                target: diagnostics::INIT,
                rank = core.rank(),
                "direct GPU kernels off ({why}): device calls run the channel family"
            );
            None
        };
        let converter = preload_converter(&ctx, core.rank());
        Ok(Some(GpuEngine {
            ctx,
            device: device.ordinal(),
            arch_name: arch,
            status,
            watch,
            direct,
            channels: None,
            rank: core.rank(),
            timeout: core.config().timeout,
            broken: None,
            resilience: resilience.clone(),
            hierarchy_staging: Default::default(),
            converter,
            suspended: false,
            windows: Vec::new(),
            windows_registered: 0,
        }))
    }

    /// The FP8 conversion kernels, loaded now if setup could not (see [`preload_converter`]).
    pub(crate) fn converter(&mut self) -> Result<Arc<Converter>> {
        if let Some(c) = &self.converter {
            return Ok(c.clone());
        }
        let loaded = Converter::load(&self.ctx, &kernels::compile::Compiler::from_env()).map_err(|e| {
            Error::Unsupported(format!(
                "FP8 reductions on device buffers need weave's conversion kernels, which did not load: {e}"
            ))
        })?;
        Ok(self.converter.insert(Arc::new(loaded)).clone())
    }

    /// What the plan needs to know about this communicator's GPUs (agreed by every rank).
    pub(crate) fn caps(&self) -> crate::select::device::GpuCaps {
        match &self.direct {
            Some(d) => d.caps(),
            None => crate::select::device::GpuCaps {
                arch: None,
                packet_capacity: 0,
                nvlink: false,
                ll128_max_bytes: 0,
                forced_schedule: None,
                direct: false,
            },
        }
    }

    /// The CUDA context of this rank's GPU.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Bytes of this rank's GPU memory the engine holds: what [`suspend`](Self::suspend)
    /// releases (the direct kernels' workspace areas, the hierarchical calls' staging), and what
    /// it keeps (the channel family's links, table and scratch).
    pub(crate) fn memory(&self) -> (usize, usize) {
        let direct = self.direct.as_ref().map_or(0, DirectKernels::memory);
        let staging = self.hierarchy_staging.try_borrow().map_or(0, |s| s.memory());
        let channels = self.channels.as_ref().map_or(0, DeviceChannels::memory);
        (direct + staging, channels)
    }

    /// Whether every peer's GPU memory is mapped here (the direct family runs), so windows can be
    /// used in place.
    pub(crate) fn maps_every_peer(&self) -> bool {
        self.direct.is_some()
    }

    /// Windows registered so far on this communicator.
    pub(crate) fn windows_registered(&self) -> u64 {
        self.windows_registered
    }

    /// Keeps a window the ranks just registered.
    pub(crate) fn add_window(&mut self, window: Arc<WindowState>) {
        self.windows.push(window);
        self.windows_registered += 1;
    }

    /// Drops `window`; false when it is not here (deregistered already).
    pub(crate) fn remove_window(&mut self, window: &Arc<WindowState>) -> bool {
        let before = self.windows.len();
        self.windows.retain(|w| !Arc::ptr_eq(w, window));
        self.windows.len() < before
    }

    /// The window in place whose part holds `[address, address + len)`, and the offset there.
    pub(crate) fn window_of(&self, address: u64, len: usize) -> Option<(&WindowState, u64)> {
        self.windows.iter().filter(|w| !w.parts.is_empty()).find_map(|w| w.offset_of(address, len).map(|o| (&**w, o)))
    }

    /// Whether the workspace is released ([`suspend`](Self::suspend)).
    pub(crate) fn is_suspended(&self) -> bool {
        self.suspended
    }

    /// Waits until every kernel and copy this rank's GPU context has queued is done (their waits
    /// are bounded by the communicator's timeout, so this is too).
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize().map_err(|e| Error::Cuda {
            operation: format!("wait for the GPU work of rank {} to finish", self.rank),
            message: e.to_string(),
        })
    }

    /// Releases the direct kernels' workspace areas and the hierarchical staging; device calls
    /// are refused until [`resume`](Self::resume). The caller waited for this rank's GPU work and
    /// agreed with every peer, so no kernel of any rank still uses the areas.
    pub(crate) fn suspend(&mut self) {
        if let Some(d) = self.direct.as_mut() {
            d.release_areas();
        }
        self.hierarchy_staging = Default::default();
        self.suspended = true;
    }

    /// Collective: ends a [`suspend`](Self::suspend): makes the control area again where there
    /// are peers (the other areas come with the first calls that need them, as after creation).
    pub(crate) fn resume(&mut self, core: &CoreCommunicator) -> Result<()> {
        self.suspended = false;
        if let Some(d) = self.direct.as_mut()
            && core.world_size() > 1
            && let Err(e) = d.ensure_area(core, WorkspaceArea::Control)
        {
            return Err(if matches!(e, Error::Cuda { .. }) { e } else { self.break_with(e) });
        }
        Ok(())
    }

    /// Errors when the engine is suspended, an earlier launch reported a device error or the
    /// engine is broken; a device error breaks the engine for good (the ranks' epochs no longer
    /// agree).
    pub(crate) fn check(&mut self) -> Result<()> {
        if self.suspended {
            return Err(Error::invalid(
                "this communicator's GPU memory is suspended (suspend_device_memory, ncclCommSuspend): resume it \
                 (resume_device_memory, ncclCommResume) on every rank before device calls",
            ));
        }
        // A peer that left after its last call is no error for calls that completed; only when
        // a kernel gave up (on the watch's abort, or waiting for the dead peer) is it the cause.
        if let (Some(_), Some((peer, why))) = (self.status.error(), self.watch.lost())
            && self.broken.is_none()
        {
            self.broken = Some(format!("rank {peer} was lost: {why}"));
            return Err(Error::peer_lost(peer, "GPU collective", why));
        }
        if let Some(code) = self.status.error() {
            let why = format!("{} (device error code {})", code.describe(), code as u32);
            // Ranks out of step — a message of another call, or of a send nobody received
            // (`crate::matching`): a protocol error, which revokes the communicator.
            if code == DeviceError::CallMismatch && self.broken.is_none() {
                self.broken = Some(why.clone());
                return Err(Error::protocol(format!(
                    "point-to-point or call mismatch on the GPU: {why}; a send of an earlier group may have gone \
                     unreceived (sends and receives of a pair must match one to one within their groups, between the \
                     same collectives). The communicator is revoked; shrink it or build a new one"
                )));
            }
            // Anything else a revocation cut short (its hook aborts the kernels) says so.
            if code != DeviceError::CallMismatch && self.resilience.is_revoked() {
                self.broken.get_or_insert_with(|| why.clone());
                return Err(crate::health::revoked_during(&Error::Aborted(why)));
            }
            // A wait that ran out is reported as the timeout it is, once (so that the call's
            // verdict names who is behind); later calls say the engine is unusable.
            let waited =
                matches!(code, DeviceError::SemaphoreTimeout | DeviceError::PacketTimeout | DeviceError::FifoTimeout);
            if waited && self.broken.is_none() {
                self.broken = Some(why.clone());
                return Err(Error::timeout(format!("a device call: {why}"), None, self.timeout));
            }
            self.broken.get_or_insert(why);
        }
        if let Some(e) = self.channels.as_ref().and_then(DeviceChannels::proxy_error) {
            self.broken.get_or_insert_with(|| format!("the GPU channel proxy failed: {e}"));
        }
        match &self.broken {
            Some(_) if self.resilience.is_revoked() => Err(crate::health::revoked()),
            Some(why) => Err(Error::Aborted(format!(
                "GPU collectives of this communicator are unusable after: {why}; create a new communicator"
            ))),
            None => Ok(()),
        }
    }

    /// Stops what of this engine issues work through the communicator's connections on its
    /// own — the channel family's proxy — for a shrink that carries the connections over.
    /// Kernels still running find no proxy and stop at the abort word (a revocation raised it).
    pub(crate) fn stop_proxy(&self) {
        if let Some(channels) = &self.channels {
            channels.stop_proxy();
        }
    }

    /// The status words running kernels watch (an abort there stops them).
    pub(crate) fn status(&self) -> &Arc<DeviceStatus> {
        &self.status
    }

    /// The direct family with the control area and `area` of the workspace made
    /// ([`DirectKernels::ensure_area`]). A failure other than an allocation every rank saw fail
    /// breaks the engine (the area may be made on some ranks only).
    pub(crate) fn direct_with(&mut self, core: &CoreCommunicator, area: WorkspaceArea) -> Result<&mut DirectKernels> {
        self.check()?;
        if let Some(d) = self.direct.as_mut() {
            let made = d.ensure_area(core, WorkspaceArea::Control).and_then(|()| d.ensure_area(core, area));
            if let Err(e) = made {
                return Err(if matches!(e, Error::Cuda { .. }) { e } else { self.break_with(e) });
            }
        }
        self.direct()
    }

    /// The direct family, or `Err(Unsupported)` where it does not run.
    pub(crate) fn direct(&mut self) -> Result<&mut DirectKernels> {
        self.check()?;
        self.direct.as_mut().ok_or_else(|| {
            Error::Unsupported(format!(
                "the direct GPU kernels need at most {MAX_GPU_RANKS} GPUs; use the channel family (WEAVE_ALGO=channel)"
            ))
        })
    }

    /// Runs `launch` on the channel family (built at its first use) with the status words its
    /// kernels report into. The setup — building the family, its links, loading its kernels —
    /// is no stream work and runs in relaxed capture mode, so the first channel call may be
    /// captured into a CUDA graph. A failure other than a refused argument breaks the engine:
    /// links may have been built on some ranks only.
    pub(crate) fn on_channels(
        &mut self,
        core: &CoreCommunicator,
        launch: impl FnOnce(&mut DeviceChannels, comm_core::device::DeviceStatusHandle) -> Result<()>,
    ) -> Result<()> {
        self.check()?;
        let _relaxed = weave_cuda::driver::RelaxedCapture::enter()?;
        if self.channels.is_none() {
            let built = DeviceChannels::new(core, &self.ctx, self.device, &self.arch_name);
            self.channels = Some(built.map_err(|e| self.break_with(e))?);
        }
        let status = self.status_handle();
        let channels =
            self.channels.as_mut().ok_or_else(|| Error::Aborted("the GPU channel family vanished".into()))?;
        launch(channels, status)
            .map_err(|e| if matches!(e, Error::InvalidArgument(_)) { e } else { self.break_with(e) })
    }

    /// The status words a launch of the current call reports into, with this communicator's
    /// spin budget.
    pub(crate) fn status_handle(&self) -> comm_core::device::DeviceStatusHandle {
        self.status.handle_for_call(self.timeout, self.current_call())
    }

    /// The ledger's number of the latest collective begun: what this call's kernels report
    /// when they start (a group's kernels report the collective before them again).
    pub(crate) fn current_call(&self) -> u64 {
        self.resilience.ledger().collectives_begun()
    }

    /// Marks the engine unusable after a failure that may leave the ranks out of step, and
    /// returns the error.
    pub(crate) fn break_with(&mut self, e: Error) -> Error {
        self.broken.get_or_insert_with(|| e.to_string());
        e
    }
}

impl DirectKernels {
    /// Collective (every rank of at most 8): agrees on the grid limits and slot sizes, maps every
    /// rank's workspace and compiles the collective kernels for `arch`.
    fn new(
        core: &CoreCommunicator,
        gpu: &GpuConfig,
        ctx: &Arc<CudaContext>,
        device: &weave_cuda::CudaDevice,
        arch: &str,
        status: &Arc<DeviceStatus>,
    ) -> Result<Self> {
        let world = core.world_size();
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| Error::Cuda { operation: "multiprocessor count".into(), message: e.to_string() })?;
        // Every rank must pick the same kernels, grids and slot sizes (the pipelined kernels pair
        // block b with block b of every peer): agree on the smallest multiprocessor count and
        // pipeline block count, and on the architecture (none when the GPUs differ, so the
        // generic table rows apply).
        let arch_number = arch.strip_prefix("sm_").and_then(|v| v.parse::<u32>().ok());
        let wanted_blocks = gpu.pipeline_blocks.unwrap_or(DEFAULT_PIPE_BLOCKS).min(PIPE_MAX_BLOCKS);
        let wanted_tile = gpu.pipeline_tile.unwrap_or(PIPE_TILE_BYTES);
        let wanted_packets = gpu.packets.unwrap_or(PACKET_CAPACITY);
        let wanted_steps = gpu.pipeline_steps.unwrap_or(DEFAULT_PIPE_STEPS);
        let mut gpu_facts = Vec::with_capacity(48);
        let words = [
            sms.max(1) as u32,
            arch_number.unwrap_or(0),
            wanted_blocks,
            (wanted_tile / 256) as u32,
            wanted_packets as u32,
            wanted_steps,
        ];
        for word in words {
            gpu_facts.extend_from_slice(&word.to_le_bytes());
        }
        // After the words: this GPU's PCI bus id, so every rank can ask how it reaches the others.
        gpu_facts.extend_from_slice(device.pci_bus_id().as_bytes());
        let mut bus_ids = Vec::with_capacity(world);
        let (mut max_blocks, mut pipeline_blocks, mut tile) = (u32::MAX, PIPE_MAX_BLOCKS, usize::MAX);
        let mut packet_capacity = usize::MAX;
        let mut pipeline_steps = u32::MAX;
        let mut archs = Vec::with_capacity(world);
        for v in core.bootstrap().all_gather(&gpu_facts)? {
            let word = |i: usize| -> Result<u32> {
                let b: [u8; 4] = v.get(4 * i..4 * i + 4).and_then(|b| b.try_into().ok()).ok_or_else(|| {
                    Error::Protocol(format!(
                        "GPU setup: a peer sent {} bytes instead of at least 24 for its GPU",
                        v.len()
                    ))
                })?;
                Ok(u32::from_le_bytes(b))
            };
            max_blocks = max_blocks.min(word(0)?.max(1));
            archs.push(word(1)?);
            pipeline_blocks = pipeline_blocks.min(word(2)?.max(1));
            tile = tile.min(word(3)? as usize * 256);
            packet_capacity = packet_capacity.min(word(4)? as usize);
            pipeline_steps = pipeline_steps.min(word(5)?.max(1));
            bus_ids.push(String::from_utf8_lossy(v.get(24..).unwrap_or_default()).into_owned());
        }
        // LL128 lines need NVLink between every pair: each rank checks its links, all agree.
        let mut linked = true;
        for (r, bus_id) in bus_ids.iter().enumerate() {
            if r != core.rank() {
                linked &= device.nvlink_with(bus_id)?;
            }
        }
        let nvlink = core.bootstrap().all_gather(&[u8::from(linked)])?.iter().all(|v| v.first() == Some(&1));
        // The kernels wait for their predecessor themselves on sm_90 and later (the program is
        // compiled for this GPU's own architecture), so this rank may overlap its launches.
        let overlap_launches = gpu.overlap_launches && arch_number.is_some_and(|a| a >= 90);
        let arch_number = arch_number.filter(|a| archs.iter().all(|b| b == a));
        let pipeline_blocks = pipeline_blocks.min(max_blocks);
        let layout = WorkspaceLayout {
            world,
            packet_capacity,
            chunk_bytes: CHUNK_BYTES,
            mailbox_bytes: MAILBOX_BYTES,
            pipe_blocks: pipeline_blocks as usize,
            pipe_share_bytes: WorkspaceLayout::pipe_share_for(
                world,
                pipeline_blocks as usize,
                tile,
                PIPE_MAX_AREA_BYTES,
            ),
            // Without NVLink between every pair the LL128 kernel never runs: no line area.
            ll128_lines: if nvlink { WorkspaceLayout::ll128_lines_for(world, LL128_AREA_BYTES) } else { 0 },
        };
        // Launch as programmatic dependents of the previous kernel on the stream (sm_90+, the
        // kernels then start with griddepcontrol.wait; `WEAVE_GPU_OVERLAP`).
        let mut launcher = DirectLauncher::new(ctx, arch, overlap_launches);
        // Every kernel loaded now, while no call of this communicator is queued: a kernel's first
        // load later, behind queued calls, can deadlock them (see `DirectLauncher::preload`).
        // A failure here is no failure of the communicator (its host collectives work): the
        // first direct call loads what is missing and reports the error then.
        if let Err(e) = launcher.preload() {
            tracing::info!(target: diagnostics::KERNELS, rank = core.rank(), "direct GPU kernels not loaded at setup: {e}");
        }
        let mut direct = DirectKernels {
            launcher,
            areas: Default::default(),
            device: device.ordinal(),
            layout,
            max_blocks,
            pipeline_blocks,
            arch: arch_number,
            pipeline_steps,
            overlapped_schedule: gpu.overlapped_schedule,
            nvlink,
            rank: core.rank(),
            timeout: core.config().timeout,
            status: status.clone(),
        };
        // Point-to-point calls use the control area, and only their two ranks take part in
        // them, so it cannot be made at the first one: with peers it is made now, by every rank.
        if world > 1 {
            direct.ensure_area(core, WorkspaceArea::Control)?;
        }
        Ok(direct)
    }

    /// Makes `area` of every rank's workspace unless a kernel needed it before. Collective: every
    /// rank runs the same collective kernels in the same order (the plan is agreed), so every
    /// rank comes here at the same call; the control area, which point-to-point kernels use, is
    /// made with the engine where there are peers. The allocation and the exchange of the
    /// mappings are host work, done in relaxed capture mode (a first call may be captured into a
    /// CUDA graph). Every rank says whether its allocation worked before any waits for the
    /// exchange, so a rank out of memory fails the call on every rank, and a later call tries
    /// again.
    pub(crate) fn ensure_area(&mut self, core: &CoreCommunicator, area: WorkspaceArea) -> Result<()> {
        if self.areas[area.index()].is_some() {
            return Ok(());
        }
        let _relaxed = weave_cuda::driver::RelaxedCapture::enter()?;
        let bytes = self.layout.area_bytes(area).max(1);
        let label = format!("weave gpu workspace: {}", area.describe());
        let mine = core.register(bytes, MemoryKind::Device(self.device), &label);
        let made = core.bootstrap().all_gather(&[u8::from(mine.is_ok())])?;
        let mine = mine?;
        if let Some(r) = made.iter().position(|v| v.first() != Some(&1)) {
            return Err(Error::Cuda {
                operation: format!("allocate the GPU workspace's {}", area.describe()),
                message: format!(
                    "rank {r} could not allocate {bytes} bytes on its GPU; free GPU memory (or suspend other \
                     communicators) and call again"
                ),
            });
        }
        let all = core.exchange(&mine)?;
        tracing::info!(
            target: diagnostics::INIT,
            rank = self.rank,
            "GPU workspace: made the {} ({bytes} B on every rank)",
            area.describe()
        );
        self.areas[area.index()] = Some(all);
        Ok(())
    }

    /// Bytes of GPU memory this rank's workspace areas take (what they were allocated with),
    /// and which areas are made.
    pub(crate) fn memory(&self) -> usize {
        self.areas.iter().flatten().filter_map(|all| all.get(self.rank)).map(allocated_bytes).sum()
    }

    /// Releases every area (this rank's allocations and its mappings of the peers'); the next
    /// kernel that needs one makes it again. The caller makes sure no kernel still runs on them
    /// and that every rank releases too.
    pub(crate) fn release_areas(&mut self) {
        self.areas = Default::default();
    }

    /// The workspace layout.
    pub(crate) fn layout(&self) -> WorkspaceLayout {
        self.layout
    }

    /// What the plan needs to know about this communicator's GPUs (agreed by every rank).
    pub(crate) fn caps(&self) -> crate::select::device::GpuCaps {
        crate::select::device::GpuCaps {
            arch: self.arch,
            packet_capacity: self.layout.packet_capacity,
            nvlink: self.nvlink,
            ll128_max_bytes: self.layout.ll128_two_shot_max_bytes(),
            forced_schedule: self.overlapped_schedule,
            direct: true,
        }
    }

    /// A filled-in argument block for this rank's launch of call `call` (see
    /// [`GpuEngine::current_call`]).
    /// Areas not made yet are 0: launch only kernels whose areas [`ensure_area`](Self::ensure_area)
    /// made.
    pub(crate) fn args(&self, call: u64) -> GpuCollectiveArgs {
        let addresses = |area: WorkspaceArea| {
            let mut at = [0u64; MAX_GPU_RANKS];
            for (i, w) in self.areas[area.index()].iter().flatten().enumerate().take(MAX_GPU_RANKS) {
                at[i] = w.as_ptr() as u64;
            }
            at
        };
        GpuCollectiveArgs {
            peers: addresses(WorkspaceArea::Control),
            slots: addresses(WorkspaceArea::Slots),
            pipes: addresses(WorkspaceArea::Pipe),
            lines: addresses(WorkspaceArea::Lines),
            packet_capacity: self.layout.packet_capacity as u64,
            chunk_bytes: self.layout.chunk_bytes as u64,
            pipe_share_bytes: self.layout.pipe_share_bytes as u64,
            ll128_lines: self.layout.ll128_lines as u64,
            rank: self.rank as u32,
            world: self.layout.world as u32,
            status: self.status.handle_for_call(self.timeout, call),
            aux: [0, 0, self.layout.mailbox_bytes as u64, 0],
            ..GpuCollectiveArgs::default()
        }
    }

    /// Blocks for a flag-based kernel moving about `bytes` bytes (at most one per SM, so the
    /// grid-wide phases of the kernels never wait for a block that is not resident).
    pub(crate) fn blocks_for(&self, bytes: usize) -> u32 {
        let per_block = BLOCK_THREADS as usize * 64;
        (bytes.div_ceil(per_block).max(1) as u32).min(self.max_blocks)
    }

    /// Blocks for an LL packet kernel with `packets` packets per peer: one thread per packet,
    /// since every packet is a round trip's worth of latency, up to `PACKET_MAX_BLOCKS` (then a
    /// thread takes several packets: more blocks of spinning readers stalled now and then,
    /// docs/perf-log/gpu.md, "Tuning notes").
    pub(crate) fn packet_blocks(&self, packets: usize) -> u32 {
        (packets.div_ceil(BLOCK_THREADS as usize).max(1) as u32).min(self.max_blocks).min(PACKET_MAX_BLOCKS)
    }

    /// The least tiles per block the pipelined kernels aim for (their `aux[0]`).
    pub(crate) fn pipeline_steps(&self) -> u32 {
        self.pipeline_steps
    }

    /// Blocks for a block-pipelined kernel over a `bytes`-byte message: at least
    /// `PIPE_MIN_BYTES_PER_BLOCK` per block, at most `WEAVE_GPU_BLOCKS` (128 by default).
    pub(crate) fn pipeline_blocks(&self, bytes: usize) -> u32 {
        (bytes.div_ceil(PIPE_MIN_BYTES_PER_BLOCK).max(1) as u32).min(self.pipeline_blocks)
    }
}

/// The workspace area a direct kernel of `k` needs besides the control area (the control area
/// itself where it needs no other).
pub(crate) fn area_of(k: &KernelPlan) -> WorkspaceArea {
    match k.grid {
        Grid::Lines => WorkspaceArea::Lines,
        Grid::Pipelined { .. } => WorkspaceArea::Pipe,
        Grid::Flags if k.family != SENDRECV_KERNEL => WorkspaceArea::Slots,
        Grid::Flags | Grid::Packets | Grid::Channel => WorkspaceArea::Control,
    }
}

/// The bytes of GPU memory behind `memory`: its allocation's size where weave-cuda allocated it
/// (rounded up to the allocation granularity), else its length.
pub(crate) fn allocated_bytes(memory: &RegisteredMemory) -> usize {
    memory
        .region()
        .as_any()
        .downcast_ref::<weave_cuda::DeviceRegion>()
        .and_then(|r| r.allocation().map(|a| a.size()))
        .unwrap_or_else(|| memory.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::device::{TEST_CAPS, kernel};
    use crate::table::{Algorithm, Collective};

    /// Each direct kernel is given the area its source uses: packets and point-to-point the
    /// control area alone, the flag-based reduce and all-to-all-v the slots, the pipelined
    /// kernels the pipe area, the LL128 all-reduce the lines.
    #[test]
    fn every_direct_kernel_gets_the_area_it_uses() {
        let area = |c, a| area_of(&kernel(c, a, 4, 1 << 20, &TEST_CAPS).unwrap());
        assert_eq!(area(Collective::AllReduce, Algorithm::OneShot), WorkspaceArea::Control);
        assert_eq!(area(Collective::AllGather, Algorithm::OneShot), WorkspaceArea::Control);
        assert_eq!(area(Collective::AllReduce, Algorithm::TwoShot), WorkspaceArea::Control);
        assert_eq!(area(Collective::AllReduce, Algorithm::TwoShotLl128), WorkspaceArea::Lines);
        assert_eq!(area(Collective::AllReduce, Algorithm::TwoPhase), WorkspaceArea::Pipe);
        assert_eq!(area(Collective::Broadcast, Algorithm::Ring), WorkspaceArea::Pipe);
        assert_eq!(area(Collective::Reduce, Algorithm::Direct), WorkspaceArea::Slots);
        assert_eq!(area(Collective::AllToAllv, Algorithm::Direct), WorkspaceArea::Slots);
        assert_eq!(area(Collective::SendRecv, Algorithm::Direct), WorkspaceArea::Control);
    }
}
