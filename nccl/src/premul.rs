//! `ncclRedOpCreatePreMulSum`: operators that multiply each rank's input by a scalar, then sum.
//!
//! How it runs: a small scale kernel of this library (compiled with NVRTC once per device, on
//! the first call that needs it) writes `scalar × input` on the collective's stream, and
//! weave's sum runs on the result — so every rank's own scalar applies to its own input, as in
//! NCCL. All-reduce scales into the receive buffer and reduces there in place; reduce-scatter
//! and reduce scale into a stream-ordered temporary (`weave_cuda::StreamMemory`, freed on the
//! stream after the call, so graph capture works). A device scalar (`ncclScalarDevice`) is read by
//! the kernel when it runs; a host scalar (`ncclScalarHostImmediate`) is copied at creation.
//! Every data type is accepted: half and bfloat16 multiply in float and round back, as NCCL's
//! kernels do; FP8 multiplies in double and rounds back with weave's conversions
//! (`weave/fp8.cuh`: nearest, ties to even, saturating), so each product is rounded to the type
//! once before the sum, which then rounds once more.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use collectives::DataType;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use kernels::{Compiler, KernelModule};

use crate::abi::{NcclRedOp, NcclResult};
use crate::error::Fail;

/// Where the scalar is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// Copied from host memory at creation: the element's bytes, zero-extended to 8.
    Host(u64),
    /// A device address read when the kernel runs.
    Device(u64),
}

/// One created operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreMul {
    /// The element type it was created for (calls must use the same).
    pub dtype: DataType,
    /// Its scalar.
    pub scalar: Scalar,
}

/// The operators of one communicator; the operator value is `ncclNumOps + slot`.
#[derive(Debug, Default)]
pub struct PreMulTable {
    slots: Vec<Option<PreMul>>,
}

/// Most live operators per communicator (NCCL's limit is far higher; programs make a few).
const MAX_OPS: usize = 1 << 16;

impl PreMulTable {
    /// Stores `op` and returns its operator value.
    pub fn create(&mut self, op: PreMul) -> Result<NcclRedOp, Fail> {
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.slots.len() < MAX_OPS => {
                self.slots.push(None);
                self.slots.len() - 1
            }
            None => {
                return Err(Fail::usage(format!(
                    "{MAX_OPS} pre-multiplied-sum operators are alive on this communicator; destroy some with \
                     ncclRedOpDestroy"
                )));
            }
        };
        self.slots[slot] = Some(op);
        Ok(NcclRedOp(NcclRedOp::NUM_OPS.0 + slot as i32))
    }

    /// The operator with value `op`, if it is alive.
    pub fn get(&self, op: NcclRedOp) -> Option<PreMul> {
        let slot = usize::try_from(op.0.checked_sub(NcclRedOp::NUM_OPS.0)?).ok()?;
        self.slots.get(slot).copied().flatten()
    }

    /// Destroys operator `op`.
    pub fn destroy(&mut self, op: NcclRedOp) -> Result<(), Fail> {
        let slot = usize::try_from(op.0 - NcclRedOp::NUM_OPS.0).ok().filter(|&s| s < self.slots.len());
        match slot.and_then(|s| self.slots[s].take()) {
            Some(_) => Ok(()),
            None => Err(Fail::invalid(format!(
                "ncclRedOpDestroy: operator {} is not a live operator of ncclRedOpCreatePreMulSum on this communicator",
                op.0
            ))),
        }
    }
}

/// The scale kernels: one per element type, `dst[i] = src[i] × s` with `s` read from the
/// device pointer when non-null, else from the 8 host bytes passed by value.
const SOURCE: &str = r#"
typedef unsigned long long u64;
__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float b2f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short f2b(float f) { unsigned short b; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f)); return b; }
#define GRID_LOOP for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
#define PLAIN(NAME, T) extern "C" __global__ void NAME(const T* src, T* dst, u64 n, const T* ds, u64 hbits) { \
  T s = ds ? *ds : *(const T*)&hbits; GRID_LOOP dst[i] = (T)(src[i] * s); }
#define HALF(NAME, TO, FROM) extern "C" __global__ void NAME(const unsigned short* src, unsigned short* dst, u64 n, \
  const unsigned short* ds, u64 hbits) { float s = TO(ds ? *ds : (unsigned short)hbits); GRID_LOOP dst[i] = FROM(TO(src[i]) * s); }
PLAIN(weave_premul_f64, double)
PLAIN(weave_premul_f32, float)
PLAIN(weave_premul_i64, long long)
PLAIN(weave_premul_u64, unsigned long long)
PLAIN(weave_premul_i32, int)
PLAIN(weave_premul_u32, unsigned int)
PLAIN(weave_premul_i8, signed char)
PLAIN(weave_premul_u8, unsigned char)
HALF(weave_premul_f16, h2f, f2h)
HALF(weave_premul_bf16, b2f, f2b)
#define FP8(NAME, FORMAT) extern "C" __global__ void NAME(const unsigned char* src, unsigned char* dst, u64 n, \
  const unsigned char* ds, u64 hbits) { double s = weave::fp8_to_double(ds ? *ds : (unsigned char)hbits, FORMAT); \
  GRID_LOOP dst[i] = (unsigned char)weave::fp8_from_double(weave::fp8_to_double(src[i], FORMAT) * s, FORMAT); }
FP8(weave_premul_f8e4m3, weave::FP8_E4M3)
FP8(weave_premul_f8e5m2, weave::FP8_E5M2)
"#;

/// Loaded modules, per CUDA context.
static MODULES: Mutex<Option<HashMap<usize, Arc<KernelModule>>>> = Mutex::new(None);

/// The scale kernels' module on `ctx`'s GPU: compiled with weave's device headers (the FP8
/// conversions are `weave/fp8.cuh`'s) through the kernel cache, once per context.
fn module(ctx: &Arc<CudaContext>) -> Result<Arc<KernelModule>, Fail> {
    let mut cache = MODULES.lock().map_err(|_| Fail::new(NcclResult::INTERNAL_ERROR, "premul cache poisoned"))?;
    let key = ctx.cu_ctx() as usize;
    if let Some(m) = cache.as_ref().and_then(|c| c.get(&key)) {
        return Ok(m.clone());
    }
    let m = KernelModule::compile_and_load(ctx, &Compiler::from_env(), SOURCE).map_err(|e| {
        Fail::new(
            NcclResult::UNHANDLED_CUDA_ERROR,
            format!("the pre-multiplied-sum scale kernels did not compile or load (is libnvrtc installed?): {e}"),
        )
    })?;
    cache.get_or_insert_with(HashMap::new).insert(key, m.clone());
    Ok(m)
}

/// Enqueues `dst[i] = src[i] × scalar` for `count` elements on `stream`.
///
/// # Safety
/// `src` and `dst` must be device memory valid for `count` elements of `op.dtype` (equal or
/// disjoint) until the kernel completes; a device scalar must stay valid as long.
pub unsafe fn scale(op: PreMul, src: u64, dst: u64, count: usize, stream: &Arc<CudaStream>) -> Result<(), Fail> {
    if count == 0 {
        return Ok(());
    }
    let m = module(stream.context())?;
    let name = format!("weave_premul_{}", op.dtype.rust_name());
    let f: CudaFunction = m.function(&name)?;
    let (dscalar, hbits) = match op.scalar {
        Scalar::Device(p) => (p, 0u64),
        Scalar::Host(bits) => (0u64, bits),
    };
    let n = count as u64;
    let blocks = count.div_ceil(256).min(1024) as u32;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut launch = stream.launch_builder(&f);
    launch.arg(&src).arg(&dst).arg(&n).arg(&dscalar).arg(&hbits);
    // SAFETY: the kernel's five parameters are two pointers, a u64 count, a pointer and a u64,
    // matching the arguments pushed; the memory is valid as the caller guarantees.
    unsafe { launch.launch(cfg) }
        .map_err(|e| Fail::from(weave_cuda::driver::from_driver("launch the scale kernel", e)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_kernels_compile_for_every_data_type() {
        if !kernels::compile::nvrtc_available() {
            assert!(
                std::env::var_os("CI").is_none(),
                "NVRTC not found and CI is set: the scale kernels must compile in CI"
            );
            eprintln!("SKIPPED: scale_kernels_compile_for_every_data_type: NVRTC not found");
            return;
        }
        let k = Compiler::without_cache()
            .compile(&kernels::source::program(SOURCE), "sm_90")
            .unwrap_or_else(|e| panic!("the scale kernels do not compile:\n{e}"));
        for t in DataType::ALL {
            let name = format!("weave_premul_{}", t.rust_name());
            assert!(k.ptx().contains(&format!(".entry {name}(")), "PTX lacks {name}");
        }
    }

    #[test]
    fn operators_get_values_from_num_ops_and_slots_are_reused() {
        let mut t = PreMulTable::default();
        let op = PreMul { dtype: DataType::F32, scalar: Scalar::Host(0) };
        let a = t.create(op).unwrap();
        let b = t.create(op).unwrap();
        assert_eq!((a.0, b.0), (5, 6));
        assert_eq!(t.get(a), Some(op));
        assert_eq!(t.get(NcclRedOp::SUM), None);
        t.destroy(a).unwrap();
        assert_eq!(t.get(a), None);
        assert!(t.destroy(a).is_err());
        assert!(t.destroy(NcclRedOp(2)).is_err());
        assert_eq!(t.create(op).unwrap(), a);
    }
}
