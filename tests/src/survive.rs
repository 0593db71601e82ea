//! The survival scenario of `collectives-worker survive SEED`: a loop of checked collectives in
//! which one to three ranks (chosen from the seed, the same on every rank) SIGKILL themselves at
//! a random moment; every survivor must fail, revoke, agree on exactly the killed ranks, shrink,
//! and then run 100 checked collectives on the shrunk communicator with exact results.
//!
//! Every result is checked exactly: each rank contributes integers (`(original rank + 1) · (i +
//! 1)`, exact in `f64`), so a sum, a gathered block or a broadcast value is known to every rank.
//! The rank's `OK` line reports how long after the kill it saw the failure, how long the
//! agreement and the shrink took, in milliseconds, and whether the shrink carried the
//! transports and connections over ([`CARRIED`]) or opened its own.
//!
//! With `WEAVE_SURVIVE_REGROW=1` the survivors then grow back to the original size: rank 0 of
//! the shrunk communicator starts one joiner process per lost rank (`collectives-worker join
//! GROW_ID` with `WEAVE_JOIN_INDEX`), and the grown communicator — joiners included — runs the
//! checked calls; the line adds how long the grow took.

use std::time::{Duration, Instant};

use collectives::{Communicator, ReduceOp};
use comm_core::{Error, Result};

use crate::Pattern;

/// Elements of each call.
const COUNT: usize = 4096;
/// Checked calls the shrunk communicator must run.
const CALLS_AFTER: usize = 100;
/// What an `OK` line says of a shrink that carried the transports and connections over.
pub const CARRIED: &str = "carried over";

/// The ranks the seed kills in a world of `n` (at least one rank survives), and when
/// (milliseconds after the start). An argument `SEED/R,R,...` names the ranks instead (a whole
/// node); the seed still picks the moment.
pub fn victims(arg: &str, n: usize) -> Result<(u64, Vec<usize>, Vec<u64>)> {
    let (seed, named) = match arg.split_once('/') {
        Some((seed, ranks)) => (seed, Some(ranks)),
        None => (arg, None),
    };
    let seed: u64 = seed.parse().map_err(|_| Error::invalid(format!("survive: bad seed {seed:?}")))?;
    let mut p = Pattern::new(0, 0, seed);
    let count = 1 + (p.next_u64() % 3) as usize;
    let count = count.min(n - 1);
    let mut chosen = Vec::new();
    if let Some(named) = named {
        for r in named.split(',') {
            let r: usize = r.trim().parse().map_err(|_| Error::invalid(format!("survive: bad rank {r:?}")))?;
            if r >= n || chosen.contains(&r) {
                return Err(Error::invalid(format!("survive: rank {r} cannot be killed in a world of {n}")));
            }
            chosen.push(r);
        }
        if chosen.len() >= n {
            return Err(Error::invalid("survive: someone must survive"));
        }
    }
    while chosen.len() < count && named.is_none() {
        let r = (p.next_u64() % n as u64) as usize;
        if !chosen.contains(&r) {
            chosen.push(r);
        }
    }
    // One moment for all of them, within a few milliseconds: a node going down.
    let moment = 20 + p.next_u64() % 400;
    let delays = chosen.iter().map(|_| moment + p.next_u64() % 5).collect();
    Ok((seed, chosen, delays))
}

/// One checked collective of round `i` among `members` (original ranks) on `comm`.
pub(crate) fn checked_call(comm: &Communicator, members: &[usize], i: usize) -> Result<()> {
    let me = members[comm.rank()];
    let n = members.len();
    let value = |r: usize| ((r + 1) * (i % 97 + 1)) as f64;
    match i % 3 {
        0 => {
            let send = vec![value(me); COUNT];
            let mut sum = vec![0.0f64; COUNT];
            comm.all_reduce(&send, &mut sum, ReduceOp::Sum)?;
            let want: f64 = members.iter().map(|&r| value(r)).sum();
            if let Some(at) = sum.iter().position(|&x| x != want) {
                return Err(wrong("all_reduce", i, at, sum[at], want));
            }
        }
        1 => {
            let send = vec![value(me); COUNT / 8];
            let mut all = vec![0.0f64; COUNT / 8 * n];
            comm.all_gather(&send, &mut all)?;
            for (k, block) in all.chunks(COUNT / 8).enumerate() {
                if let Some(at) = block.iter().position(|&x| x != value(members[k])) {
                    return Err(wrong("all_gather", i, k * (COUNT / 8) + at, block[at], value(members[k])));
                }
            }
        }
        _ => {
            let root = i % n;
            let mut buf = vec![if comm.rank() == root { value(me) } else { -1.0 }; COUNT];
            comm.broadcast_in_place(&mut buf, root)?;
            if let Some(at) = buf.iter().position(|&x| x != value(members[root])) {
                return Err(wrong("broadcast", i, at, buf[at], value(members[root])));
            }
        }
    }
    Ok(())
}

fn wrong(call: &str, round: usize, at: usize, got: f64, want: f64) -> Error {
    Error::protocol(format!("WRONG DATA: {call} of round {round}: element {at} is {got}, want {want}"))
}

/// Runs the scenario on this rank (see the module documentation).
pub fn survive(arg: &str) -> Result<String> {
    let mut comm = Communicator::from_env()?;
    let n = comm.world_size();
    let me = comm.rank();
    let (_, killed, delays) = victims(arg, n)?;
    let mut members: Vec<usize> = (0..n).collect();
    comm.core().bootstrap().barrier()?;
    let started = Instant::now();
    if let Some(k) = killed.iter().position(|&v| v == me) {
        let delay = Duration::from_millis(delays[k]);
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        });
    }
    let first_kill = Duration::from_millis(delays.iter().copied().min().unwrap_or(0));
    let mut report = Vec::new();
    let mut i = 0usize;
    let mut ok_since_shrink = 0usize;
    let mut shrinks = 0;
    loop {
        match checked_call(&comm, &members, i) {
            Ok(()) => {
                i += 1;
                if shrinks > 0 {
                    ok_since_shrink += 1;
                    if ok_since_shrink == CALLS_AFTER {
                        break;
                    }
                } else if started.elapsed() > Duration::from_secs(30) {
                    return Err(Error::protocol("no failure within 30 s although ranks were killed"));
                }
            }
            Err(e @ Error::Protocol(_)) if e.to_string().contains("WRONG DATA") => return Err(e),
            Err(e @ Error::InvalidArgument(_)) => return Err(e),
            // Anything else means the communicator failed (a lost peer, a timeout, a revocation, or
            // a peer that died half-way through setting up a connection).
            Err(e) => {
                let failed_after = started.elapsed().saturating_sub(first_kill);
                comm.revoke();
                let (lost, next, agreed, shrunk) = recover(&comm)?;
                let old_rank = comm.rank();
                members = members.iter().enumerate().filter(|(r, _)| !lost.contains(r)).map(|(_, &m)| m).collect();
                let new_rank = (0..old_rank).filter(|r| !lost.contains(r)).count();
                if next.world_size() != members.len() || next.rank() != new_rank {
                    return Err(Error::protocol(format!(
                        "the shrunk communicator has rank {} of {}; the survivors make this rank {new_rank} of {}",
                        next.rank(),
                        next.world_size(),
                        members.len()
                    )));
                }
                let carried = next.core().shares_transports_with(comm.core());
                report.push(format!(
                    "error after {} ms ({}), agreed on {:?} in {} ms, shrunk in {} ms (transports {})",
                    failed_after.as_millis(),
                    kind(&e),
                    lost,
                    agreed.as_millis(),
                    shrunk.as_millis(),
                    if carried { CARRIED } else { "opened anew" }
                ));
                comm = next;
                // A new communicator's calls start from its first: some survivors may have
                // finished the round the others failed in.
                i = 0;
                shrinks += 1;
                ok_since_shrink = 0;
                if shrinks > 3 {
                    return Err(Error::protocol(format!("more than 3 shrinks: {report:?}")));
                }
            }
        }
    }
    let mut survivors: Vec<usize> = (0..n).filter(|r| !killed.contains(r)).collect();
    survivors.sort_unstable();
    if members != survivors {
        return Err(Error::protocol(format!("the final members {members:?} are not the survivors {survivors:?}")));
    }
    if std::env::var("WEAVE_SURVIVE_REGROW").is_ok_and(|v| v == "1") {
        let t = Instant::now();
        let (grown, joiners) = regrow(&comm, n - comm.world_size())?;
        let took = t.elapsed();
        let all: Vec<usize> = (0..grown.world_size()).collect();
        for i in 0..CALLS_AFTER {
            checked_call(&grown, &all, i)?;
        }
        report.push(format!("grew back to {} ranks in {} ms", grown.world_size(), took.as_millis()));
        for mut child in joiners {
            wait_for_joiner(&mut child)?;
        }
    }
    Ok(format!("killed {killed:?}; {}; then {CALLS_AFTER} checked calls exact", report.join("; ")))
}

/// Grows `comm` by `joiners` ranks, started here by rank 0 as processes of this program (the
/// children are returned to rank 0 to wait for).
fn regrow(comm: &Communicator, joiners: usize) -> Result<(Communicator, Vec<std::process::Child>)> {
    let growing = comm.grow(joiners)?;
    let mut children = Vec::new();
    if comm.rank() == 0 {
        let me = std::env::current_exe().map_err(|e| Error::io("find this program", e))?;
        for index in 0..joiners {
            let child = std::process::Command::new(&me)
                .args(["join", &growing.id().to_string()])
                .env("WEAVE_JOIN_INDEX", index.to_string())
                .spawn()
                .map_err(|e| Error::io("start a joiner", e))?;
            children.push(child);
        }
    }
    let grown = growing.complete()?;
    Ok((grown, children))
}

/// Waits (at most 30 s) for a joiner to exit, which must be with status 0.
fn wait_for_joiner(child: &mut std::process::Child) -> Result<()> {
    let started = Instant::now();
    loop {
        match child.try_wait().map_err(|e| Error::io("wait for a joiner", e))? {
            Some(status) if status.success() => return Ok(()),
            Some(status) => return Err(Error::protocol(format!("a joiner failed: {status}"))),
            None if started.elapsed() > Duration::from_secs(30) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::protocol("a joiner did not finish within 30 s"));
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// `collectives-worker join GROW_ID`: joins as joiner `WEAVE_JOIN_INDEX` and runs the checked
/// calls of the grown communicator.
pub fn join(id: &str) -> Result<String> {
    let id: collectives::GrowId = id.parse()?;
    let index: usize = std::env::var("WEAVE_JOIN_INDEX")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::invalid("join: WEAVE_JOIN_INDEX is not set to a number"))?;
    let comm = Communicator::join(&id, index)?;
    let all: Vec<usize> = (0..comm.world_size()).collect();
    for i in 0..CALLS_AFTER {
        checked_call(&comm, &all, i)?;
    }
    Ok(format!("joined as rank {} of {}; {CALLS_AFTER} checked calls exact", comm.rank(), comm.world_size()))
}

/// Agrees on the lost ranks and shrinks them away, again while a rank dies during the shrink;
/// the lost ranks, the new communicator and how long the agreement and the shrink took.
fn recover(comm: &Communicator) -> Result<(Vec<usize>, Communicator, Duration, Duration)> {
    for _ in 0..3 {
        let t = Instant::now();
        let lost = comm.agree_on_failed()?;
        let agreed = t.elapsed();
        let t = Instant::now();
        match comm.shrink(&lost) {
            Ok(next) => return Ok((lost, next, agreed, t.elapsed())),
            Err(e @ Error::InvalidArgument(_)) => return Err(e),
            Err(_) => continue,
        }
    }
    Err(Error::protocol("three shrinks in a row failed"))
}

/// The name of `e`'s kind, for `OK` lines.
pub fn kind(e: &Error) -> &'static str {
    match e {
        Error::PeerLost { .. } => "PeerLost",
        Error::Timeout { .. } => "Timeout",
        Error::Revoked(_) => "Revoked",
        Error::Aborted(_) => "Aborted",
        Error::Cuda { .. } => "Cuda",
        _ => "another error",
    }
}
