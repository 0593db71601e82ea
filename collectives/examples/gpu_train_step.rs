//! A data-parallel training loop on GPUs, as N ranks (one GPU each):
//!
//! ```text
//! cargo build --release -p collectives --example gpu_train_step
//! cargo xtask launch -n 2 -- target/release/examples/gpu_train_step
//! ```
//!
//! The model is a linear regression of `PARAMS` weights (1 MiB of `f32`). Every rank holds its
//! own shard of the training rows on its GPU. Each step, every rank computes the gradient of the
//! mean squared error on its shard with its own CUDA kernels, averages the gradients across
//! ranks with one `all_reduce_device_in_place(.., ReduceOp::Avg, ..)`, and takes an SGD step.
//! The weights start as rank 0's (a broadcast), so with equal averaged gradients every rank
//! holds the same weights after every step.
//!
//! At the end every rank checks that (1) its weights are bit for bit rank 0's, (2) the weights
//! match a reference computed on the host from every rank's shard, and (3) the loss went down.
//! Any failure makes the process exit non-zero (and `cargo xtask launch` with it).

mod common;

use std::error::Error;
use std::sync::Arc;

use collectives::ReduceOp;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use kernels::{Compiler, KernelModule};

/// Weights of the model: 1 MiB of `f32` gradient per step.
const PARAMS: usize = 1 << 18;
/// Training rows on each rank.
const ROWS: usize = 64;
/// SGD steps.
const STEPS: usize = 10;
/// Learning rate: the rows are nearly orthogonal with squared norms near 1, so each step keeps
/// about 1 - LEARNING_RATE of the residual (the loss falls to about an eighth in 10 steps and
/// stays far above rounding noise).
const LEARNING_RATE: f32 = 0.1;

/// The rank's CUDA kernels: residual r = X w - y (a block per row), gradient g = Xᵀ r / rows (a
/// thread per weight), and the SGD update w -= lr g.
const TRAIN_KERNELS: &str = r#"
extern "C" __global__ void residual(const float* x, const float* w, const float* y, float* r,
                                    unsigned rows, unsigned params) {
  __shared__ float partial[256];
  const unsigned row = blockIdx.x;
  if (row >= rows) return;
  float sum = 0.0f;
  for (unsigned j = threadIdx.x; j < params; j += blockDim.x) sum += x[(size_t)row * params + j] * w[j];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) r[row] = partial[0] - y[row];
}

extern "C" __global__ void gradient(const float* x, const float* r, float* g, unsigned rows,
                                    unsigned params) {
  const unsigned j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= params) return;
  float sum = 0.0f;
  for (unsigned i = 0; i < rows; ++i) sum += x[(size_t)i * params + j] * r[i];
  g[j] = sum / (float)rows;
}

extern "C" __global__ void sgd(float* w, const float* g, float lr, unsigned params) {
  const unsigned j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < params) w[j] -= lr * g[j];
}
"#;

/// Threads per block of every training kernel (the residual's shared array holds this many).
const THREADS: u32 = 256;

/// A rank's training rows: features in [-1, 1) from a small generator seeded by the rank, and
/// targets from a fixed "true" weight vector, so every rank can rebuild every shard.
fn shard(rank: usize) -> (Vec<f32>, Vec<f32>) {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (rank as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    // Scaled so a row's squared norm is about 1.
    let scale = (3.0 / PARAMS as f32).sqrt();
    let x: Vec<f32> = (0..ROWS * PARAMS).map(|_| next() * scale).collect();
    let y = (0..ROWS).map(|i| (0..PARAMS).map(|j| x[i * PARAMS + j] * true_weight(j)).sum()).collect();
    (x, y)
}

fn true_weight(j: usize) -> f32 {
    ((j % 17) as f32 - 8.0) / 8.0
}

/// The same training on the host, over every rank's shard: the weights after `STEPS` steps and
/// the loss before the first and after the last.
fn host_reference(world: usize) -> (Vec<f32>, f64, f64) {
    let shards: Vec<_> = (0..world).map(shard).collect();
    let mut w = vec![0.0f32; PARAMS];
    let loss = |w: &[f32]| -> f64 {
        let mut total = 0.0f64;
        for (x, y) in &shards {
            for i in 0..ROWS {
                let r: f32 = x[i * PARAMS..(i + 1) * PARAMS].iter().zip(w).map(|(a, b)| a * b).sum::<f32>() - y[i];
                total += f64::from(r) * f64::from(r);
            }
        }
        total / (world * ROWS) as f64
    };
    let first = loss(&w);
    for _ in 0..STEPS {
        let mut g = vec![0.0f32; PARAMS];
        for (x, y) in &shards {
            let r: Vec<f32> = (0..ROWS)
                .map(|i| x[i * PARAMS..(i + 1) * PARAMS].iter().zip(&w).map(|(a, b)| a * b).sum::<f32>() - y[i])
                .collect();
            for (i, ri) in r.iter().enumerate() {
                for (gj, xij) in g.iter_mut().zip(&x[i * PARAMS..(i + 1) * PARAMS]) {
                    *gj += xij * ri / (ROWS * world) as f32;
                }
            }
        }
        for (wj, gj) in w.iter_mut().zip(&g) {
            *wj -= LEARNING_RATE * gj;
        }
    }
    let last = loss(&w);
    (w, first, last)
}

/// The compiled training kernels.
struct Trainer {
    residual: CudaFunction,
    gradient: CudaFunction,
    sgd: CudaFunction,
    stream: Arc<CudaStream>,
}

impl Trainer {
    /// One step's local part: the residuals and the shard's gradient into `grad`.
    fn gradient(
        &self,
        x: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        r: &mut CudaSlice<f32>,
        grad: &mut CudaSlice<f32>,
    ) -> Result<(), Box<dyn Error>> {
        let (rows, params) = (ROWS as u32, PARAMS as u32);
        let mut launch = self.stream.launch_builder(&self.residual);
        launch.arg(x).arg(w).arg(y).arg(&mut *r).arg(&rows).arg(&params);
        let per_row = LaunchConfig { grid_dim: (rows, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: residual(x, w, y, r, rows, params) reads rows x params of x, params of w and
        // rows of y and writes rows of r: exactly the buffers' lengths.
        unsafe { launch.launch(per_row) }?;
        let mut launch = self.stream.launch_builder(&self.gradient);
        launch.arg(x).arg(&*r).arg(&mut *grad).arg(&rows).arg(&params);
        // SAFETY: gradient(x, r, g, rows, params) reads x and r as above and writes params of g.
        unsafe { launch.launch(per_weight()) }?;
        Ok(())
    }

    /// w -= lr * grad.
    fn update(&self, w: &mut CudaSlice<f32>, grad: &CudaSlice<f32>) -> Result<(), Box<dyn Error>> {
        let (lr, params) = (LEARNING_RATE, PARAMS as u32);
        let mut launch = self.stream.launch_builder(&self.sgd);
        launch.arg(w).arg(grad).arg(&lr).arg(&params);
        // SAFETY: sgd(w, g, lr, params) reads and writes params elements of w and reads params of g.
        unsafe { launch.launch(per_weight()) }?;
        Ok(())
    }
}

fn per_weight() -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((PARAMS as u32).div_ceil(THREADS), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Sum of squared residuals of the shard, on the host (from the residuals the GPU computed).
fn shard_loss(residuals: &[f32]) -> f64 {
    residuals.iter().map(|&r| f64::from(r) * f64::from(r)).sum::<f64>()
}

fn main() -> Result<(), Box<dyn Error>> {
    let started = std::time::Instant::now();
    let Some(common::GpuRank { comm, stream }) = common::gpu_rank()? else { return Ok(()) };
    let (me, n) = (comm.rank(), comm.world_size());
    let module = KernelModule::compile_and_load(stream.context(), &Compiler::from_env(), TRAIN_KERNELS)?;
    let trainer = Trainer {
        residual: module.function("residual")?,
        gradient: module.function("gradient")?,
        sgd: module.function("sgd")?,
        stream: stream.clone(),
    };

    // This rank's shard, and rank 0's initial weights on every rank.
    let (x_host, y_host) = shard(me);
    let x = stream.clone_htod(&x_host)?;
    let y = stream.clone_htod(&y_host)?;
    let initial = stream.clone_htod(&vec![if me == 0 { 0.0f32 } else { f32::NAN }; PARAMS])?;
    let mut w = stream.alloc_zeros::<f32>(PARAMS)?;
    comm.broadcast_device(&initial, &mut w, 0, &stream)?;
    let mut grad = stream.alloc_zeros::<f32>(PARAMS)?;
    let mut r = stream.alloc_zeros::<f32>(ROWS)?;

    let mut first_local = 0.0f64;
    for step in 0..STEPS {
        trainer.gradient(&x, &y, &w, &mut r, &mut grad)?;
        if step == 0 {
            first_local = shard_loss(&stream.clone_dtoh(&r)?);
        }
        comm.all_reduce_device_in_place(&mut grad, ReduceOp::Avg, &stream)?;
        if step == 0 && me == 0 {
            stream.synchronize()?;
            println!(
                "rank 0: communicator, training kernels and the first 1 MiB all_reduce done {:.2?} after start",
                started.elapsed()
            );
        }
        trainer.update(&mut w, &grad)?;
    }
    trainer.gradient(&x, &y, &w, &mut r, &mut grad)?;
    let last_local = shard_loss(&stream.clone_dtoh(&r)?);
    // The loss over every rank's rows, before the first step and after the last.
    let mut losses = stream.clone_htod(&[first_local, last_local])?;
    comm.all_reduce_device_in_place(&mut losses, ReduceOp::Sum, &stream)?;
    let losses = stream.clone_dtoh(&losses)?;
    let (first_loss, last_loss) = (losses[0] / (n * ROWS) as f64, losses[1] / (n * ROWS) as f64);

    // Rank 0's weights next to this rank's.
    let mut reference = stream.alloc_zeros::<f32>(PARAMS)?;
    comm.broadcast_device(&w, &mut reference, 0, &stream)?;
    let mine = stream.clone_dtoh(&w)?;
    let rank0 = stream.clone_dtoh(&reference)?;
    stream.synchronize()?;
    comm.check_gpu()?;

    let differing = mine.iter().zip(&rank0).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    if differing > 0 {
        return Err(format!("rank {me}: {differing} of {PARAMS} weights differ from rank 0's").into());
    }
    let (host_w, host_first, host_last) = host_reference(n);
    let worst = mine.iter().zip(&host_w).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    if worst > 1e-3 {
        return Err(format!("rank {me}: weights differ from the host reference by up to {worst}").into());
    }
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-3 * b.abs().max(1e-6);
    if !close(first_loss, host_first) || !close(last_loss, host_last) {
        return Err(format!(
            "rank {me}: loss {first_loss:.6} -> {last_loss:.6}, the host reference {host_first:.6} -> {host_last:.6}"
        )
        .into());
    }
    if last_loss >= first_loss {
        return Err(format!("rank {me}: the loss did not go down ({first_loss:.6} -> {last_loss:.6})").into());
    }
    println!(
        "rank {me} of {n}: {STEPS} steps of {PARAMS} weights, loss {first_loss:.4} -> {last_loss:.4}, weights equal \
         on every rank and to the host reference (max diff {worst:.2e}), {:.2?} in all",
        started.elapsed()
    );
    Ok(())
}
