//! One rank of a weave multi-process test. The integration tests launch it N times through the
//! launcher: `rank-worker SCENARIO`. It prints one line starting with `OK SCENARIO` and exits 0
//! on success; it prints the error and exits 1 otherwise.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use comm_core::bootstrap::{Bootstrap, TcpBootstrap, UniqueId};
use comm_core::communicator::Communicator;
use comm_core::memory::{MemoryDescriptor, RegisteredMemory};
use comm_core::{Error, Result};
use weave_tests::{Pattern, expect_eq, peers, shm_communicator, verify_pattern, worker};

/// Sizes and offsets every data scenario moves: 1 B, 4095 B, 1 MiB + 3, at odd offsets.
const CASES: [(usize, usize); 3] = [(1, 0), (4095, 3), ((1 << 20) + 3, 5)];

fn main() {
    worker::run(|scenario, _| match scenario {
        "bootstrap" => bootstrap(),
        "exchange" => exchange(),
        "memory-channel" => memory_channel(),
        "signal-storm" => signal_storm(),
        "port-channel" => port_channel(),
        "bad-connections" => bad_connections(),
        "fault-kill" => fault_kill(),
        "registration-mismatch" => registration_mismatch(),
        "out-of-range" => out_of_range(),
        "bad-descriptor" => bad_descriptor(),
        other => Err(worker::unknown_scenario(other)),
    })
}

/// Bootstrap primitives: all_gather, broadcast from every root, barrier, tagged send/recv
/// received out of order.
fn bootstrap() -> Result<String> {
    let b = comm_core::bootstrap::from_env()?;
    let (me, n) = (b.rank(), b.world_size());
    let mine = Pattern::new(me, usize::MAX, 1).bytes(100 + 37 * me);
    let all = b.all_gather(&mine)?;
    for (r, got) in all.iter().enumerate() {
        expect_eq("all_gather contribution", got, &Pattern::new(r, usize::MAX, 1).bytes(100 + 37 * r))?;
    }
    for root in 0..n {
        let got = b.broadcast(root, &Pattern::new(root, usize::MAX, 2).bytes(4096))?;
        expect_eq("broadcast payload", got, Pattern::new(root, usize::MAX, 2).bytes(4096))?;
    }
    b.barrier()?;
    if n > 1 {
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        b.send(next, 10, b"first")?;
        b.send(next, 11, &Pattern::new(me, next, 3).bytes(1 << 20))?;
        verify_pattern(&b.recv(prev, 11)?, prev, me, 3)?;
        expect_eq("tag 10", b.recv(prev, 10)?, b"first".to_vec())?;
    }
    b.barrier()?;
    Ok(format!("{n} ranks, local rank {} of {}", b.local_rank(), b.local_world_size()))
}

/// Register, exchange, import: every rank reads every peer's buffer through the mapping.
fn exchange() -> Result<String> {
    let comm = shm_communicator()?;
    let me = comm.rank();
    let buf = comm.register_host(8192, "exchange")?;
    buf.write_bytes(0, &Pattern::new(me, usize::MAX, 4).bytes(8192))?;
    let all = comm.exchange(&buf)?;
    comm.bootstrap().barrier()?;
    for (r, m) in all.iter().enumerate() {
        expect_eq("owner", m.owner(), r)?;
        expect_eq("label", m.label(), "exchange")?;
        expect_eq("length", m.len(), 8192)?;
        let mut got = vec![0u8; 8192];
        m.read_bytes(0, &mut got)?;
        verify_pattern(&got, r, usize::MAX, 4)?;
    }
    comm.bootstrap().barrier()?;
    Ok(format!("imported {} buffers", all.len() - 1))
}

/// Layout of the data scenarios: one slot per sender, each big enough for the largest case plus
/// its offset.
fn slot_len() -> usize {
    CASES.iter().map(|(len, off)| len + off).max().unwrap_or(0)
}

/// Registers the data scenarios' buffer as `label` (one slot of [`slot_len`] bytes per rank),
/// exchanges it, and builds a channel to every peer with `channel(buffer, peer's buffer)`.
fn slotted_channels<C>(
    comm: &Communicator,
    label: &str,
    channel: impl Fn(&RegisteredMemory, &RegisteredMemory) -> Result<C>,
) -> Result<(RegisteredMemory, Vec<C>)> {
    let buf = comm.register_host(slot_len() * comm.world_size(), label)?;
    let all = comm.exchange(&buf)?;
    let channels =
        peers(comm.bootstrap().as_ref()).into_iter().map(|p| channel(&buf, &all[p])).collect::<Result<_>>()?;
    Ok((buf, channels))
}

/// Memory channels between every pair: random data at every size and offset, put + signal,
/// wait, verify.
fn memory_channel() -> Result<String> {
    let comm = shm_communicator()?;
    let (me, n) = (comm.rank(), comm.world_size());
    let slot = slot_len();
    let (buf, channels) = slotted_channels(&comm, "memory-channel", |buf, peer| comm.memory_channel(buf, peer))?;
    let mut moved = 0;
    for (case, &(len, offset)) in CASES.iter().enumerate() {
        for ch in &channels {
            // Stage this peer's data in our own slot, then put it into our slot at the peer.
            let data = Pattern::new(me, ch.peer(), case as u64).bytes(len);
            buf.write_bytes(slot * me + offset, &data)?;
            ch.put_with_signal(slot * me + offset, slot * me + offset, len)?;
            ch.wait()?; // the peer's put into our buffer has landed
            let mut got = vec![0u8; len];
            buf.read_bytes(slot * ch.peer() + offset, &mut got)?;
            verify_pattern(&got, ch.peer(), me, case as u64)?;
            moved += len;
            // Both sides are done with the slots before the next case overwrites them.
            ch.signal()?;
            ch.wait()?;
        }
    }
    Ok(format!("verified {moved} bytes from {} peers", n - 1))
}

/// Port channels between every pair: the proxy thread copies random data at every size and
/// offset; put + signal + flush, wait, verify. Also checks out-of-range puts are refused.
fn port_channel() -> Result<String> {
    let comm = shm_communicator()?;
    let (me, n) = (comm.rank(), comm.world_size());
    let slot = slot_len();
    let proxy = comm.proxy()?;
    let (buf, channels) = slotted_channels(&comm, "port-channel", |buf, peer| comm.port_channel(&proxy, buf, peer))?;
    let started_on = std::sync::Arc::new(std::sync::Mutex::new(None));
    let record = started_on.clone();
    proxy.start(move || {
        *record.lock().map_err(|_| Error::invalid("poisoned"))? = Some(std::thread::current().id());
        Ok(())
    })?;
    let mut moved = 0;
    for (case, &(len, offset)) in CASES.iter().enumerate() {
        for ch in &channels {
            let data = Pattern::new(me, ch.peer(), 100 + case as u64).bytes(len);
            buf.write_bytes(slot * me + offset, &data)?;
            ch.put_with_signal(slot * me + offset, slot * me + offset, len)?;
            ch.flush()?;
            ch.wait()?;
            let mut got = vec![0u8; len];
            buf.read_bytes(slot * ch.peer() + offset, &mut got)?;
            verify_pattern(&got, ch.peer(), me, 100 + case as u64)?;
            moved += len;
            // A port-channel signal runs on the proxy thread: flush so it has left this rank
            // before the rank moves on (or exits).
            ch.signal()?;
            ch.flush()?;
            ch.wait()?;
        }
    }
    for ch in &channels {
        match ch.put(slot * n - 1, 0, 2) {
            Err(Error::InvalidArgument(_)) => {}
            other => return Err(Error::protocol(format!("out-of-range port put gave {other:?}"))),
        }
    }
    // A flush returns only after the proxy thread ran, so with any channel the hook has run.
    let hook_thread = *started_on.lock().map_err(|_| Error::invalid("poisoned"))?;
    if !channels.is_empty() && (hook_thread.is_none() || hook_thread == Some(std::thread::current().id())) {
        return Err(Error::protocol("the proxy's init hook did not run on the proxy thread"));
    }
    Ok(format!("verified {moved} bytes through the proxy from {} peers", n - 1))
}

/// 10,000 signal/wait round trips between every pair (ranks pair up by round-robin rounds).
fn signal_storm() -> Result<String> {
    let comm = shm_communicator()?;
    let me = comm.rank();
    let sems = peers(comm.bootstrap().as_ref()).into_iter().map(|p| comm.semaphore(p)).collect::<Result<Vec<_>>>()?;
    const ROUNDS: usize = 10_000;
    for s in &sems {
        for _ in 0..ROUNDS {
            if me < s.peer() {
                s.signal()?;
                s.wait()?;
            } else {
                s.wait()?;
                s.signal()?;
            }
        }
        expect_eq("signals received", s.received(), ROUNDS as u64)?;
    }
    Ok(format!("{ROUNDS} round trips with each of {} peers", sems.len()))
}

/// Before the real bootstrap, rank 1 knocks on the root's port with garbage, a silent
/// connection and a wrong secret; the root must refuse them and the job must go on.
fn bad_connections() -> Result<String> {
    let rank: usize = std::env::var("RANK").ok().and_then(|r| r.parse().ok()).unwrap_or(0);
    let mut refused = 0;
    if rank == 1 {
        let env = comm_core::bootstrap::EnvRendezvous::detect()?;
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&(env.master_addr.as_str(), env.master_port))
            .map_err(|e| Error::io("resolve MASTER_ADDR", e))?
            .next()
            .ok_or_else(|| Error::invalid("MASTER_ADDR resolves to nothing"))?;
        let started = Instant::now();
        let mut garbage = loop {
            match TcpStream::connect(addr) {
                Ok(s) => break s,
                Err(_) if started.elapsed() < Duration::from_secs(20) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(Error::io("connect to the root", e)),
            }
        };
        garbage.write_all(&[0xde; 300]).map_err(|e| Error::io("send garbage", e))?;
        let _silent = TcpStream::connect(addr).map_err(|e| Error::io("silent connect", e))?;
        // A full handshake with the wrong secret: must be refused, not admitted as rank 1.
        let wrong = UniqueId::with_secret(addr, [0x55; 16]);
        match TcpBootstrap::new(&wrong, 1, env.world_size, Duration::from_secs(2)) {
            Ok(_) => return Err(Error::protocol("the root admitted a rank with the wrong secret")),
            Err(_) => refused += 1,
        }
        drop(garbage);
    }
    let b = comm_core::bootstrap::from_env()?;
    let all = b.all_gather(&[b.rank() as u8])?;
    expect_eq("ranks after bad connections", all, (0..b.world_size()).map(|r| vec![r as u8]).collect::<Vec<_>>())?;
    b.barrier()?;
    Ok(format!("job went on; wrong-secret handshakes refused: {refused}"))
}

/// The last rank SIGKILLs itself after setup; every other rank is waiting on it and must get an
/// error within the timeout.
fn fault_kill() -> Result<String> {
    let comm = shm_communicator()?;
    let (me, n) = (comm.rank(), comm.world_size());
    let victim = n - 1;
    let buf = comm.register_host(4096, "fault")?;
    let all = comm.exchange(&buf)?;
    let sem = if me == victim { None } else { Some(comm.semaphore(victim)?) };
    let victim_sems =
        if me == victim { (0..n - 1).map(|p| comm.semaphore(p)).collect::<Result<Vec<_>>>()? } else { Vec::new() };
    drop((all, victim_sems));
    comm.bootstrap().barrier()?;
    if me == victim {
        std::thread::sleep(Duration::from_millis(200)); // let the others start waiting
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).map_err(|e| Error::errno("raise SIGKILL", e))?;
        unreachable!("SIGKILL returned");
    }
    let started = Instant::now();
    let sem = sem.ok_or_else(|| Error::invalid("no semaphore"))?;
    match sem.wait() {
        Ok(()) => Err(Error::protocol("wait on a killed rank succeeded")),
        Err(e @ (Error::PeerLost { .. } | Error::Timeout { .. })) => {
            Ok(format!("wait failed after {:?} as it should: {e}", started.elapsed()))
        }
        Err(e) => Err(e),
    }
}

/// Ranks register two buffers in different orders: every rank must get RegistrationMismatch.
fn registration_mismatch() -> Result<String> {
    let comm = shm_communicator()?;
    let (a, b) = if comm.rank() % 2 == 0 { ("alpha", "beta") } else { ("beta", "alpha") };
    let first = comm.register_host(1024, a)?;
    let _second = comm.register_host(1024, b)?;
    match comm.exchange(&first) {
        Err(Error::RegistrationMismatch(m)) => Ok(format!("mismatch reported: {m}")),
        other => Err(Error::protocol(format!("expected RegistrationMismatch, got {other:?}"))),
    }
}

/// Writes past a registered range are refused with InvalidArgument; nothing moves.
fn out_of_range() -> Result<String> {
    let comm = shm_communicator()?;
    let me = comm.rank();
    let buf = comm.register_host(4096, "bounded")?;
    let all = comm.exchange(&buf)?;
    let mut refused = 0;
    for p in peers(comm.bootstrap().as_ref()) {
        let ch = comm.memory_channel(&buf, &all[p])?;
        for (dst, src, len) in [(4090, 0, 7), (0, 4095, 2), (usize::MAX - 1, 0, 4), (4096, 0, 1)] {
            match ch.put(dst, src, len) {
                Err(Error::InvalidArgument(_)) => refused += 1,
                other => return Err(Error::protocol(format!("put({dst},{src},{len}) gave {other:?}"))),
            }
        }
        ch.put(4095, 4095, 1)?;
    }
    let _ = me;
    Ok(format!("{refused} out-of-range writes refused"))
}

/// A peer's descriptor, truncated or corrupted in transit, is an error, never a crash.
fn bad_descriptor() -> Result<String> {
    let comm: Communicator = shm_communicator()?;
    let buf = comm.register_host(4096, "sent")?;
    let good = buf.descriptor().encode();
    let b = comm.bootstrap();
    let me = comm.rank();
    for p in peers(b.as_ref()) {
        b.send(p, 20, &good)?;
        b.send(p, 21, &good[..good.len() / 2])?;
        let mut flipped = good.clone();
        flipped[1] ^= 0x40;
        b.send(p, 22, &flipped)?;
        let mut long = good.clone();
        long.extend_from_slice(&[0; 3]);
        b.send(p, 23, &long)?;
    }
    let mut errors = 0;
    for p in peers(b.as_ref()) {
        let d = MemoryDescriptor::decode(&b.recv(p, 20)?)?;
        expect_eq("descriptor owner", d.owner, p)?;
        for tag in 21..=23 {
            match MemoryDescriptor::decode(&b.recv(p, tag)?) {
                Err(Error::Protocol(_)) => errors += 1,
                other => return Err(Error::protocol(format!("damaged descriptor (tag {tag}) gave {other:?}"))),
            }
        }
    }
    let _ = me;
    b.barrier()?;
    Ok(format!("{errors} damaged descriptors rejected"))
}
