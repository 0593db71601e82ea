//! A hostile process on a job's network: `collectives-worker hostile-target DIR` runs checked
//! collectives on every rank while `collectives-worker hostile-attack DIR` — a process on one of
//! the job's nodes that knows every rank's listening ports but none of the job's secrets —
//! sends the listeners garbage: random bytes, truncated and oversized messages, handshakes and
//! hellos with a wrong secret or a wrong version, frames naming registrations, offsets and
//! lengths out of range, the same frames again, and connections that never finish a message.
//!
//! Each rank writes where it listens to `DIR/rank-R` (`BOOTSTRAP ADDR` and `TCP ADDR` lines:
//! the bootstrap's link listener and the TCP transport's), then runs checked calls until the
//! attacker writes `DIR/attack-done`, then 20 more. The attacker waits for every rank's file,
//! attacks every listener in rounds for the given seconds, and writes `attack-done`. The job
//! must finish exact: nothing the attacker sends may reach a rank's memory or stop a call.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use collectives::Communicator;
use comm_core::wire::Encoder;
use comm_core::{Error, Result};

use crate::Pattern;

/// Ranks' files and the attacker's stop file, in the job's directory.
fn rank_file(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank}"))
}

fn done_file(dir: &Path) -> PathBuf {
    dir.join("attack-done")
}

/// Calls a rank makes after the attack ended.
const CALLS_AFTER: usize = 20;
/// Longest a rank goes on waiting for the attack to end.
const LONGEST_ATTACK: Duration = Duration::from_secs(120);

/// `hostile-target DIR`: one rank of the job (see the module documentation).
pub fn target(dir: &str) -> Result<String> {
    let dir = Path::new(dir);
    let bootstrap = comm_core::bootstrap::from_env()?;
    let rank = comm_core::bootstrap::Bootstrap::rank(&bootstrap);
    let bootstrap_addr = bootstrap.listen_addr(rank);
    let comm = Communicator::builder(bootstrap).build()?;
    let tcp = comm
        .core()
        .backend(transport_tcp::transport())
        .ok_or_else(|| Error::Unsupported("hostile-target needs the tcp transport".into()))?;
    let (tcp_addr, _) = transport_tcp::endpoint_parts(&tcp.local_endpoint()?)?;
    let mut lines = format!("TCP {tcp_addr}\n");
    if let Some(addr) = bootstrap_addr {
        lines.push_str(&format!("BOOTSTRAP {addr}\n"));
    }
    std::fs::write(rank_file(dir, rank), lines).map_err(|e| Error::io("write the rank's listeners", e))?;
    let members: Vec<usize> = (0..comm.world_size()).collect();
    let started = Instant::now();
    let mut during = 0;
    // Every rank must see the same stop: rank 0 looks at the file and broadcasts what it saw.
    loop {
        crate::survive::checked_call(&comm, &members, during)?;
        during += 1;
        let mut stop = [u8::from(rank == 0 && done_file(dir).exists())];
        comm.broadcast_in_place(&mut stop, 0)?;
        if stop[0] == 1 {
            break;
        }
        if started.elapsed() > LONGEST_ATTACK {
            return Err(Error::protocol("the attacker never finished"));
        }
    }
    for i in 0..CALLS_AFTER {
        crate::survive::checked_call(&comm, &members, during + i)?;
    }
    Ok(format!("{during} checked calls during the attack and {CALLS_AFTER} after, all exact"))
}

/// What the attacker sent, counted, and how the listeners answered.
#[derive(Default)]
struct Sent {
    connections: usize,
    bytes: usize,
    /// Connections the listener closed at once.
    closed: usize,
    /// Connections still open after a short wait (the listener waits for the rest, bounded).
    held: usize,
    /// Connections that got bytes back (none should: nothing the attacker sends is valid).
    answered: usize,
}

/// `hostile-attack DIR/SECONDS`: the attacker (see the module documentation).
pub fn attack(arg: &str) -> Result<String> {
    let (dir, seconds) = arg
        .rsplit_once('/')
        .and_then(|(d, s)| Some((d, s.parse::<u64>().ok()?)))
        .ok_or_else(|| Error::invalid(format!("hostile-attack takes DIR/SECONDS, not {arg:?}")))?;
    let dir = Path::new(dir);
    let world: usize = std::env::var("WEAVE_HOSTILE_RANKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::invalid("hostile-attack: WEAVE_HOSTILE_RANKS is not set to the job's size"))?;
    let listeners = wait_for_listeners(dir, world)?;
    let mut sent = Sent::default();
    let mut random = Pattern::new(0, 0, 0x5eed);
    let started = Instant::now();
    let mut rounds = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        for (kind, addr) in &listeners {
            for message in hostile_messages(kind, &mut random, world) {
                send(*addr, &message, &mut sent);
            }
        }
        // Connections that never finish a message, held while the next round runs.
        let stalled: Vec<TcpStream> = listeners
            .iter()
            .filter_map(|(_, addr)| {
                let mut s = TcpStream::connect_timeout(addr, Duration::from_secs(1)).ok()?;
                let _ = s.write_all(&[0x57, 0x56]);
                Some(s)
            })
            .collect();
        rounds += 1;
        std::thread::sleep(Duration::from_millis(50));
        drop(stalled);
    }
    std::fs::write(done_file(dir), b"done").map_err(|e| Error::io("write the attack's end", e))?;
    if sent.answered > 0 || sent.connections == 0 {
        return Err(Error::protocol(format!(
            "{} of {} hostile connections got an answer from a listener",
            sent.answered, sent.connections
        )));
    }
    Ok(format!(
        "{rounds} rounds against {} listeners: {} connections, {} bytes sent; {} closed at once, {} held a while, \
         none answered",
        listeners.len(),
        sent.connections,
        sent.bytes,
        sent.closed,
        sent.held
    ))
}

/// Every rank's listeners from its file: (what listens, where), once every file is there.
fn wait_for_listeners(dir: &Path, world: usize) -> Result<Vec<(String, SocketAddr)>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    for rank in 0..world {
        let text = loop {
            match std::fs::read_to_string(rank_file(dir, rank)) {
                Ok(t) if t.ends_with('\n') => break t,
                _ if Instant::now() > deadline => {
                    return Err(Error::protocol(format!("rank {rank} never said where it listens")));
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        for line in text.lines() {
            let (kind, addr) = line
                .split_once(' ')
                .and_then(|(k, a)| Some((k.to_string(), a.parse::<SocketAddr>().ok()?)))
                .ok_or_else(|| Error::protocol(format!("rank {rank}'s file has a line {line:?}")))?;
            out.push((kind, addr));
        }
    }
    Ok(out)
}

/// Sends `message` on a fresh connection to `addr` and reads what comes back until the
/// listener closes it (bounded): the attacker never waits on a listener for long.
fn send(addr: SocketAddr, message: &[u8], sent: &mut Sent) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else { return };
    sent.connections += 1;
    let _ = s.set_read_timeout(Some(Duration::from_millis(30)));
    let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
    if s.write_all(message).is_ok() {
        sent.bytes += message.len();
    }
    let mut sink = [0u8; 256];
    match s.read(&mut sink) {
        Ok(0) => sent.closed += 1,
        Ok(_) => sent.answered += 1,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => sent.held += 1,
        Err(_) => sent.closed += 1,
    }
}

/// One round's messages for a listener of `kind` (`BOOTSTRAP` or `TCP`).
fn hostile_messages(kind: &str, random: &mut Pattern, world: usize) -> Vec<Vec<u8>> {
    let noise: Vec<u8> = (0..4096).map(|_| random.next_u64() as u8).collect();
    let wrong_secret = [0xa5u8; 16];
    let mut out = vec![noise.clone(), noise[..7].to_vec(), Vec::new()];
    match kind {
        "BOOTSTRAP" => {
            // A peer hello (`WVBP`) with a wrong secret, one with a wrong version, one cut
            // short, and a length prefix far past the largest message.
            let hello = |version: u16| {
                let body = Encoder::new(*b"WVBP", version).raw(&wrong_secret).usize(1).usize(0).usize(world).finish();
                let mut framed = (body.len() as u32).to_le_bytes().to_vec();
                framed.extend(body);
                framed
            };
            let good_shape = hello(2);
            out.push(good_shape.clone());
            out.push(hello(99));
            out.push(good_shape[..good_shape.len() / 2].to_vec());
            out.push(u32::MAX.to_le_bytes().to_vec());
            // The same hello twice on one connection.
            out.push([good_shape.clone(), good_shape].concat());
        }
        _ => {
            // A handshake (`WVTH`) with a wrong token, then frames naming regions, offsets and
            // lengths out of range (a data frame past the largest, a flag at an odd offset).
            let handshake = |version: u16, stripes: u16| {
                Encoder::new(*b"WVTH", version).raw(&wrong_secret).u32(1).u16(0).u16(stripes).finish()
            };
            let frame = |kind: u8, region: u64, offset: u64, value: u64| {
                let mut f = vec![kind, 0, 0, 0, 0, 0, 0, 0];
                for w in [region, offset, value, 7] {
                    f.extend(w.to_le_bytes());
                }
                f
            };
            let frames = [
                frame(1, 1, 1 << 40, 64),
                frame(1, u64::MAX, 0, u64::MAX),
                frame(2, 1, 3, 0xdead),
                frame(3, 0, 0, 0),
                frame(9, 1, 0, 0),
            ]
            .concat();
            out.push([handshake(2, 1), frames.clone()].concat());
            out.push([handshake(2, 1), frames.clone(), frames].concat());
            out.push(handshake(7, 1));
            out.push(handshake(2, 0));
            out.push(handshake(2, 1)[..10].to_vec());
        }
    }
    out
}
