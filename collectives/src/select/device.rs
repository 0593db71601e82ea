//! The device half of the plan: which kernel runs a GPU collective and how it sizes its grid.
//!
//! The table names an algorithm; the GPUs' agreed capabilities may rule it out for this call
//! (the packet area is too small for a one-shot of this size, no NVLink for LL128 lines), in
//! which case the next algorithm of the same collective that fits is taken. Then each
//! (collective, algorithm) pair names its kernel family and grid. Measurements behind the
//! thresholds are in docs/perf-log/gpu.md ("Tuning notes").

use comm_core::Result;

use super::table::{Algorithm, Collective, Family};

/// What the GPUs of a communicator can do, as every rank agreed at setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuCaps {
    /// Compute capability × 10 of every GPU (`None` when they differ).
    pub arch: Option<u32>,
    /// LL packets (8 bytes of payload) one rank may write to one peer per parity.
    pub packet_capacity: usize,
    /// Every pair of GPUs is joined by NVLink (LL128 lines need it).
    pub nvlink: bool,
    /// Largest message of the LL128 two-shot all-reduce, in bytes.
    pub ll128_max_bytes: usize,
    /// The pipelined kernels' schedule forced by `WEAVE_GPU_SCHEDULE` (true: overlapped).
    pub forced_schedule: Option<bool>,
    /// The direct kernels run here (every GPU maps every peer's workspace: at most 8 GPUs);
    /// otherwise only the channel family does.
    pub direct: bool,
}

/// How a kernel family sizes its grid (and, pipelined, how many tiles per block it aims for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grid {
    /// LL packet kernels: one thread per packet, up to the packet block limit.
    Packets,
    /// LL128 line kernels: eight threads per line of a share, up to the packet block limit.
    Lines,
    /// Block-pipelined kernels: blocks by message size, at least `min_steps` tiles per block
    /// (or `WEAVE_GPU_STEPS`, whichever is more), in the overlapped or lockstep schedule.
    Pipelined {
        /// Least tiles per block.
        min_steps: u32,
        /// Push a tile, then finish the earlier ones (true), or consume each tile right after
        /// it arrived (false).
        overlapped: bool,
    },
    /// Flag-phase kernels: blocks by message size, at most one per SM.
    Flags,
    /// Channel kernels: one block, whose thread 0 drives the links.
    Channel,
}

/// What the kernel's `count` argument counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountUnit {
    /// Elements (reducing kernels).
    Elements,
    /// Bytes (data-movement kernels).
    Bytes,
    /// The element size in bytes (all-to-all-v, whose counts come in arrays).
    ElementSize,
}

/// The kernel of a device plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelPlan {
    /// Kernel family in `kernels/cuda` (typed families get a dtype suffix).
    pub family: &'static str,
    /// Whether the family is instantiated per element type.
    pub typed: bool,
    /// What the `count` argument counts.
    pub count: CountUnit,
    /// How the grid is sized.
    pub grid: Grid,
}

/// From this size on, the relay broadcast on 3+ GPUs cuts each block's part into at least two
/// tiles, so the root's scatter of one overlaps the relays' forwarding of the other.
const RELAY_TWO_STEPS_FROM: usize = 16 << 20;

/// From this size on, the block-pipelined kernels on 2 GPUs use the overlapped schedule; on
/// more GPUs the lockstep one is faster at every size.
const OVERLAPPED_FROM_ON_2_GPUS: usize = 64 << 20;

/// The algorithm the GPUs can run for a call the table gave `algo`: `payload` bytes per rank
/// (what the packet kernels move to one peer), `bytes` as the table measures them.
pub fn fit(algo: Algorithm, c: Collective, world: usize, payload: usize, caps: &GpuCaps) -> Algorithm {
    let packets = payload.div_ceil(8);
    let mut algo = algo;
    if algo == Algorithm::OneShot && packets > caps.packet_capacity {
        algo = match c {
            Collective::AllReduce => Algorithm::TwoShot,
            Collective::Broadcast => Algorithm::TwoPhase,
            _ => Algorithm::Direct,
        };
    }
    if algo == Algorithm::TwoShotLl128 && !caps.nvlink {
        algo = Algorithm::TwoShot;
    }
    if algo == Algorithm::TwoShotLl128 && payload > caps.ll128_max_bytes {
        algo = Algorithm::TwoPhase;
    }
    if algo == Algorithm::TwoShot && packets.div_ceil(world) > caps.packet_capacity / 2 {
        algo = Algorithm::TwoPhase;
    }
    algo
}

/// The direct family's all-reduce over windows (`kernels/cuda/windowed.cu`).
pub const WINDOWED_ALL_REDUCE_FAMILY: &str = "weave_all_reduce_windowed";

/// From this size on, an all-reduce whose input and output both lie in windows runs two-shot
/// (each rank reduces a share and writes it into every output) rather than one-shot (each rank
/// reads every input whole).
const WINDOWED_TWO_SHOT_FROM: usize = 64 << 10;

/// How the all-reduce over windows runs (its kernel's `aux[0]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowedForm {
    /// Every rank reads every input whole and writes its own output.
    OneShot = 0,
    /// Rank r reduces the r-th share of every input and writes it into every rank's output.
    TwoShot = 1,
}

/// The form of an all-reduce of `bytes` bytes whose input lies in a window; `output_in_window`
/// says whether its output does too, `in_place` whether they are one buffer. In place it is
/// two-shot at every size: one-shot would overwrite an input a peer still reads.
pub fn windowed_form(bytes: usize, output_in_window: bool, in_place: bool) -> WindowedForm {
    if in_place || (output_in_window && bytes >= WINDOWED_TWO_SHOT_FROM) {
        WindowedForm::TwoShot
    } else {
        WindowedForm::OneShot
    }
}

/// The direct family's point-to-point kernel (its mailboxes are in the control area, which
/// point-to-point needs alone: `gpu::area_of`).
pub const SENDRECV_KERNEL: &str = "weave_sendrecv";

/// The channel family's reducing kernels (`weave_channel_<type>`; `kernels::channel`).
pub const CHANNEL_REDUCING_FAMILY: &str = "weave_channel";
/// The channel family's data-movement kernel (`kernels::channel`).
pub const CHANNEL_MOVING_KERNEL: &str = "weave_channel_bytes";

/// The kernel that runs `algo` for `c` on `world` GPUs, for a call of `bytes` bytes (as the
/// table measures them).
pub fn kernel(c: Collective, algo: Algorithm, world: usize, bytes: usize, caps: &GpuCaps) -> Result<KernelPlan> {
    use Algorithm::{OneShot, Ring, TwoShot, TwoShotLl128};
    use Collective::*;
    use CountUnit::{Bytes, ElementSize, Elements};
    let overlapped = caps.forced_schedule.unwrap_or(world == 2 && bytes >= OVERLAPPED_FROM_ON_2_GPUS);
    let pipelined = |min_steps| Grid::Pipelined { min_steps, overlapped };
    let k = |family, typed, count, grid| Ok(KernelPlan { family, typed, count, grid });
    if algo.family() == Family::Channel {
        return match c {
            AllReduce | ReduceScatter | Reduce => k(CHANNEL_REDUCING_FAMILY, true, Elements, Grid::Channel),
            _ => k(CHANNEL_MOVING_KERNEL, false, Bytes, Grid::Channel),
        };
    }
    match (c, algo) {
        (AllReduce, OneShot) => k("weave_all_reduce_ll", true, Elements, Grid::Packets),
        (AllReduce, TwoShot) => k("weave_all_reduce_two_shot", true, Elements, Grid::Packets),
        (AllReduce, TwoShotLl128) => k("weave_all_reduce_two_shot_ll128", true, Elements, Grid::Lines),
        (AllReduce, _) => k("weave_all_reduce_pipelined", true, Elements, pipelined(1)),
        (ReduceScatter, OneShot) => k("weave_reduce_scatter_ll", true, Elements, Grid::Packets),
        (ReduceScatter, _) => k("weave_reduce_scatter_pipelined", true, Elements, pipelined(1)),
        (Reduce, OneShot) => k("weave_reduce_ll", true, Elements, Grid::Packets),
        (Reduce, _) => k("weave_reduce", true, Elements, Grid::Flags),
        (AllGather, OneShot) => k("weave_all_gather_ll", false, Bytes, Grid::Packets),
        (AllGather, _) => k("weave_all_gather_pipelined", false, Bytes, pipelined(1)),
        (Broadcast, OneShot) => k("weave_broadcast_ll", false, Bytes, Grid::Packets),
        (Broadcast, Ring) => k("weave_broadcast_chain", false, Bytes, pipelined(1)),
        (Broadcast, _) => {
            let min_steps = if world >= 3 && bytes >= RELAY_TWO_STEPS_FROM { 2 } else { 1 };
            k("weave_broadcast_pipelined", false, Bytes, pipelined(min_steps))
        }
        (AllToAll, OneShot) => k("weave_all_to_all_ll", false, Bytes, Grid::Packets),
        (AllToAll, _) => k("weave_all_to_all_pipelined", false, Bytes, pipelined(1)),
        (AllToAllv, _) => k("weave_all_to_allv", false, ElementSize, Grid::Flags),
        (SendRecv, _) => k(SENDRECV_KERNEL, false, Bytes, Grid::Flags),
    }
}

/// Capabilities of a Hopper GPU with NVLink and direct access to every peer: the device the
/// selection tests plan for.
#[cfg(test)]
pub(crate) const TEST_CAPS: GpuCaps = GpuCaps {
    arch: Some(90),
    packet_capacity: 64 << 10,
    nvlink: true,
    ll128_max_bytes: 3840 << 10,
    forced_schedule: None,
    direct: true,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windowed_all_reduces_go_two_shot_in_place_and_when_large() {
        assert_eq!(windowed_form(8, true, true), WindowedForm::TwoShot);
        assert_eq!(windowed_form(8, true, false), WindowedForm::OneShot);
        assert_eq!(windowed_form(1 << 20, true, false), WindowedForm::TwoShot);
        assert_eq!(windowed_form(1 << 20, false, false), WindowedForm::OneShot);
    }

    #[test]
    fn algorithms_that_do_not_fit_fall_back() {
        let big = (64 << 10) * 8 + 8;
        assert_eq!(fit(Algorithm::OneShot, Collective::AllReduce, 4, big, &TEST_CAPS), Algorithm::TwoShot);
        assert_eq!(fit(Algorithm::OneShot, Collective::AllReduce, 2, big, &TEST_CAPS), Algorithm::TwoPhase);
        assert_eq!(fit(Algorithm::OneShot, Collective::Broadcast, 2, big, &TEST_CAPS), Algorithm::TwoPhase);
        assert_eq!(fit(Algorithm::OneShot, Collective::AllGather, 2, big, &TEST_CAPS), Algorithm::Direct);
        assert_eq!(fit(Algorithm::OneShot, Collective::AllGather, 2, 8, &TEST_CAPS), Algorithm::OneShot);
        let pcie = GpuCaps { nvlink: false, ..TEST_CAPS };
        assert_eq!(fit(Algorithm::TwoShotLl128, Collective::AllReduce, 4, 1 << 20, &pcie), Algorithm::TwoShot);
        assert_eq!(fit(Algorithm::TwoShotLl128, Collective::AllReduce, 4, 8 << 20, &TEST_CAPS), Algorithm::TwoPhase);
    }

    #[test]
    fn every_device_algorithm_names_a_kernel_and_the_schedule_follows_world_and_size() {
        for c in Collective::ALL {
            for a in Algorithm::ALL.into_iter().filter(|a| a.runs_on_device(c)) {
                let k = kernel(c, a, 4, 1 << 20, &TEST_CAPS).unwrap();
                assert!(k.family.starts_with("weave_"), "{c} {a}");
            }
        }
        let grid =
            |world, bytes| kernel(Collective::AllReduce, Algorithm::TwoPhase, world, bytes, &TEST_CAPS).unwrap().grid;
        assert_eq!(grid(2, 64 << 20), Grid::Pipelined { min_steps: 1, overlapped: true });
        assert_eq!(grid(2, 1 << 20), Grid::Pipelined { min_steps: 1, overlapped: false });
        assert_eq!(grid(4, 1 << 30), Grid::Pipelined { min_steps: 1, overlapped: false });
        let channel = kernel(Collective::AllReduce, Algorithm::ChannelRing, 2, 8, &TEST_CAPS).unwrap();
        assert_eq!((channel.family, channel.typed, channel.grid), (CHANNEL_REDUCING_FAMILY, true, Grid::Channel));
        let moving = kernel(Collective::SendRecv, Algorithm::ChannelDirect, 20, 8, &TEST_CAPS).unwrap();
        assert_eq!((moving.family, moving.typed), (CHANNEL_MOVING_KERNEL, false));
    }
}
