//! The direct kernel family (`cuda/collectives.cu`, `data_movement.cu`, `exchange_ll.cu`,
//! `pipeline.cu`, `windowed.cu`): the argument block every direct collective kernel takes by value (mirrored by
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
use crate::program_text::{ALL_REDUCE_OPS, direct_program, fingerprint, has_direct_kernel, reduce_op_bit};

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
    /// Every rank's control area (flags, counters, LL16 packets, mailboxes), as mapped on this
    /// GPU (own at `rank`).
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
    /// Every rank's slot area (the flag-based kernels' data slots), 0 until made.
    pub slots: [u64; MAX_GPU_RANKS],
    /// Every rank's pipe area (the block-pipelined kernels' flags and slots), 0 until made.
    pub pipes: [u64; MAX_GPU_RANKS],
    /// Bytes of one slot of the pipelined kernels (a multiple of 256).
    pub pipe_share_bytes: u64,
    /// Every rank's line area (LL128 lines), 0 until made.
    pub lines: [u64; MAX_GPU_RANKS],
    /// LL128 lines (128 bytes each) per (writer, parity).
    pub ll128_lines: u64,
    /// The all-reduce over windows: every rank's input as mapped on this GPU (own at `rank`).
    pub win_send: [u64; MAX_GPU_RANKS],
    /// The all-reduce over windows, two-shot: every rank's output as mapped on this GPU.
    pub win_recv: [u64; MAX_GPU_RANKS],
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
        slots,
        pipes,
        pipe_share_bytes,
        lines,
        ll128_lines,
        win_send,
        win_recv,
        rank,
        world,
        root,
        op,
        status
    ]
);

pub use crate::program_text::{
    BLOCK_THREADS, COLLECTIVES_SOURCE, PACKET_MAX_BLOCKS, PIPE_DEPTH, PIPE_FLAGS_BYTES, PIPE_MAX_BLOCKS,
};

pub use crate::workspace::{
    LL128_LINE_BYTES, LL128_PAYLOAD_BYTES, LL128_THREADS_PER_LINE, WorkspaceArea, WorkspaceLayout,
};

/// Every generated check of the direct program: the comm-core handles' and
/// `GpuCollectiveArgs`' layouts and the protocol constants.
pub fn checks() -> String {
    crate::layout::static_checks() + &crate::layout::layout_checks(&[GPU_ARGS_LAYOUT])
}

/// The full NVRTC program: headers, the launch configuration the kernels are built for, every
/// collective kernel for every operator, and every layout check (what the build script embeds
/// and `gpu-worker precompile` puts in the cache).
pub fn program() -> String {
    direct_program(&checks(), &|_| true, ALL_REDUCE_OPS)
}

/// The program of `kernel` alone, for the reduction operator code `op` alone when it is a
/// reducing kernel: what a first launch compiles when the full program is neither embedded nor
/// in the cache (a second or two instead of a minute or more).
pub fn program_for(kernel: DirectKernel, op: u32) -> Result<String> {
    let name = kernel.name();
    if !has_direct_kernel(&name) {
        return Err(Error::invalid(format!("the direct program has no kernel {name}")));
    }
    let ops = match kernel.element {
        None => ALL_REDUCE_OPS,
        Some(_) => reduce_op_bit(op)
            .ok_or_else(|| Error::invalid(format!("{name}: reduction operator code {op} is unknown")))?,
    };
    Ok(direct_program(&checks(), &|n| n == name, ops))
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

/// Launches the direct kernels on one GPU. At the first launch it looks for the full program:
/// the image embedded at build time for this architecture ([`crate::embedded`]), else the full
/// program in the kernel cache; without either, each kernel is compiled (or found in the cache)
/// on its first launch, as a program of that kernel alone, and of a reducing kernel for the
/// launch's operator alone. Loading happens in relaxed capture mode, so a first call may be
/// captured into a CUDA graph; each function is looked up by name once.
pub struct DirectLauncher {
    ctx: Arc<CudaContext>,
    /// `sm_90` and the like: the device's architecture.
    arch: String,
    /// The modules loaded so far: the full program, or one per kernel (and operator).
    modules: Vec<Arc<KernelModule>>,
    /// The full program's module, when one was embedded or cached at the first launch.
    full: Option<Arc<KernelModule>>,
    /// Whether the first launch looked for the full program yet.
    looked_for_full: bool,
    /// Functions by kernel and the operators (`WEAVE_REDUCE_OPS` mask) of their module.
    functions: HashMap<(DirectKernel, u32), CudaFunction>,
    /// Launch each kernel overlapped with its predecessor (sm_90 and later: the kernels wait for
    /// it in their first instruction).
    overlapped: bool,
}

comm_core::debug_fields!(DirectLauncher {
    arch,
    modules: |l| l.modules.len(),
    full_program: |l| l.full.is_some(),
    functions: |l| l.functions.len(),
    overlapped,
});

impl DirectLauncher {
    /// A launcher for `ctx`'s GPU of architecture `arch`; nothing is loaded yet.
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

    /// Loads the full program now (when there is one: embedded, or in the kernel cache) and
    /// every kernel of it, so that no later [`launch`](Self::launch) loads code.
    ///
    /// With the driver's lazy loading (`CUDA_MODULE_LOADING=LAZY`, the default since CUDA 12.2),
    /// loading a module or a kernel first waits, holding the context's lock, until the GPU has
    /// run all work queued in the context: a first launch queued behind a kernel that waits for
    /// a peer would wait with it, and every other thread's driver call on the context (a
    /// proxy's copy that the waiting kernel's peers need) would wait behind the lock, so the
    /// kernel never finishes. Call this where nothing of the context waits on peers (at
    /// communicator setup). Without a full program each kernel is still compiled and loaded
    /// at its first launch.
    pub fn preload(&mut self) -> Result<()> {
        // Compiling and loading is no stream work: allowed while capturing.
        let _relaxed = weave_cuda::driver::RelaxedCapture::enter()?;
        if !self.looked_for_full {
            // Marked only once found (or found absent): after an error, the first launch
            // looks again and reports it.
            self.full = self.find_full_program()?;
            self.looked_for_full = true;
        }
        if let Some(full) = &self.full {
            let started = std::time::Instant::now();
            let names = crate::program_text::direct_kernel_names();
            for name in &names {
                // The handle is dropped: what matters is that the driver has loaded the kernel,
                // which it keeps for the module's life; `load` asks for the handle again.
                full.function(name)?;
            }
            self.log(format_args!("{} kernels of the full program loaded in {:.2?}", names.len(), started.elapsed()));
        }
        Ok(())
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
        if !self.looked_for_full {
            // Compiling and loading is no stream work: allowed while capturing.
            let _relaxed = weave_cuda::driver::RelaxedCapture::enter()?;
            self.looked_for_full = true;
            self.full = self.find_full_program()?;
        }
        let ops = match kernel.element {
            Some(_) if self.full.is_none() => reduce_op_bit(args.op)
                .ok_or_else(|| Error::invalid(format!("{kernel}: reduction operator code {} is unknown", args.op)))?,
            _ => ALL_REDUCE_OPS,
        };
        if !self.functions.contains_key(&(kernel, ops)) {
            let _relaxed = weave_cuda::driver::RelaxedCapture::enter()?;
            let f = self.load(kernel, args.op)?;
            self.functions.insert((kernel, ops), f);
        }
        let f =
            self.functions.get(&(kernel, ops)).ok_or_else(|| Error::invalid(format!("kernel {kernel} vanished")))?;
        let shape = LaunchShape { blocks, threads: BLOCK_THREADS, overlapped: self.overlapped };
        // SAFETY: every direct kernel takes exactly one GpuCollectiveArgs (its layout is checked
        // in every compile) and waits for its predecessor first; a module of one operator is
        // only used for launches of that operator (the key above); the caller guarantees the
        // addresses inside `args`.
        unsafe { launch_with_args(f, args, shape, stream, &kernel) }
    }
}

impl DirectLauncher {
    /// The full program: the embedded image for this device when there is one of this build's
    /// program that the driver runs and it loads, else the kernel cache's (when NVRTC is here
    /// to name the entry), else none.
    fn find_full_program(&mut self) -> Result<Option<Arc<KernelModule>>> {
        let started = std::time::Instant::now();
        let driver = crate::compile::driver_major();
        let images = crate::embedded::images();
        let why_not = match crate::embedded::image_for(images, &self.arch, driver) {
            None if images.is_empty() => crate::embedded::note().to_string(),
            None => format!(
                "none of the embedded images ({}) runs on {} with a CUDA {} driver",
                images
                    .iter()
                    .map(|i| format!("{} by NVRTC {}.{}", i.arch, i.nvrtc.0, i.nvrtc.1))
                    .collect::<Vec<_>>()
                    .join(", "),
                self.arch,
                driver.map_or("(unknown)".to_string(), |d| d.to_string())
            ),
            Some(image) if image.fingerprint != fingerprint(&program()) => {
                format!("the embedded {} image is of another program text than this binary's", image.arch)
            }
            Some(image) => {
                let key = {
                    let mut h = crate::program_text::Fnv128::new();
                    h.field(b"embedded").field(image.arch.as_bytes()).field(&image.fingerprint.to_le_bytes());
                    h.0
                };
                match KernelModule::load_cubin(&self.ctx, key, image.arch, image.cubin) {
                    Ok(m) => {
                        self.log(format_args!(
                            "the embedded {} image (NVRTC {}.{}, {} KiB) loaded in {:.2?}",
                            image.arch,
                            image.nvrtc.0,
                            image.nvrtc.1,
                            image.cubin.len() >> 10,
                            started.elapsed()
                        ));
                        self.modules.push(m.clone());
                        return Ok(Some(m));
                    }
                    Err(e) => format!("the embedded {} image did not load: {e}", image.arch),
                }
            }
        };
        self.log(format_args!("no embedded image used: {why_not}"));
        if !crate::compile::nvrtc_available() {
            return Ok(None);
        }
        let Some(compiled) = crate::compile::Compiler::from_env().cached(&program(), &self.arch)? else {
            return Ok(None);
        };
        let m = KernelModule::load(&self.ctx, &compiled)?;
        self.log(format_args!("the full program loaded from the kernel cache in {:.2?}", started.elapsed()));
        self.modules.push(m.clone());
        Ok(Some(m))
    }

    /// The function of `kernel`: from the full program when there is one, else from a program of
    /// that kernel alone (of a reducing kernel, for the operator code `op` alone), compiled (or
    /// found in the cache) now.
    fn load(&mut self, kernel: DirectKernel, op: u32) -> Result<CudaFunction> {
        if let Some(full) = &self.full {
            return full.function(&kernel.name());
        }
        let started = std::time::Instant::now();
        let compiled = crate::compile::Compiler::from_env().compile(&program_for(kernel, op)?, &self.arch)?;
        let operator = if kernel.element.is_some() { format!(" (operator {op})") } else { String::new() };
        self.log(format_args!(
            "kernel {kernel}{operator} for {}: {} in {:.2?}",
            self.arch,
            match compiled.cache() {
                crate::compile::CacheOutcome::Hit => "found in the kernel cache".to_string(),
                other => format!(
                    "compiled by NVRTC {} ({other:?})",
                    crate::compile::nvrtc_version().map_or("?".into(), |(a, b)| format!("{a}.{b}"))
                ),
            },
            started.elapsed()
        ));
        let m = KernelModule::load(&self.ctx, &compiled)?;
        self.modules.push(m.clone());
        m.function(&kernel.name())
    }

    /// An `info` event of [`comm_core::diagnostics::KERNELS`] naming the device and architecture.
    fn log(&self, what: std::fmt::Arguments<'_>) {
        let device = self.ctx.ordinal();
        tracing::info!(target: comm_core::diagnostics::KERNELS, device, arch = %self.arch, "direct kernels on device {device} ({}): {what}", self.arch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preload_names_every_entry_point_of_the_full_program_once() {
        let names = crate::program_text::direct_kernel_names();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "a name twice: {names:?}");
        for name in &names {
            assert!(has_direct_kernel(name), "{name} is not an entry point of the direct program");
        }
        // The launches' names are among them.
        for k in [DirectKernel::typed("weave_all_reduce_ll", "f16"), DirectKernel::untyped("weave_sendrecv")] {
            assert!(names.contains(&k.name()), "{k}");
        }
    }
    use comm_core::device::Layout;

    #[test]
    fn args_fit_the_kernel_parameter_limit() {
        assert!(std::mem::size_of::<GpuCollectiveArgs>() <= 4096);
        assert_eq!(std::mem::size_of::<GpuCollectiveArgs>(), 528);
    }

    /// Every collective kernel compiles for sm_90, with the layout of `GpuCollectiveArgs` (and
    /// every comm-core handle) checked against the C++ side. Without NVRTC this fails under `CI`
    /// and prints SKIPPED elsewhere.
    #[test]
    fn a_kernel_alone_makes_a_program_of_one_entry_point_and_operator() {
        let count = |p: &str| p.matches("\nWEAVE_REDUCING_KERNEL(").count() + p.matches("\nWEAVE_KERNEL(").count();
        let all = program();
        assert_eq!(count(&all), 10 * 9 + 9, "9 reducing families of 10 types and 9 others");
        assert!(!all.contains("#define WEAVE_REDUCE_OPS"), "the full program has every operator");
        let one = program_for(DirectKernel::typed("weave_all_reduce_ll", "f32"), 4).unwrap();
        assert_eq!(count(&one), 1);
        assert!(one.contains("WEAVE_REDUCING_KERNEL(all_reduce_ll, AllReduceLL, f32, float)"));
        assert!(one.starts_with("#define WEAVE_REDUCE_OPS 1\n"), "average is a sum: {}", &one[..40]);
        let max = program_for(DirectKernel::typed("weave_all_reduce_ll", "f32"), 3).unwrap();
        assert!(max.starts_with("#define WEAVE_REDUCE_OPS 8\n"));
        let moving = program_for(DirectKernel::untyped("weave_sendrecv"), 7).unwrap();
        assert_eq!(count(&moving), 1);
        assert!(!moving.contains("#define WEAVE_REDUCE_OPS"), "the operator of a data kernel does not matter");
        assert!(program_for(DirectKernel::typed("weave_all_reduce_ll", "f32"), 5).is_err(), "unknown operator");
        assert!(program_for(DirectKernel::typed("weave_all_reduce_ll", "f128"), 0).is_err());
        assert!(program_for(DirectKernel::untyped("weave_nonsense"), 0).is_err());
    }

    /// The build script compiles the program with the checks of `cuda/generated/direct_checks.inc`
    /// (it has no comm-core); they must be the ones comm-core generates, or the embedded images
    /// are never used. The file is embedded, so the test binary runs anywhere (a GPU bundle);
    /// `WEAVE_BLESS=1` rewrites it in the source tree.
    #[test]
    fn the_build_scripts_checks_are_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda/generated/direct_checks.inc");
        if std::env::var_os("WEAVE_BLESS").is_some() {
            std::fs::write(path, checks()).unwrap();
            return;
        }
        let file = include_str!("../cuda/generated/direct_checks.inc");
        assert!(
            file == checks(),
            "{path} differs from kernels::direct::checks(): regenerate it with \
             `WEAVE_BLESS=1 cargo test -p kernels --lib the_build_scripts_checks_are_current`"
        );
    }

    /// A first launch on a cold cache compiles one kernel's program for one operator: it must
    /// compile alone.
    #[test]
    fn a_kernel_alone_compiles_for_sm_90() {
        if !crate::compile::tests::nvrtc_or_skip("a_kernel_alone_compiles") {
            return;
        }
        for (k, op) in [
            (DirectKernel::typed("weave_all_reduce_pipelined", "f32"), 4),
            (DirectKernel::typed("weave_all_reduce_ll", "bf16"), 3),
            (DirectKernel::untyped("weave_broadcast_pipelined"), 0),
        ] {
            let started = std::time::Instant::now();
            let compiled = crate::compile::Compiler::without_cache().compile(&program_for(k, op).unwrap(), "sm_90");
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
        let source = direct_program(&crate::layout::layout_checks(&[wrong]), &|_| false, ALL_REDUCE_OPS);
        let r = crate::compile::Compiler::without_cache().compile(&source, "sm_90");
        assert!(r.is_err(), "a wrong offset compiled");
    }
}
