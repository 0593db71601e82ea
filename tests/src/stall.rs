//! The stall scenario of `collectives-worker stall MODE`: every rank runs three checked
//! all-reduces, then one rank stalls the fourth call in the way `MODE` names, and every rank
//! whose call fails reports the verdict its error carries (see `comm_core::verdict`):
//!
//! - `kill`: the last rank SIGKILLs itself instead of calling;
//! - `stop`: the last rank SIGSTOPs itself; rank 0 SIGKILLs it two seconds after its own
//!   verdict, so that the job ends;
//! - `recv`: rank 0 receives from rank 1, which sends nothing (an unmatched receive);
//! - `send`: rank 1 sends 8 MiB to rank 0, which receives nothing (an unmatched send, too
//!   large to leave in a mailbox).
//!
//! A failed rank's `OK` line reads `error KIND after T ms; VERDICT text`; a rank with no part
//! in an unmatched operation waits past the others' timeout and reports `idle`. Every rank
//! stays up (reachable for the others' ledger queries) until two seconds after its verdict.

use std::time::{Duration, Instant};

use collectives::{Communicator, ReduceOp};
use comm_core::{Error, Result};

/// Elements of each checked all-reduce.
const COUNT: usize = 1024;

/// Runs the scenario on this rank (see the module documentation).
pub fn stall(mode: &str) -> Result<String> {
    let comm = Communicator::from_env()?;
    let (me, n) = (comm.rank(), comm.world_size());
    if n < 3 {
        return Err(Error::invalid("stall: needs at least 3 ranks"));
    }
    let pids = comm.core().bootstrap().all_gather(&std::process::id().to_le_bytes())?;
    let timeout = comm.core().config().timeout;
    for i in 0..3 {
        let mut sum = vec![0u64; COUNT];
        comm.all_reduce(&vec![i + 1; COUNT], &mut sum, ReduceOp::Sum)?;
        if sum.iter().any(|&x| x != (i + 1) * n as u64) {
            return Err(Error::protocol(format!("WRONG DATA in all_reduce {i}")));
        }
    }
    let odd = n - 1;
    let started = Instant::now();
    let result = match mode {
        "kill" | "stop" if me == odd => {
            let signal = if mode == "kill" { nix::sys::signal::SIGKILL } else { nix::sys::signal::SIGSTOP };
            nix::sys::signal::raise(signal).map_err(|e| Error::errno("raise a signal", e))?;
            return Err(Error::protocol("this rank was to stay stopped until rank 0 killed it"));
        }
        "kill" | "stop" => {
            let mut sum = vec![0u64; COUNT];
            comm.all_reduce(&vec![1; COUNT], &mut sum, ReduceOp::Sum)
        }
        "recv" if me == 0 => comm.recv(&mut [0u64; 32], 1),
        "send" if me == 1 => comm.send(&vec![7u8; 8 << 20], 0),
        "recv" | "send" => {
            std::thread::sleep(timeout + Duration::from_secs(3));
            return Ok("idle".into());
        }
        other => return Err(Error::invalid(format!("stall: unknown mode {other:?}"))),
    };
    let took = started.elapsed();
    let e = match result {
        Ok(()) => return Err(Error::protocol(format!("stall {mode}: the stalled call succeeded"))),
        Err(e) => e,
    };
    let verdict = e.verdict().ok_or_else(|| Error::protocol(format!("stall {mode}: no verdict in the error: {e}")))?;
    let line = format!("error {} after {} ms; VERDICT {verdict}", crate::survive::kind(&e), took.as_millis());
    std::thread::sleep(Duration::from_secs(2));
    if mode == "stop" && me == 0 {
        let pid = pids[odd].as_slice().try_into().map(u32::from_le_bytes).map_err(|_| Error::protocol("a bad pid"))?;
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::SIGKILL).map_err(|e| Error::errno("kill the stopped rank", e))?;
    }
    Ok(line)
}
