//! The conversion kernels (`cuda/convert.cu`): an FP8 buffer widened to the type its reductions
//! are carried in (e4m3 to `f32`, e5m2 to `f64`) and narrowed back, with the conversions of
//! `weave/fp8.cuh` (round to nearest even, saturating to the largest finite value, as NVIDIA's
//! `__NV_SATFINITE`).
//!
//! The program is small: a [`Converter`] compiles it through the kernel cache (or finds it
//! there) and loads it where the GPU engine is built, before any kernel of the context can wait
//! on a peer (see [`crate::direct::DirectLauncher::preload`] for why loading must not come
//! later).

use std::sync::Arc;

use comm_core::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DeviceRepr};

use crate::compile::Compiler;
use crate::launch::{LaunchShape, launch_with_args};
use crate::module::KernelModule;

/// The conversion kernels' CUDA C++ source.
pub const CONVERT_SOURCE: &str = include_str!("../cuda/convert.cu");

/// The full NVRTC program of the conversion kernels (what `gpu-worker precompile` caches).
pub fn program() -> String {
    crate::source::program(CONVERT_SOURCE)
}

/// Threads per block of a conversion kernel.
const THREADS: u32 = 256;
/// Most blocks of a conversion kernel (a grid-stride loop covers the rest).
const MAX_BLOCKS: u32 = 1024;

/// An 8-bit float format the kernels convert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// 4 exponent bits, 3 mantissa bits; carried in `f32`.
    E4M3,
    /// 5 exponent bits, 2 mantissa bits; carried in `f64`.
    E5M2,
}

/// Which way a conversion goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// 8-bit elements to wide ones (exact).
    Widen,
    /// Wide elements to 8-bit ones (rounded once).
    Narrow,
}

impl Fp8Format {
    /// Bytes of the wide element this format's reductions are carried in.
    pub const fn wide_bytes(self) -> usize {
        match self {
            Fp8Format::E4M3 => 4,
            Fp8Format::E5M2 => 8,
        }
    }

    /// The kernel converting this format in `direction`.
    pub const fn kernel(self, direction: Direction) -> &'static str {
        match (self, direction) {
            (Fp8Format::E4M3, Direction::Widen) => "weave_widen_f8e4m3",
            (Fp8Format::E4M3, Direction::Narrow) => "weave_narrow_f8e4m3",
            (Fp8Format::E5M2, Direction::Widen) => "weave_widen_f8e5m2",
            (Fp8Format::E5M2, Direction::Narrow) => "weave_narrow_f8e5m2",
        }
    }
}

/// The one parameter of every conversion kernel (`weave::ConvertArgs` in `cuda/convert.cu`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ConvertArgs {
    /// Device address of the elements read.
    pub src: u64,
    /// Device address of the elements written (disjoint from `src`).
    pub dst: u64,
    /// Elements to convert.
    pub count: u64,
}

// SAFETY: three u64 fields, `#[repr(C)]`: the kernel's `weave::ConvertArgs` byte for byte
// (its size is asserted in convert.cu).
unsafe impl DeviceRepr for ConvertArgs {}

/// The conversion kernels, loaded on one GPU.
pub struct Converter {
    /// Keeps the functions' module loaded.
    _module: Arc<KernelModule>,
    /// The kernels in [`Converter::KERNELS`] order.
    functions: Vec<(Fp8Format, Direction, CudaFunction)>,
}

impl std::fmt::Debug for Converter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Converter").field("kernels", &self.functions.len()).finish()
    }
}

impl Converter {
    /// Every conversion kernel.
    const KERNELS: [(Fp8Format, Direction); 4] = [
        (Fp8Format::E4M3, Direction::Widen),
        (Fp8Format::E4M3, Direction::Narrow),
        (Fp8Format::E5M2, Direction::Widen),
        (Fp8Format::E5M2, Direction::Narrow),
    ];

    /// Compiles the program for `ctx`'s GPU through `compiler` (its cache first), loads it and
    /// looks up every kernel, so a later [`launch`](Self::launch) loads nothing. Compiling and
    /// loading is no stream work: allowed while a stream of the context is being captured.
    pub fn load(ctx: &Arc<CudaContext>, compiler: &Compiler) -> Result<Self> {
        let _relaxed = weave_cuda::driver::RelaxedCapture::enter()?;
        let module = KernelModule::compile_and_load(ctx, compiler, CONVERT_SOURCE)?;
        let functions = Self::KERNELS
            .iter()
            .map(|&(format, direction)| Ok((format, direction, module.function(format.kernel(direction))?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Converter { _module: module, functions })
    }

    /// Enqueues the conversion of `count` elements of `format` in `direction` from `src` to
    /// `dst` on `stream`.
    ///
    /// # Safety
    /// `src` must be device memory valid for `count` source elements (1 byte when widening,
    /// [`Fp8Format::wide_bytes`] when narrowing) and `dst` for `count` destination elements,
    /// disjoint, until the kernel completes on `stream`.
    pub unsafe fn launch(
        &self,
        format: Fp8Format,
        direction: Direction,
        src: u64,
        dst: u64,
        count: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let f = self
            .functions
            .iter()
            .find(|(fo, d, _)| *fo == format && *d == direction)
            .map(|(_, _, f)| f)
            .ok_or_else(|| Error::invalid(format!("no conversion kernel {}", format.kernel(direction))))?;
        let blocks = count.div_ceil(THREADS as usize).min(MAX_BLOCKS as usize) as u32;
        let args = ConvertArgs { src, dst, count: count as u64 };
        let shape = LaunchShape { blocks, threads: THREADS, overlapped: false };
        // SAFETY: every conversion kernel takes one ConvertArgs; the caller guarantees the
        // addresses and counts inside it.
        unsafe { launch_with_args(f, &args, shape, stream, &format.kernel(direction)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::tests::nvrtc_or_skip;

    #[test]
    fn conversion_program_compiles_for_sm_90_with_every_kernel() {
        if !nvrtc_or_skip("conversion_program_compiles_for_sm_90_with_every_kernel") {
            return;
        }
        let k = Compiler::without_cache()
            .compile(&program(), "sm_90")
            .unwrap_or_else(|e| panic!("the conversion kernels do not compile:\n{e}"));
        for (format, direction) in Converter::KERNELS {
            let name = format.kernel(direction);
            assert!(k.ptx().contains(&format!(".entry {name}(")), "PTX lacks kernel {name}");
        }
        // Integer conversions only: no call into the toolkit's FP8 helpers.
        assert!(!k.ptx().contains("e4m3x2") && !k.ptx().contains("e5m2x2"), "no hardware FP8 conversion");
    }
}
