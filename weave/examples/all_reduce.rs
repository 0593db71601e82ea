//! Sums a vector across ranks, gathers every rank's number and broadcasts rank 0's message —
//! through the `weave` crate alone.
//!
//! ```text
//! cargo run -p weave --example all_reduce              # starts 4 ranks of itself
//! cargo run -p weave --example all_reduce -- 8         # 8 ranks
//! cargo xtask launch -n 4 -- target/debug/examples/all_reduce   # ranks started by a launcher
//! ```
//!
//! Started without a launcher (no `RANK` in the environment) it launches its own ranks with
//! `weave-launch`, the library behind `cargo xtask launch`, and reports how they ended. Each rank
//! checks every result and prints one line; any wrong element or error makes it exit 1.
//!
//! weave reports through `tracing`; each rank installs a subscriber on stderr filtered by
//! `RUST_LOG`: `RUST_LOG=weave=debug` shows the communicator's creation (transports to each
//! peer, timings) and the plan of every call, `RUST_LOG=weave::plan=info` the plans alone.

use std::time::{Duration, Instant};

use weave::{Communicator, Error, ReduceOp, Result};

/// Elements of the summed vector (4 MiB of f32).
const ELEMENTS: usize = 1 << 20;

/// Ranks started when no launcher did and no count is given.
const DEFAULT_RANKS: usize = 4;

fn main() {
    let outcome = if std::env::var_os("RANK").is_some() { rank_main() } else { launch_ranks() };
    if let Err(e) = outcome {
        eprintln!("all_reduce: {e}");
        std::process::exit(1);
    }
}

/// One rank: the three collectives, each result checked.
fn rank_main() -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("weave=warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let comm = Communicator::from_env()?;
    let (rank, n) = (comm.rank(), comm.world_size());

    // Every rank contributes rank + 1 in each element: the sum is n(n + 1) / 2 everywhere.
    let mine = vec![(rank + 1) as f32; ELEMENTS];
    let mut sum = vec![0.0f32; ELEMENTS];
    let start = Instant::now();
    comm.all_reduce(&mine, &mut sum, ReduceOp::Sum)?;
    let took = start.elapsed();
    let expected = (n * (n + 1) / 2) as f32;
    if let Some(i) = sum.iter().position(|&x| x != expected) {
        return Err(wrong("all_reduce", i, sum[i], expected));
    }

    // Each rank's number, in rank order, on every rank.
    let mut ranks = vec![0u32; n];
    comm.all_gather(&[rank as u32], &mut ranks)?;
    if let Some(i) = (0..n).find(|&i| ranks[i] != i as u32) {
        return Err(wrong("all_gather", i, ranks[i], i));
    }

    // Rank 0's message, on every rank.
    let mut message = [0u8; 16];
    if rank == 0 {
        message.copy_from_slice(b"hello from rank0");
    }
    comm.broadcast_in_place(&mut message, 0)?;
    if &message != b"hello from rank0" {
        return Err(Error::invalid(format!("broadcast gave {:?}", String::from_utf8_lossy(&message))));
    }

    println!(
        "rank {rank} of {n}: all_reduce of {} MiB in {took:.1?} (every element {expected}), all_gather and broadcast OK",
        (ELEMENTS * 4) >> 20
    );
    Ok(())
}

/// A wrong element of `call`'s result, as an error.
fn wrong(call: &str, index: usize, got: impl std::fmt::Debug, expected: impl std::fmt::Debug) -> Error {
    Error::invalid(format!("{call}: element {index} is {got:?}, expected {expected:?}"))
}

/// Starts the ranks of this program (the first argument, or [`DEFAULT_RANKS`]) and waits for
/// them; an error unless every rank exited 0.
fn launch_ranks() -> Result<()> {
    let ranks = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|_| Error::invalid(format!("the rank count {a:?} is not a number")))?,
        None => DEFAULT_RANKS,
    };
    let program = std::env::current_exe().map_err(|e| Error::io("finding the path of this program", e))?;
    let spec = weave_launch::LaunchSpec::new(ranks, program).echo(true).timeout(Duration::from_secs(120));
    let report = weave_launch::launch(&spec).map_err(|e| Error::invalid(format!("starting {ranks} ranks: {e}")))?;
    println!("{}", report.summary());
    if report.success() { Ok(()) } else { Err(Error::invalid("a rank failed (above)")) }
}
