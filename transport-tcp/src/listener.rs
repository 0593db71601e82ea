//! The receiving side: a listener that authenticates every socket, and one thread per socket
//! that applies the peer's frames to this rank's regions — checking every region id, range and
//! length — in the order [`crate::wire`] defines.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use comm_core::config::Deadline;
use comm_core::memory::MemoryRegion;
use comm_core::spin::Backoff;
use comm_core::{Error, Result};

use crate::config::MAX_SOCKETS;
use crate::region::Regions;
use crate::wire::{FRAME_HEADER_BYTES, FrameHeader, FrameKind, HANDSHAKE_BYTES, HANDSHAKE_OK, Handshake};

/// How often the accept loop looks at its stop flag.
const ACCEPT_POLL_MS: u16 = 50;

/// Data frames applied per stripe, for one sending peer.
#[derive(Default)]
struct Applied {
    per_stripe: [AtomicU64; MAX_SOCKETS],
}

/// What the listener and its socket threads share.
pub(crate) struct Inbound {
    token: [u8; 16],
    regions: Arc<Regions>,
    timeout: Duration,
    stop: AtomicBool,
    applied: Mutex<HashMap<u32, Arc<Applied>>>,
    /// Peers whose sockets broke, or all closed, with why.
    lost: Mutex<HashMap<usize, String>>,
    /// Sockets of each peer that reached a clean end of stream.
    closed: Mutex<HashMap<usize, u16>>,
    sockets: Mutex<Vec<TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Inbound {
    /// `Some(why)` once a socket from `peer` closed or sent garbage.
    pub(crate) fn lost(&self, peer: usize) -> Option<String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).get(&peer).cloned()
    }

    fn mark_lost(&self, peer: usize, why: String) {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).entry(peer).or_insert(why);
    }

    /// One of `peer`'s `stripes` sockets ended cleanly: the peer is gone once all have, since
    /// each socket's thread applied everything before its end — a flag still travelling on
    /// another stripe is not lost.
    fn mark_closed(&self, peer: usize, stripes: u16) {
        let all = {
            let mut closed = self.closed.lock().unwrap_or_else(|p| p.into_inner());
            let n = closed.entry(peer).or_insert(0);
            *n += 1;
            *n >= stripes
        };
        if all {
            self.mark_lost(peer, "closed its connection".to_string());
        }
    }

    fn applied(&self, rank: u32) -> Arc<Applied> {
        self.applied.lock().unwrap_or_else(|p| p.into_inner()).entry(rank).or_default().clone()
    }
}

/// The listening socket of one backend and everything it spawned; stops and joins them on drop.
pub(crate) struct Listener {
    addr: SocketAddr,
    inbound: Arc<Inbound>,
    accept: Option<JoinHandle<()>>,
}

impl Listener {
    /// Listens on `ip` (any port) for sockets that present `token`.
    pub(crate) fn start(
        ip: std::net::IpAddr,
        token: [u8; 16],
        regions: Arc<Regions>,
        timeout: Duration,
    ) -> Result<Self> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| Error::io(format!("bind the tcp transport's listener on {ip}"), e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("tcp listener address", e))?;
        listener.set_nonblocking(true).map_err(|e| Error::io("tcp listener non-blocking", e))?;
        let inbound = Arc::new(Inbound {
            token,
            regions,
            timeout,
            stop: AtomicBool::new(false),
            applied: Mutex::new(HashMap::new()),
            lost: Mutex::new(HashMap::new()),
            closed: Mutex::new(HashMap::new()),
            sockets: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let shared = inbound.clone();
        let accept = std::thread::Builder::new()
            .name("weave-tcp-accept".into())
            .spawn(move || accept_loop(listener, shared))
            .map_err(|e| Error::io("spawn the tcp accept thread", e))?;
        Ok(Listener { addr, inbound, accept: Some(accept) })
    }

    /// Where peers connect.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The state peers' connections report through.
    pub(crate) fn inbound(&self) -> &Arc<Inbound> {
        &self.inbound
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.inbound.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for s in self.inbound.sockets.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        let threads: Vec<_> = self.inbound.threads.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, inbound: Arc<Inbound>) {
    while !inbound.stop.load(Ordering::Acquire) {
        let mut fds = [nix::poll::PollFd::new(listener.as_fd(), nix::poll::PollFlags::POLLIN)];
        if !matches!(nix::poll::poll(&mut fds, ACCEPT_POLL_MS), Ok(n) if n > 0) {
            continue;
        }
        let Ok((socket, _)) = listener.accept() else { continue };
        // A stranger that never completes its handshake costs at most one timeout of this
        // thread; a wrong token or garbage closes the socket at once.
        if let Ok((socket, hello)) = handshake(socket, &inbound) {
            let clone = socket.try_clone();
            let shared = inbound.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("weave-tcp-recv-{}.{}", hello.rank, hello.stripe))
                .spawn(move || receive_loop(socket, hello, shared));
            match (spawned, clone) {
                (Ok(t), Ok(c)) => {
                    inbound.sockets.lock().unwrap_or_else(|p| p.into_inner()).push(c);
                    inbound.threads.lock().unwrap_or_else(|p| p.into_inner()).push(t);
                }
                (Ok(t), Err(_)) => inbound.threads.lock().unwrap_or_else(|p| p.into_inner()).push(t),
                (Err(_), _) => {}
            }
        }
    }
}

/// Reads and checks a socket's handshake; answers OK.
fn handshake(socket: TcpStream, inbound: &Inbound) -> Result<(TcpStream, Handshake)> {
    let mut socket = socket;
    socket.set_nonblocking(false).map_err(|e| Error::io("tcp socket blocking", e))?;
    socket.set_read_timeout(Some(inbound.timeout)).map_err(|e| Error::io("tcp handshake timeout", e))?;
    let mut bytes = [0u8; HANDSHAKE_BYTES];
    socket.read_exact(&mut bytes).map_err(|e| Error::io("read a tcp handshake", e))?;
    let hello = Handshake::decode(&bytes)?;
    // Compare every byte, so the time taken says nothing about where a guess went wrong.
    if hello.token.iter().zip(inbound.token.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
        let _ = socket.shutdown(Shutdown::Both);
        return Err(Error::protocol("tcp handshake with a wrong token (not a rank of this job)"));
    }
    socket.write_all(&[HANDSHAKE_OK]).map_err(|e| Error::io("answer a tcp handshake", e))?;
    socket.set_read_timeout(None).map_err(|e| Error::io("tcp socket timeout", e))?;
    let _ = socket.set_nodelay(true);
    Ok((socket, hello))
}

/// Applies one socket's frames until it closes; a broken or lying peer is marked lost.
fn receive_loop(mut socket: TcpStream, hello: Handshake, inbound: Arc<Inbound>) {
    let applied = inbound.applied(hello.rank);
    let peer = hello.rank as usize;
    let failure = loop {
        match apply_next(&mut socket, &hello, &applied, &inbound) {
            Ok(true) => {}
            Ok(false) => break None,
            Err(e) => break Some(e.to_string()),
        }
    };
    if !inbound.stop.load(Ordering::Acquire) {
        match failure {
            Some(why) => inbound.mark_lost(peer, why),
            None => inbound.mark_closed(peer, hello.stripes),
        }
    }
    let _ = socket.shutdown(Shutdown::Both);
}

/// Applies the next frame; `Ok(false)` at a clean end of stream.
fn apply_next(socket: &mut TcpStream, hello: &Handshake, applied: &Applied, inbound: &Inbound) -> Result<bool> {
    let mut bytes = [0u8; FRAME_HEADER_BYTES];
    match socket.read_exact(&mut bytes) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(Error::io("read a tcp frame header", e)),
    }
    let frame = FrameHeader::decode(&bytes)?;
    let stripes = usize::from(hello.stripes);
    match frame.kind {
        FrameKind::Data => {
            let len = frame.value as usize;
            let region = inbound
                .regions
                .find(frame.region)
                .ok_or_else(|| Error::protocol(format!("tcp data for region {} that does not exist", frame.region)))?;
            let offset = usize::try_from(frame.offset).map_err(|_| Error::protocol("tcp offset overflows"))?;
            if offset.checked_add(len).is_none_or(|end| end > region.len()) {
                return Err(Error::protocol(format!(
                    "tcp data [{offset}, +{len}) past the {} bytes of region {}",
                    region.len(),
                    frame.region
                )));
            }
            // SAFETY: [offset, offset + len) lies inside the region (checked), which the Arc
            // keeps alive; the peer's protocol makes local readers wait for a later flag.
            let dst = unsafe { std::slice::from_raw_parts_mut(region.as_ptr().add(offset), len) };
            socket.read_exact(dst).map_err(|e| Error::io("read tcp data", e))?;
            applied.per_stripe[usize::from(hello.stripe)].fetch_add(1, Ordering::Release);
        }
        FrameKind::Flag | FrameKind::Flush => {
            let mut counts = vec![0u8; 8 * stripes];
            socket.read_exact(&mut counts).map_err(|e| Error::io("read tcp frame counts", e))?;
            wait_applied(&counts, applied, inbound)?;
            if frame.kind == FrameKind::Flag {
                let region = inbound.regions.find(frame.region).ok_or_else(|| {
                    Error::protocol(format!("tcp flag for region {} that does not exist", frame.region))
                })?;
                let offset = usize::try_from(frame.offset).map_err(|_| Error::protocol("tcp offset overflows"))?;
                if !offset.is_multiple_of(8) || offset.checked_add(8).is_none_or(|end| end > region.len()) {
                    return Err(Error::protocol(format!("tcp flag at offset {offset} of region {}", frame.region)));
                }
                let base = region.as_ptr();
                // SAFETY: an aligned 8-byte word inside the live region (checked); shared words
                // are only ever accessed atomically.
                let word = unsafe { &*base.add(offset).cast::<AtomicU64>() };
                word.store(frame.value, Ordering::Release);
            } else {
                socket.write_all(&frame.sequence.to_le_bytes()).map_err(|e| Error::io("answer a tcp flush", e))?;
            }
        }
    }
    Ok(true)
}

/// Waits (bounded) until every stripe applied as many data frames as `counts` says.
fn wait_applied(counts: &[u8], applied: &Applied, inbound: &Inbound) -> Result<()> {
    let deadline = Deadline::after(inbound.timeout);
    let mut backoff = Backoff::new();
    for (s, c) in counts.chunks_exact(8).enumerate() {
        let want = u64::from_le_bytes(c.try_into().map_err(|_| Error::protocol("tcp frame count"))?);
        while applied.per_stripe[s].load(Ordering::Acquire) < want {
            if deadline.expired() || inbound.stop.load(Ordering::Acquire) {
                return Err(Error::timeout(format!("tcp data of stripe {s} before a flag"), None, deadline.elapsed()));
            }
            backoff.snooze();
        }
    }
    Ok(())
}
