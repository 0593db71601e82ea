//! What the GPU examples share: the start of a rank.

use std::error::Error;
use std::sync::Arc;

use collectives::Communicator;
use cudarc::driver::CudaStream;

/// A rank with a GPU path, ready to run device collectives.
pub(crate) struct GpuRank {
    /// The rank's communicator, from the launcher's environment.
    pub(crate) comm: Communicator,
    /// A new stream on the rank's GPU (its context: [`CudaStream::context`]).
    pub(crate) stream: Arc<CudaStream>,
}

/// This rank with its GPU, or `None`, after saying why, where the rank has no GPU path.
pub(crate) fn gpu_rank() -> Result<Option<GpuRank>, Box<dyn Error>> {
    // weave's diagnostics: `RUST_LOG=weave=info` shows the communicator's creation, kernel loads
    // and each call's plan.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("weave=warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let comm = Communicator::from_env()?;
    let Some(ctx) = comm.gpu_context() else {
        println!("rank {}: no GPU path (no CUDA device, or not every peer reachable through CUDA IPC)", comm.rank());
        return Ok(None);
    };
    let stream = ctx.new_stream()?;
    Ok(Some(GpuRank { comm, stream }))
}
