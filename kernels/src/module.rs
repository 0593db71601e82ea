//! Compiled code loaded into a CUDA context.

use std::sync::{Arc, Mutex, Weak};

use comm_core::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, sys};
use cudarc::nvrtc::Ptx;

use crate::arch::device_arch;
use crate::compile::{CompiledKernel, Compiler};

/// A module loaded into one context, from a [`CompiledKernel`]: the CUBIN when it was compiled
/// for this device's architecture, else the PTX (which the driver compiles for the device).
///
/// [`load`](Self::load) shares modules: while one is alive, loading the same compiled code
/// (same [`CompiledKernel::key`]) into the same context returns it again.
pub struct KernelModule {
    ctx: Arc<CudaContext>,
    module: Arc<CudaModule>,
    key: u128,
    from_cubin: bool,
}

impl std::fmt::Debug for KernelModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelModule")
            .field("device", &self.ctx.ordinal())
            .field("key", &crate::compile::key_hex(self.key))
            .field("from_cubin", &self.from_cubin)
            .finish()
    }
}

struct Entry {
    ctx: usize,
    key: u128,
    module: Weak<KernelModule>,
}

static MODULES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// The module loaded from `key` in context `ctx_id`, if one lives.
fn loaded(ctx_id: usize, key: u128) -> Option<Arc<KernelModule>> {
    let mut modules = MODULES.lock().unwrap_or_else(|p| p.into_inner());
    modules.retain(|e| e.module.strong_count() > 0);
    modules.iter().find(|e| e.ctx == ctx_id && e.key == key).and_then(|e| e.module.upgrade())
}

/// Keeps `m` (just loaded in context `ctx_id`) for later loads, unless another thread loaded
/// the same meanwhile: then that one is returned and `m` unloads. The lock is not held while a
/// module loads, since a load may wait for the GPU work queued before it, and that work (a
/// collective of another GPU of this process) may need another thread's load to finish.
fn remember(ctx_id: usize, m: Arc<KernelModule>) -> Arc<KernelModule> {
    let mut modules = MODULES.lock().unwrap_or_else(|p| p.into_inner());
    let key = m.key;
    if let Some(first) = modules.iter().find(|e| e.ctx == ctx_id && e.key == key).and_then(|e| e.module.upgrade()) {
        return first;
    }
    modules.push(Entry { ctx: ctx_id, key, module: Arc::downgrade(&m) });
    m
}

impl KernelModule {
    /// Loads `kernel` into `ctx`, or returns the module already loaded from it there.
    pub fn load(ctx: &Arc<CudaContext>, kernel: &CompiledKernel) -> Result<Arc<KernelModule>> {
        // The raw context identifies it: while a cached module lives, it holds the context, so
        // the handle cannot be reused by another context.
        let ctx_id = ctx.cu_ctx() as usize;
        if let Some(m) = loaded(ctx_id, kernel.key()) {
            return Ok(m);
        }
        let arch = device_arch(ctx)?;
        let cubin = kernel.cubin().filter(|_| kernel.arch() == arch);
        let load_ptx = |earlier: String| {
            ctx.load_module(Ptx::from_src(kernel.ptx())).map_err(|e| Error::Cuda {
                operation: format!(
                    "cuModuleLoadData of PTX for {} on device {} ({arch})",
                    kernel.arch(),
                    ctx.ordinal()
                ),
                message: format!("{e}{earlier}"),
            })
        };
        let (module, from_cubin) = match cubin.map(|c| ctx.load_module(Ptx::from_binary(c.to_vec()))) {
            Some(Ok(m)) => (m, true),
            Some(Err(e)) => (load_ptx(format!("; loading the CUBIN failed first: {e}"))?, false),
            None => (load_ptx(String::new())?, false),
        };
        Ok(remember(ctx_id, Arc::new(KernelModule { ctx: ctx.clone(), module, key: kernel.key(), from_cubin })))
    }

    /// Loads a CUBIN compiled for `arch` (an image embedded at build time) into `ctx` under
    /// `key`, or returns the module already loaded under that key there.
    pub fn load_cubin(ctx: &Arc<CudaContext>, key: u128, arch: &str, cubin: &[u8]) -> Result<Arc<KernelModule>> {
        let ctx_id = ctx.cu_ctx() as usize;
        if let Some(m) = loaded(ctx_id, key) {
            return Ok(m);
        }
        let module = ctx.load_module(Ptx::from_binary(cubin.to_vec())).map_err(|e| Error::Cuda {
            operation: format!("cuModuleLoadData of the {arch} CUBIN on device {}", ctx.ordinal()),
            message: e.to_string(),
        })?;
        Ok(remember(ctx_id, Arc::new(KernelModule { ctx: ctx.clone(), module, key, from_cubin: true })))
    }

    /// Compiles [`crate::source::program`]`(extra_source)` for the device's architecture with
    /// `compiler` (through its cache) and loads it.
    pub fn compile_and_load(ctx: &Arc<CudaContext>, compiler: &Compiler, extra_source: &str) -> Result<Arc<Self>> {
        let arch = device_arch(ctx)?;
        let kernel = compiler.compile(&crate::source::program(extra_source), &arch)?;
        Self::load(ctx, &kernel)
    }

    /// The kernel `name` (an `extern "C" __global__` function of the module).
    pub fn function(&self, name: &str) -> Result<CudaFunction> {
        if name.is_empty() || name.contains('\0') {
            return Err(Error::invalid(format!("kernel name {name:?} is empty or contains a NUL byte")));
        }
        self.module.load_function(name).map_err(|e| {
            let hint = if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_FOUND {
                " (no such kernel in the module: is it declared extern \"C\" __global__?)"
            } else {
                ""
            };
            Error::Cuda { operation: format!("cuModuleGetFunction {name:?}"), message: format!("{e}{hint}") }
        })
    }

    /// The context the module lives in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The key of the compiled code it was loaded from.
    pub fn key(&self) -> u128 {
        self.key
    }

    /// True when the CUBIN was loaded (no driver JIT), false for PTX.
    pub fn from_cubin(&self) -> bool {
        self.from_cubin
    }
}
