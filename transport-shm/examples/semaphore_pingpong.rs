//! Benchmark: round-trip time of a host semaphore between two processes over shared memory.
//!
//! Rank 0 signals, rank 1 waits and signals back, rank 0 waits: one round trip. Each of
//! `ROUNDS` (default 10,000, or the first argument) round trips is timed on rank 0, after
//! 1,000 warm-up round trips; rank 0 prints the median, 10th and 99th percentiles.
//!
//! ```text
//! cargo build --release --examples
//! cargo xtask launch -n 2 -- target/release/examples/semaphore_pingpong 10000
//! ```

use std::time::{Duration, Instant};

use comm_core::communicator::Communicator;
use comm_core::{Error, Result};
use transport_shm::ShmTransport;

const WARMUP: usize = 1_000;

fn main() {
    if let Err(e) = run() {
        eprintln!("semaphore_pingpong: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let rounds: usize = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|_| Error::invalid(format!("round count {a:?} is not a number")))?,
        None => 10_000,
    };
    let comm = Communicator::builder(comm_core::bootstrap::from_env()?).with_transport(ShmTransport).build()?;
    if comm.world_size() != 2 {
        return Err(Error::invalid("run it with exactly 2 ranks (-n 2)"));
    }
    let me = comm.rank();
    let sem = comm.semaphore(1 - me)?;
    let mut times = Vec::with_capacity(rounds);
    for i in 0..WARMUP + rounds {
        if me == 0 {
            let t = Instant::now();
            sem.signal()?;
            sem.wait()?;
            if i >= WARMUP {
                times.push(t.elapsed());
            }
        } else {
            sem.wait()?;
            sem.signal()?;
        }
    }
    comm.bootstrap().barrier()?;
    if me == 0 {
        times.sort();
        let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "host semaphore round trip over shm, {rounds} round trips: median {:.3} us, p10 {:.3} us, p99 {:.3} us",
            us(at(0.5)),
            us(at(0.1)),
            us(at(0.99))
        );
    }
    Ok(())
}
