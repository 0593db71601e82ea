//! The GPU path: collectives on device buffers, stream-ordered on the caller's CUDA stream.
//!
//! The direct family (`direct.rs`) gives each rank a device workspace mapped by every peer, in
//! four areas made as calls first need them; the channel family (`channels.rs`) links pairs of
//! ranks (memory channels where the peer's memory is mapped here, else through the proxy); windows of user memory (`windowed.rs`) and buffers registered by
//! each rank alone (`registered.rs`) let an all-reduce read and write the peers' memory in place.
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
mod direct;
mod registered;
mod user_range;
mod watch;
mod windowed;

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

use crate::device_staging::DeviceStaging;
use channels::DeviceChannels;
pub use config::GpuConfig;
pub(crate) use direct::{DirectKernels, area_of};
pub use kernels::direct::{
    BLOCK_THREADS, DirectKernel, DirectLauncher, GPU_ARGS_LAYOUT, GpuCollectiveArgs, MAX_GPU_RANKS, PACKET_MAX_BLOCKS,
    PIPE_MAX_BLOCKS, WorkspaceArea, WorkspaceLayout,
};
pub(crate) use registered::{RegistrationState, Registrations};
pub(crate) use user_range::UserRange;
pub(crate) use windowed::{WindowState, Windows};

/// Per-communicator GPU state: the device, its status words and peer watch, and the two kernel
/// families — the direct one (every peer's workspace mapped here, up to 8 GPUs) and the channel
/// one (any number of GPUs, over links between pairs; built at its first call).
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
    /// The communicator's windows (`api/window.rs` registers them, `exec/device.rs` runs
    /// all-reduces on them in place).
    pub(crate) windows: Windows,
    /// The buffers this rank registered with the communicator (`api/registered.rs` registers
    /// them, `exec/device.rs` runs all-reduces on them in place).
    pub(crate) registrations: Registrations,
}

impl std::fmt::Debug for GpuEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuEngine")
            .field("rank", &self.rank)
            .field("direct", &self.direct.as_ref().map(DirectKernels::layout))
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
            windows: Windows::default(),
            registrations: Registrations::default(),
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
