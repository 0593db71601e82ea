//! A data-parallel loop that loses a rank, shrinks, grows back and checks every step — through
//! the `weave` crate alone.
//!
//! ```text
//! cargo run -p weave --example elastic            # starts 4 ranks of itself
//! cargo run -p weave --example elastic -- 6       # 6 ranks
//! ```
//!
//! Each step every rank contributes a "gradient" (integers, so sums are exact) and all-reduces
//! it; the weights move by the average. At step 5 the last rank dies (it aborts). The others
//! fail, revoke the communicator, agree on who is gone and shrink; rank 0 then starts a
//! replacement process (this program with `WEAVE_ELASTIC_JOIN` set to the grow id), the
//! survivors grow back to full size, and every rank — the replacement too — takes rank 0's step
//! and weights (a survivor may have finished the step the others failed in) and runs to step 20. Every step's sum is checked, and the final weights must be
//! equal on every rank. Started without a launcher it launches its own ranks with
//! `weave-launch` (keeping the others running when one dies).

use std::time::Duration;

use weave::{Communicator, Error, GrowId, ReduceOp, Result};

/// Parameters of the model.
const PARAMS: usize = 1 << 16;
/// Steps of training.
const STEPS: u64 = 20;
/// The step at which the last rank dies.
const DEATH: u64 = 5;

fn main() {
    let outcome = if let Ok(id) = std::env::var("WEAVE_ELASTIC_JOIN") {
        replacement(&id)
    } else if std::env::var_os("RANK").is_some() {
        rank_main()
    } else {
        launch_ranks()
    };
    if let Err(e) = outcome {
        eprintln!("elastic: {e}");
        std::process::exit(1);
    }
}

/// The gradient a rank contributes at `step`: small integers, so the sum is exact.
fn gradient(rank: usize, step: u64) -> Vec<f32> {
    vec![((rank as u64 * 7 + step) % 11) as f32; PARAMS]
}

/// One step on `comm`: all-reduces this rank's gradient, checks the sum, moves the weights.
fn step(comm: &Communicator, weights: &mut [f32], step: u64) -> Result<()> {
    let mine = gradient(comm.rank(), step);
    let mut sum = vec![0.0f32; PARAMS];
    comm.all_reduce(&mine, &mut sum, ReduceOp::Sum)?;
    let want: f32 = (0..comm.world_size()).map(|r| ((r as u64 * 7 + step) % 11) as f32).sum();
    if let Some(i) = sum.iter().position(|&g| g != want) {
        return Err(Error::invalid(format!("step {step}: gradient sum {} at {i}, want {want}", sum[i])));
    }
    let n = comm.world_size() as f32;
    weights.iter_mut().zip(&sum).for_each(|(w, g)| *w -= 0.01 * g / n);
    Ok(())
}

/// Runs steps from `from` to [`STEPS`] on `comm`, recovering from lost ranks; returns the
/// communicator it ended on. Rank 0 keeps the replacements it starts in `started`.
fn train(
    mut comm: Communicator,
    weights: &mut [f32],
    mut from: u64,
    started: &mut Vec<std::process::Child>,
) -> Result<Communicator> {
    let full = comm.world_size();
    let replacement = std::env::var_os("WEAVE_ELASTIC_JOIN").is_some();
    while from < STEPS {
        if from == DEATH && comm.rank() == full - 1 && !replacement && started.is_empty() {
            println!("rank {}: dying at step {from}", comm.rank());
            std::process::abort();
        }
        match step(&comm, weights, from) {
            Ok(()) => from += 1,
            Err(e @ Error::InvalidArgument(_)) => return Err(e),
            Err(e) => {
                println!("rank {}: step {from} failed ({e}); recovering", comm.rank());
                comm.revoke();
                let lost = comm.agree_on_failed()?;
                let survivors = comm.shrink(&lost)?;
                println!(
                    "rank {} is rank {} of {} after losing {lost:?}",
                    comm.rank(),
                    survivors.rank(),
                    survivors.world_size()
                );
                // Grow back: rank 0 starts the replacements and hands them the id.
                let growing = survivors.grow(lost.len())?;
                if survivors.rank() == 0 {
                    let me = std::env::current_exe().map_err(|e| Error::io("find this program", e))?;
                    for index in 0..lost.len() {
                        let child = std::process::Command::new(&me)
                            .env("WEAVE_ELASTIC_JOIN", format!("{}:{index}", growing.id()))
                            .spawn()
                            .map_err(|e| Error::io("start a replacement", e))?;
                        started.push(child);
                    }
                }
                comm = growing.complete()?;
                from = take_rank0_state(&comm, weights, from)?;
                println!("rank {}: grown back to {} ranks at step {from}", comm.rank(), comm.world_size());
            }
        }
    }
    Ok(comm)
}

/// Every rank takes rank 0's step and weights; returns the step.
fn take_rank0_state(comm: &Communicator, weights: &mut [f32], from: u64) -> Result<u64> {
    let mut step = [from];
    comm.broadcast_in_place(&mut step, 0)?;
    comm.broadcast_in_place(weights, 0)?;
    Ok(step[0])
}

/// One rank started by the launcher.
fn rank_main() -> Result<()> {
    let comm = Communicator::from_env()?;
    let mut weights = vec![1.0f32; PARAMS];
    let mut started = Vec::new();
    let comm = train(comm, &mut weights, 0, &mut started)?;
    finish(&comm, &weights)?;
    for mut child in started {
        let status = child.wait().map_err(|e| Error::io("wait for a replacement", e))?;
        if !status.success() {
            return Err(Error::invalid(format!("a replacement failed: {status}")));
        }
    }
    Ok(())
}

/// A replacement started by rank 0: `WEAVE_ELASTIC_JOIN` is `GROW_ID:INDEX`.
fn replacement(spec: &str) -> Result<()> {
    let bad = || Error::invalid(format!("WEAVE_ELASTIC_JOIN={spec:?} is not GROW_ID:INDEX"));
    let (id, index) = spec.split_once(':').ok_or_else(bad)?;
    let id: GrowId = id.parse()?;
    let index: usize = index.parse().map_err(|_| bad())?;
    let comm = Communicator::join(&id, index)?;
    let mut weights = vec![0.0f32; PARAMS];
    let from = take_rank0_state(&comm, &mut weights, 0)?;
    println!("replacement: joined as rank {} of {} at step {from}", comm.rank(), comm.world_size());
    let comm = train(comm, &mut weights, from, &mut Vec::new())?;
    finish(&comm, &weights)
}

/// Checks that every rank ends with the same weights, and says so.
fn finish(comm: &Communicator, weights: &[f32]) -> Result<()> {
    let mut max = weights.to_vec();
    comm.all_reduce(weights, &mut max, ReduceOp::Max)?;
    if max != weights {
        return Err(Error::invalid("the ranks ended with different weights"));
    }
    println!(
        "rank {} of {}: {STEPS} steps, every sum exact, weights equal on every rank",
        comm.rank(),
        comm.world_size()
    );
    Ok(())
}

/// Starts the ranks (the first argument, default 4) and waits: success when every rank but the
/// one that was to die exited 0.
fn launch_ranks() -> Result<()> {
    let ranks: usize = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|_| Error::invalid(format!("the rank count {a:?} is not a number")))?,
        None => 4,
    };
    if ranks < 2 {
        return Err(Error::invalid("elastic needs at least 2 ranks"));
    }
    let program = std::env::current_exe().map_err(|e| Error::io("finding the path of this program", e))?;
    let spec = weave_launch::LaunchSpec::new(ranks, program)
        .echo(true)
        .keep_going(true)
        .env("WEAVE_TIMEOUT", "10")
        .timeout(Duration::from_secs(120));
    let report = weave_launch::launch(&spec).map_err(|e| Error::invalid(format!("starting {ranks} ranks: {e}")))?;
    let others_ok =
        report.ranks.iter().filter(|r| r.rank != ranks - 1).all(|r| r.exit == weave_launch::RankExit::Code(0));
    if others_ok {
        println!("elastic: rank {} died at step {DEATH}; the others shrank, grew back and finished", ranks - 1);
        Ok(())
    } else {
        Err(Error::invalid(format!("a surviving rank failed:\n{}", report.summary())))
    }
}
