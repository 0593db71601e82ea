//! The direct kernel family (`cuda/collectives.cu`, `data_movement.cu`, `exchange_ll.cu`,
//! `pipeline.cu`): the argument block every direct collective kernel takes by value (mirrored by
//! `weave::GpuCollectiveArgs` and checked in every compile), the byte layout of a rank's
//! workspace that peers map, the launch constants, the program, and [`DirectLauncher`], which
//! compiles the program at the first launch and launches its kernels. The GPU engine that maps
//! the workspaces and fills the argument blocks lives in `collectives` (`gpu/`).

use std::collections::HashMap;
use std::sync::Arc;

use comm_core::device::{DeviceStatusHandle, Layout};
use comm_core::device_layout;
use comm_core::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};

use crate::launch::{LaunchShape, launch_with_args};
use crate::module::KernelModule;

/// Most ranks a GPU communicator supports (one host's GPUs).
pub const MAX_GPU_RANKS: usize = 8;

/// Kernel arguments. Counts are elements for reducing kernels and bytes for data-movement
/// kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuCollectiveArgs {
    /// Local input (device address).
    pub send: u64,
    /// Local output (device address).
    pub recv: u64,
    /// Elements (reducing kernels) or bytes (data kernels).
    pub count: u64,
    /// Every rank's workspace, as mapped on this GPU (own at `rank`).
    pub peers: [u64; MAX_GPU_RANKS],
    /// All-to-all-v: device arrays of send counts, send displacements, recv counts, recv
    /// displacements (bytes, one u64 per rank). Block-pipelined kernels: `aux[0]` is the
    /// least number of steps (tiles) per block they aim for, `aux[1]` their schedule (0
    /// lockstep, 1 overlapped; `PIPE_LOCKSTEP` and `PIPE_OVERLAPPED` in `pipeline.cu`).
    pub aux: [u64; 4],
    /// LL16 packets per (writer, parity).
    pub packet_capacity: u64,
    /// Bytes of one data slot pair (two parities).
    pub chunk_bytes: u64,
    /// Offset of the block-pipelined kernels' area in every workspace.
    pub pipe_offset: u64,
    /// Bytes of one slot of the pipelined kernels (a multiple of 256).
    pub pipe_share_bytes: u64,
    /// Offset of the LL128 line area in every workspace.
    pub ll128_offset: u64,
    /// LL128 lines (128 bytes each) per (writer, parity).
    pub ll128_lines: u64,
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world: u32,
    /// Root rank (broadcast, reduce).
    pub root: u32,
    /// Operator code: sum 0, prod 1, min 2, max 3, avg 4.
    pub op: u32,
    /// Where a kernel reports that it gave up.
    pub status: DeviceStatusHandle,
}

// SAFETY: plain #[repr(C)] data of u64/u32 fields, mirrored field for field by
// weave::GpuCollectiveArgs and checked by the generated layout asserts in every compile.
unsafe impl cudarc::driver::DeviceRepr for GpuCollectiveArgs {}

/// The layout the CUDA side must match.
pub const GPU_ARGS_LAYOUT: Layout = device_layout!(
    GpuCollectiveArgs,
    "GpuCollectiveArgs",
    [
        send,
        recv,
        count,
        peers,
        aux,
        packet_capacity,
        chunk_bytes,
        pipe_offset,
        pipe_share_bytes,
        ll128_offset,
        ll128_lines,
        rank,
        world,
        root,
        op,
        status
    ]
);

/// Most blocks of a block-pipelined kernel (`PIPE_MAX_BLOCKS` in `pipeline.cu`, defined from
/// this one by the program builder).
pub const PIPE_MAX_BLOCKS: u32 = 128;

/// Slot groups per block of a block-pipelined kernel (`PIPE_DEPTH` in `pipeline.cu`): step s
/// uses group s mod `PIPE_DEPTH`, so a block may push up to this many steps ahead of a peer's
/// reads.
pub const PIPE_DEPTH: usize = 4;

/// Flag kinds of the pipelined kernels per block and writer (inbox ready, results ready, freed).
const PIPE_FLAG_KINDS: usize = 3;

/// Bytes of the pipelined kernels' flag words (a u64 per block, kind and writer, up to 8
/// writers).
pub const PIPE_FLAGS_BYTES: usize = PIPE_MAX_BLOCKS as usize * PIPE_FLAG_KINDS * 8 * 8;

/// Bytes of one LL128 line (`weave/packet.cuh`: 16 u64, the last one the flag).
pub const LL128_LINE_BYTES: usize = 128;

/// Payload bytes of one LL128 line.
pub const LL128_PAYLOAD_BYTES: usize = LL128_LINE_BYTES - 8;

/// Threads that move one LL128 line (16 bytes each).
pub const LL128_THREADS_PER_LINE: usize = LL128_LINE_BYTES / 16;

/// Byte layout of one rank's GPU workspace (see `collectives.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceLayout {
    /// Ranks.
    pub world: usize,
    /// LL16 packets per (writer, parity).
    pub packet_capacity: usize,
    /// Bytes of one data slot pair.
    pub chunk_bytes: usize,
    /// Bytes of one point-to-point mailbox slot (header included).
    pub mailbox_bytes: usize,
    /// Most blocks of a block-pipelined kernel (the slots are sized for this many).
    pub pipe_blocks: usize,
    /// Bytes of one slot of the block-pipelined kernels (a multiple of 256).
    pub pipe_share_bytes: usize,
    /// LL128 lines (128 bytes) per (writer, parity); 0 (no line area) unless every pair of
    /// GPUs is joined by NVLink.
    pub ll128_lines: usize,
}

impl WorkspaceLayout {
    /// Offset of the LL16 packet area.
    pub const PACKETS_OFFSET: usize = 4096;

    /// Offset of the data slots (256-aligned, after the packets).
    pub fn data_offset(&self) -> usize {
        (Self::PACKETS_OFFSET + self.world * 2 * self.packet_capacity * 16).next_multiple_of(256)
    }

    /// Offset of the point-to-point mailboxes (after the data slots).
    pub fn mailbox_offset(&self) -> usize {
        self.data_offset() + 2 * (self.world + 1) * (self.chunk_bytes / 2)
    }

    /// Offset of the block-pipelined kernels' area (flags, then slots), after the mailboxes.
    pub fn pipe_offset(&self) -> usize {
        (self.mailbox_offset() + self.world * 2 * self.mailbox_bytes).next_multiple_of(256)
    }

    /// Bytes of the pipelined kernels' area: `PIPE_FLAGS_BYTES` of flags, then
    /// `[block][depth][inbox, results][writer]` slots.
    pub fn pipe_bytes(&self) -> usize {
        PIPE_FLAGS_BYTES + self.pipe_blocks * PIPE_DEPTH * 2 * self.world * self.pipe_share_bytes
    }

    /// The pipelined slot size for `blocks` blocks of `world` ranks: `tile`, made smaller
    /// where the area would pass `max_area` bytes (a multiple of 256, at least 4 KiB).
    pub fn pipe_share_for(world: usize, blocks: usize, tile: usize, max_area: usize) -> usize {
        let fits = max_area / (blocks.max(1) * PIPE_DEPTH * 2 * world.max(1));
        (tile.min(fits) / 256 * 256).max(4096)
    }

    /// Offset of the LL128 line area (`[writer][parity][ll128_lines]` lines of 128 bytes),
    /// after the pipelined kernels' area.
    pub fn ll128_offset(&self) -> usize {
        (self.pipe_offset() + self.pipe_bytes()).next_multiple_of(256)
    }

    /// LL128 lines per (writer, parity) for `world` ranks in an area of `area` bytes.
    pub fn ll128_lines_for(world: usize, area: usize) -> usize {
        area / (world.max(1) * 2 * LL128_LINE_BYTES)
    }

    /// Largest all-reduce (bytes) the LL128 two-shot kernel takes: every share (a world-th of
    /// the message, in 8-byte words) fits half a line area.
    pub fn ll128_two_shot_max_bytes(&self) -> usize {
        self.ll128_lines / 2 * LL128_PAYLOAD_BYTES * self.world
    }

    /// Threads the LL128 two-shot all-reduce of `bytes` bytes keeps busy: one line group per
    /// line of a share.
    pub fn ll128_two_shot_threads(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.world.max(1)).div_ceil(LL128_PAYLOAD_BYTES) * LL128_THREADS_PER_LINE
    }

    /// Total bytes.
    pub fn bytes(&self) -> usize {
        self.ll128_offset() + self.world * 2 * self.ll128_lines * LL128_LINE_BYTES
    }

    /// Largest message (bytes) the LL one-shot kernel takes.
    pub fn ll_max_bytes(&self) -> usize {
        self.packet_capacity * 8
    }
}

/// The kernels' CUDA C++ source: the flag-based kernels and shared helpers, the byte and
/// point-to-point kernels, the LL packet exchange of the data-movement collectives, and the
/// block-pipelined kernels, in that order.
pub const COLLECTIVES_SOURCE: &str = concat!(
    include_str!("../cuda/collectives.cu"),
    "\n",
    include_str!("../cuda/data_movement.cu"),
    "\n",
    include_str!("../cuda/exchange_ll.cu"),
    "\n",
    include_str!("../cuda/pipeline.cu"),
);

/// Threads per block of every collective kernel.
pub const BLOCK_THREADS: u32 = 512;
/// Most blocks of an LL packet kernel (`PACKET_MAX_BLOCKS` in `collectives.cu`: one packet
/// epoch counter per block index, at most 64 in the control block).
pub const PACKET_MAX_BLOCKS: u32 = 64;
/// How the entry points of a direct kernel family are made from its body in the sources.
#[derive(Debug, Clone, Copy)]
enum EntryPoint {
    /// `weave_<kernel>_<type>` for every reducing element type
    /// ([`REDUCING_TYPES`](crate::channel::REDUCING_TYPES)), through `WEAVE_REDUCING_KERNEL`
    /// with the body template `IMPL<Op, T>`.
    Reducing { kernel: &'static str, body: &'static str },
    /// One entry point `weave_<kernel>` running `body(a)`.
    Plain { kernel: &'static str, body: &'static str },
}

/// Every entry point of the direct program, family by family.
const ENTRY_POINTS: &[EntryPoint] = &[
    reducing("all_reduce_ll", "AllReduceLL"),
    reducing("all_reduce_two_shot", "AllReduceTwoShot"),
    reducing("all_reduce_two_shot_ll128", "AllReduceTwoShotLl128"),
    reducing("reduce", "Reduce"),
    plain("all_to_allv", "weave::coll::all_to_allv"),
    plain("sendrecv", "weave::coll::sendrecv"),
    reducing("reduce_scatter_ll", "ReduceScatterLL"),
    reducing("reduce_ll", "ReduceLL"),
    plain("all_gather_ll", "weave::coll::exchange_ll<weave::Sum, weave::uint8_t, weave::coll::XCHG_ALL_GATHER>"),
    plain("all_to_all_ll", "weave::coll::exchange_ll<weave::Sum, weave::uint8_t, weave::coll::XCHG_ALL_TO_ALL>"),
    plain("broadcast_ll", "weave::coll::exchange_ll<weave::Sum, weave::uint8_t, weave::coll::XCHG_BROADCAST>"),
    reducing("all_reduce_pipelined", "AllReducePipelined"),
    reducing("reduce_scatter_pipelined", "ReduceScatterPipelined"),
    plain("broadcast_chain", "weave::coll::broadcast_chain"),
    plain("broadcast_pipelined", "weave::coll::broadcast_relay"),
    plain("all_gather_pipelined", "weave::coll::one_round<weave::Sum, weave::uint8_t, weave::coll::ROUND_ALL_GATHER>"),
    plain("all_to_all_pipelined", "weave::coll::one_round<weave::Sum, weave::uint8_t, weave::coll::ROUND_ALL_TO_ALL>"),
];

/// A reducing family's entry points ([`EntryPoint::Reducing`]).
const fn reducing(kernel: &'static str, body: &'static str) -> EntryPoint {
    EntryPoint::Reducing { kernel, body }
}

/// A family of one entry point ([`EntryPoint::Plain`]).
const fn plain(kernel: &'static str, body: &'static str) -> EntryPoint {
    EntryPoint::Plain { kernel, body }
}

impl EntryPoint {
    /// The source lines defining this family's entry points whose names `wanted` accepts.
    fn lines(self, wanted: impl Fn(&str) -> bool) -> String {
        match self {
            EntryPoint::Reducing { kernel, body } => crate::channel::REDUCING_TYPES
                .iter()
                .filter(|(t, _)| wanted(&format!("weave_{kernel}_{t}")))
                .map(|(t, c)| format!("WEAVE_REDUCING_KERNEL({kernel}, {body}, {t}, {c})\n"))
                .collect(),
            EntryPoint::Plain { kernel, body } if wanted(&format!("weave_{kernel}")) => {
                format!("WEAVE_KERNEL(weave_{kernel}, {body})\n")
            }
            EntryPoint::Plain { .. } => String::new(),
        }
    }
}

/// A program of the collective sources with the entry points `wanted` accepts, the launch
/// configuration and every layout check.
fn program_of(wanted: impl Fn(&str) -> bool) -> String {
    let checks = crate::layout::static_checks() + &crate::layout::layout_checks(&[GPU_ARGS_LAYOUT]);
    let entries: String = ENTRY_POINTS.iter().map(|e| e.lines(&wanted)).collect();
    crate::source::program_with_checks(&with_host_constants(&format!("{COLLECTIVES_SOURCE}\n{entries}")), &checks)
}

/// The full NVRTC program: headers, the launch configuration the kernels are built for, every
/// collective kernel, and every layout check (what `gpu-worker precompile` puts in the cache).
pub fn program() -> String {
    program_of(|_| true)
}

/// The program of `kernel` alone: what a first launch compiles when the full program is not in
/// the cache (a few seconds instead of a minute or more).
pub fn program_for(kernel: DirectKernel) -> Result<String> {
    let name = kernel.name();
    let program = program_of(|n| n == name);
    if !ENTRY_POINTS.iter().any(|e| !e.lines(|n| n == name).is_empty()) {
        return Err(Error::invalid(format!("the direct program has no kernel {name}")));
    }
    Ok(program)
}

/// A kernel of the direct program: a family (`weave_all_reduce_ll`) and, for the reducing
/// families, the element type its name ends with (`weave_all_reduce_ll_f32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DirectKernel {
    family: &'static str,
    element: Option<&'static str>,
}

impl DirectKernel {
    /// A data-movement kernel, named by its family alone.
    pub const fn untyped(family: &'static str) -> Self {
        DirectKernel { family, element: None }
    }

    /// A reducing kernel instantiated for the element type named `element` (`f32`, `bf16`).
    pub const fn typed(family: &'static str, element: &'static str) -> Self {
        DirectKernel { family, element: Some(element) }
    }

    /// The kernel's name in the program.
    pub fn name(&self) -> String {
        self.to_string()
    }
}

impl std::fmt::Display for DirectKernel {
    /// The kernel's name in the program.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.element {
            Some(t) => write!(f, "{}_{t}", self.family),
            None => f.write_str(self.family),
        }
    }
}

/// Launches the direct kernels on one GPU: compiles and loads the program at the first launch
/// (in relaxed capture mode, so that first call may be captured into a CUDA graph) and looks
/// each function up by name once, later launches find it by its key.
pub struct DirectLauncher {
    ctx: Arc<CudaContext>,
    /// `sm_90` and the like: the architecture the program is compiled for.
    arch: String,
    /// The modules loaded so far: the full program (when the cache held it) or one per kernel.
    modules: Vec<Arc<KernelModule>>,
    /// The full program's module, when the cache held it at the first launch.
    full: Option<Arc<KernelModule>>,
    /// Whether the cache was asked for the full program yet.
    looked_for_full: bool,
    functions: HashMap<DirectKernel, CudaFunction>,
    /// Launch each kernel overlapped with its predecessor (sm_90 and later: the kernels wait for
    /// it in their first instruction).
    overlapped: bool,
}

impl std::fmt::Debug for DirectLauncher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectLauncher")
            .field("arch", &self.arch)
            .field("modules", &self.modules.len())
            .field("functions", &self.functions.len())
            .field("overlapped", &self.overlapped)
            .finish()
    }
}

impl DirectLauncher {
    /// A launcher for `ctx`'s GPU of architecture `arch`; nothing is compiled yet.
    pub fn new(ctx: &Arc<CudaContext>, arch: &str, overlapped: bool) -> Self {
        DirectLauncher {
            ctx: ctx.clone(),
            arch: arch.to_string(),
            modules: Vec::new(),
            full: None,
            looked_for_full: false,
            functions: HashMap::new(),
            overlapped,
        }
    }

    /// Launches `kernel(args)` on `stream` with `blocks` blocks of [`BLOCK_THREADS`].
    ///
    /// # Safety
    /// Every device address in `args` must be valid for what the kernel does with it until the
    /// kernel completes on `stream`.
    pub unsafe fn launch(
        &mut self,
        kernel: DirectKernel,
        args: &GpuCollectiveArgs,
        blocks: u32,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        if !self.functions.contains_key(&kernel) {
            let f = self.load(kernel)?;
            self.functions.insert(kernel, f);
        }
        let f = self.functions.get(&kernel).ok_or_else(|| Error::invalid(format!("kernel {kernel} vanished")))?;
        let shape = LaunchShape { blocks, threads: BLOCK_THREADS, overlapped: self.overlapped };
        // SAFETY: every direct kernel takes exactly one GpuCollectiveArgs (its layout is checked
        // in every compile) and waits for its predecessor first; the caller guarantees the
        // addresses inside `args`.
        unsafe { launch_with_args(f, args, shape, stream, &kernel) }
    }
}

impl DirectLauncher {
    /// The function of `kernel`: from the full program where the kernel cache holds it (a
    /// warmed cache), else from a program of that kernel alone, compiled (or found in the
    /// cache) now. `WEAVE_DEBUG=info` prints what was compiled and how long it took.
    fn load(&mut self, kernel: DirectKernel) -> Result<CudaFunction> {
        // Compiling and loading is no stream work: allowed while capturing.
        let _relaxed = weave_cuda::driver::RelaxedCapture::enter()?;
        let compiler = crate::compile::Compiler::from_env();
        if !self.looked_for_full {
            self.looked_for_full = true;
            if let Some(compiled) = compiler.cached(&program(), &self.arch)? {
                let m = KernelModule::load(&self.ctx, &compiled)?;
                self.modules.push(m.clone());
                self.full = Some(m);
            }
        }
        if let Some(full) = &self.full {
            return full.function(&kernel.name());
        }
        let started = std::time::Instant::now();
        let compiled = compiler.compile(&program_for(kernel)?, &self.arch)?;
        let info = comm_core::config::Config::from_env().is_ok_and(|c| c.logs(comm_core::config::LogLevel::Info));
        if info {
            eprintln!(
                "weave: direct kernel {kernel} for {}: {:?} in {:.2?}",
                self.arch,
                compiled.cache(),
                started.elapsed()
            );
        }
        let m = KernelModule::load(&self.ctx, &compiled)?;
        self.modules.push(m.clone());
        m.function(&kernel.name())
    }
}

/// The kernels' source preceded by the constants the host sizes things with: the block size
/// every launch uses, the pipelined kernels' block limit and flag area, and the packet
/// kernels' block limit (one packet epoch counter per block).
fn with_host_constants(source: &str) -> String {
    format!(
        "#define WEAVE_BLOCK_THREADS {BLOCK_THREADS}\n#define WEAVE_PIPE_MAX_BLOCKS {PIPE_MAX_BLOCKS}\n\
         #define WEAVE_PIPE_FLAGS_BYTES {}\n#define WEAVE_PIPE_DEPTH {}\n\
         #define WEAVE_PACKET_MAX_BLOCKS {PACKET_MAX_BLOCKS}\n{source}",
        PIPE_FLAGS_BYTES, PIPE_DEPTH
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm_core::device::Layout;

    #[test]
    fn args_fit_the_kernel_parameter_limit_and_layout_is_sane() {
        assert!(std::mem::size_of::<GpuCollectiveArgs>() <= 4096);
        assert_eq!(std::mem::size_of::<GpuCollectiveArgs>(), 208);
        let share = WorkspaceLayout::pipe_share_for(4, 64, 64 << 10, 256 << 20);
        assert_eq!(share, 64 << 10);
        assert_eq!(WorkspaceLayout::pipe_share_for(8, 64, 1 << 20, 256 << 20), 64 << 10);
        let l = WorkspaceLayout {
            world: 4,
            packet_capacity: 1 << 16,
            chunk_bytes: 8 << 20,
            mailbox_bytes: 1 << 20,
            pipe_blocks: 64,
            pipe_share_bytes: share,
            ll128_lines: WorkspaceLayout::ll128_lines_for(4, 16 << 20),
        };
        assert_eq!(l.data_offset() % 256, 0);
        assert_eq!(l.mailbox_offset(), l.data_offset() + 5 * (8 << 20));
        assert_eq!(l.pipe_offset(), l.mailbox_offset() + 8 * (1 << 20));
        assert_eq!(l.ll128_offset(), l.pipe_offset() + PIPE_FLAGS_BYTES + (128 << 20));
        assert_eq!(l.ll128_offset() % 256, 0);
        assert_eq!(l.bytes(), l.ll128_offset() + (16 << 20));
        // 16384 lines per (writer, parity): shares of up to 8192 lines of 120 bytes.
        assert_eq!(l.ll128_two_shot_max_bytes(), 8192 * 120 * 4);
        // 1 MiB on 4 GPUs: shares of 256 KiB, 2185 lines of 8 threads.
        assert_eq!(l.ll128_two_shot_threads(1 << 20), 2185 * 8);
        // No line area (no NVLink): the workspace ends where it would start, no LL128 message fits.
        let unlinked = WorkspaceLayout { ll128_lines: 0, ..l };
        assert_eq!(unlinked.bytes(), unlinked.ll128_offset());
        assert_eq!(unlinked.ll128_two_shot_max_bytes(), 0);
        assert_eq!(WorkspaceLayout::pipe_share_for(3, 64, 100_000, 256 << 20) % 256, 0);
        assert_eq!(WorkspaceLayout::pipe_share_for(8, 64, 1 << 10, 256 << 20), 4096);
        assert_eq!(l.ll_max_bytes(), 512 << 10);
    }

    /// Every collective kernel compiles for sm_90, with the layout of `GpuCollectiveArgs` (and
    /// every comm-core handle) checked against the C++ side. Without NVRTC this fails under `CI`
    /// and prints SKIPPED elsewhere.
    #[test]
    fn a_kernel_alone_makes_a_program_of_one_entry_point() {
        let count = |p: &str| p.matches("\nWEAVE_REDUCING_KERNEL(").count() + p.matches("\nWEAVE_KERNEL(").count();
        let all = program();
        assert_eq!(count(&all), 10 * 8 + 9, "8 reducing families of 10 types and 9 others");
        let one = program_for(DirectKernel::typed("weave_all_reduce_ll", "f32")).unwrap();
        assert_eq!(count(&one), 1);
        assert!(one.contains("WEAVE_REDUCING_KERNEL(all_reduce_ll, AllReduceLL, f32, float)"));
        assert_eq!(count(&program_for(DirectKernel::untyped("weave_sendrecv")).unwrap()), 1);
        assert!(program_for(DirectKernel::typed("weave_all_reduce_ll", "f128")).is_err());
        assert!(program_for(DirectKernel::untyped("weave_nonsense")).is_err());
    }

    /// A first launch on a cold cache compiles one kernel's program: it must compile alone.
    #[test]
    fn a_kernel_alone_compiles_for_sm_90() {
        if !crate::compile::tests::nvrtc_or_skip("a_kernel_alone_compiles") {
            return;
        }
        for k in [DirectKernel::typed("weave_all_reduce_ll", "f32"), DirectKernel::untyped("weave_broadcast_pipelined")]
        {
            let started = std::time::Instant::now();
            let compiled = crate::compile::Compiler::without_cache().compile(&program_for(k).unwrap(), "sm_90");
            let compiled = compiled.unwrap_or_else(|e| panic!("{k}: {e}"));
            assert!(compiled.ptx().contains(&k.name()), "{k} is not in its program");
            println!("{k} alone: compiled in {:.2?}", started.elapsed());
        }
    }

    #[test]
    fn collective_kernels_compile_for_sm_90_with_layout_checks() {
        if !crate::compile::tests::nvrtc_or_skip("collective_kernels_compile") {
            return;
        }
        let compiled = crate::compile::Compiler::without_cache().compile(&program(), "sm_90").expect("kernels compile");
        for (t, _) in crate::channel::REDUCING_TYPES {
            for k in [
                "all_reduce_ll",
                "all_reduce_two_shot",
                "all_reduce_pipelined",
                "reduce_scatter_ll",
                "reduce_scatter_pipelined",
                "reduce_ll",
                "reduce",
            ] {
                let name = format!(".entry weave_{k}_{t}(");
                assert!(compiled.ptx().contains(&name), "{name} missing from the PTX");
            }
        }
        for k in [
            "weave_all_gather_ll",
            "weave_all_gather_pipelined",
            "weave_broadcast_ll",
            "weave_broadcast_pipelined",
            "weave_broadcast_chain",
            "weave_all_to_all_ll",
            "weave_all_to_all_pipelined",
            "weave_all_to_allv",
            "weave_sendrecv",
        ] {
            assert!(compiled.ptx().contains(&format!(".entry {k}(")), "{k} missing from the PTX");
        }
    }

    /// A drift between `GpuCollectiveArgs` and its C++ mirror fails the compile.
    #[test]
    fn a_wrong_argument_layout_fails_the_compile() {
        if !crate::compile::tests::nvrtc_or_skip("a_wrong_argument_layout_fails_the_compile") {
            return;
        }
        let mut fields = GPU_ARGS_LAYOUT.fields.to_vec();
        fields[2].1 += 8;
        let wrong = Layout { fields: Box::leak(fields.into_boxed_slice()), ..GPU_ARGS_LAYOUT };
        let source = crate::source::program_with_checks(
            &with_host_constants(COLLECTIVES_SOURCE),
            &crate::layout::layout_checks(&[wrong]),
        );
        let r = crate::compile::Compiler::without_cache().compile(&source, "sm_90");
        assert!(r.is_err(), "a wrong offset compiled");
    }
}
