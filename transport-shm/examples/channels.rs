//! Moves random data between every pair of ranks through both channel kinds and checks it.
//!
//! Run it as N ranks with the launcher:
//!
//! ```text
//! cargo build --examples
//! cargo xtask launch -n 4 -- target/debug/examples/channels
//! ```
//!
//! Each rank prints one line containing `OK` when every byte it received matched.

use comm_core::communicator::Communicator;
use comm_core::{Error, Result};
use transport_shm::ShmTransport;

/// Bytes each rank sends to each peer per channel kind.
const MESSAGE: usize = 1 << 20;

fn main() {
    match run() {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("channels: {e}");
            std::process::exit(1);
        }
    }
}

/// Deterministic bytes for the message `from` sends `to` over channel `kind`, so the receiver
/// can check them without another copy.
fn message(from: usize, to: usize, kind: u64) -> Vec<u8> {
    let mut x = (from as u64) << 40 ^ (to as u64) << 20 ^ kind ^ 0x2545_f491_4f6c_dd1d;
    (0..MESSAGE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn run() -> Result<String> {
    // 1. Find the other ranks (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the launcher).
    let bootstrap = comm_core::bootstrap::from_env()?;
    // 2. A communicator over shared memory.
    let comm = Communicator::builder(bootstrap).with_transport(ShmTransport).build()?;
    let (me, n) = (comm.rank(), comm.world_size());

    // 3. Register one buffer per rank with a slot per sender and channel kind, and exchange it.
    let slot = |from: usize, kind: usize| (2 * from + kind) * MESSAGE;
    let buffer = comm.register_host(2 * n * MESSAGE, "channels example")?;
    let everyone = comm.exchange(&buffer)?;

    // 4. One memory channel (direct copies) and one port channel (copies by a proxy thread) per peer.
    let proxy = comm.proxy()?;
    let peers: Vec<usize> = (0..n).filter(|&p| p != me).collect();
    let memory = peers.iter().map(|&p| comm.memory_channel(&buffer, &everyone[p])).collect::<Result<Vec<_>>>()?;
    let port = peers.iter().map(|&p| comm.port_channel(&proxy, &buffer, &everyone[p])).collect::<Result<Vec<_>>>()?;
    proxy.start(|| Ok(()))?;

    // 5. Stage each message in our own slot, then put it into the same slot at the peer.
    for (i, &p) in peers.iter().enumerate() {
        for kind in 0..2 {
            buffer.write_bytes(slot(me, kind), &message(me, p, kind as u64))?;
            let off = slot(me, kind);
            if kind == 0 {
                memory[i].put_with_signal(off, off, MESSAGE)?;
            } else {
                port[i].put_with_signal_and_flush(off, off, MESSAGE)?;
            }
            // 6. Wait for the peer's message of this kind and check it.
            if kind == 0 {
                memory[i].wait()?
            } else {
                port[i].wait()?
            }
            let mut got = vec![0u8; MESSAGE];
            buffer.read_bytes(slot(p, kind), &mut got)?;
            if got != message(p, me, kind as u64) {
                return Err(Error::protocol(format!(
                    "rank {me}: data from rank {p} over channel kind {kind} is wrong"
                )));
            }
            // Both sides are done with the slot before it is reused for the next peer.
            if kind == 0 {
                memory[i].signal()?;
                memory[i].wait()?;
            } else {
                port[i].signal()?;
                port[i].flush()?;
                port[i].wait()?;
            }
        }
    }
    comm.bootstrap().barrier()?;
    Ok(format!(
        "rank {me}/{n}: OK — {} MiB verified from {} peers over memory and port channels",
        (2 * peers.len() * MESSAGE) >> 20,
        peers.len()
    ))
}
