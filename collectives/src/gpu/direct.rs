//! The direct family: collective kernels that load and store every peer's workspace, mapped
//! here through CUDA IPC (up to 8 GPUs of one node). Each rank's workspace is four areas
//! (`kernels::workspace`), each made when a kernel first needs it ([`DirectKernels::ensure_area`]);
//! the engine (`gpu/mod.rs`) holds the family and hands it the calls the plan gives it.

use std::sync::Arc;
use std::time::Duration;

use comm_core::bootstrap::Bootstrap as _;
use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::diagnostics;
use comm_core::memory::{MemoryKind, RegisteredMemory};
use comm_core::{Error, Result};
use cudarc::driver::CudaContext;
use weave_cuda::DeviceStatus;

use super::{
    BLOCK_THREADS, DirectLauncher, GpuCollectiveArgs, GpuConfig, MAX_GPU_RANKS, PACKET_MAX_BLOCKS, PIPE_MAX_BLOCKS,
    WorkspaceArea, WorkspaceLayout, allocated_bytes,
};
use crate::select::device::{Grid, KernelPlan, SENDRECV_KERNEL};

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

/// The direct family: one workspace per rank mapped by every peer, in four areas each made when
/// a kernel first needs it, and the collective kernels that load and store peers' workspaces.
pub(crate) struct DirectKernels {
    /// Compiles the program at the first launch and launches its kernels (the executor in
    /// `exec/device.rs` launches through it).
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

impl DirectKernels {
    /// Collective (every rank of at most 8): agrees on the grid limits and slot sizes, maps every
    /// rank's workspace and compiles the collective kernels for `arch`.
    pub(crate) fn new(
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
        let made = core.abortable_bootstrap().all_gather(&[u8::from(mine.is_ok())])?;
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
