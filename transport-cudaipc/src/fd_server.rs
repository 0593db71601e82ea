//! The FD server: hands out file descriptors of this backend's cuMem allocations to peers of
//! the same user on this host, and maps peers' registered memory here on their request, over an
//! abstract-namespace Unix socket (`SOCK_SEQPACKET`, so one request and one reply are each one
//! message); and the client that asks.
//!
//! A map request carries a legacy IPC export of the client's memory: the server opens it in
//! this process, keeps it under (client pid, key) until an unmap request or the backend's end,
//! and answers its address here, so the client knows where this rank's kernels see its memory
//! (`TransportBackend::map_at_peer`).
//!
//! Protocol, one connection per descriptor: the client connects to
//! `@weave-{job_key}-r{rank}-c{communicator_id}`, checks with `SO_PEERCRED` that the server is
//! the process its endpoint names, and sends a request (allocation id). The server checks with
//! `SO_PEERCRED` that the client has its uid, exports a fresh descriptor of that allocation
//! (only ids this backend exported; anything else gets an error reply), sends it as
//! `SCM_RIGHTS` with the allocation size, and closes its copy. Every socket operation on both
//! sides is bounded by a socket timeout.

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use comm_core::deadline::Deadline;
use comm_core::error::{Error, Result};
use cudarc::driver::CudaContext;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr, accept4, bind,
    connect, getsockopt, listen, recvmsg, sendmsg, setsockopt, socket, sockopt,
};
use nix::sys::time::{TimeVal, TimeValLike};
use nix::unistd::Pid;
use weave_cuda::DeviceAllocation;
use weave_cuda::driver::from_driver;

use crate::cu;
use crate::payload::{self, Export, Payload, REPLY_BUFFER, REQUEST_BUFFER, Reply, Request};
use crate::region;
use weave_cuda::DeviceRegion;

/// Peers' memory mapped here on their request, by (client pid, client's key).
pub(crate) type PeerMaps = Mutex<HashMap<(u32, u64), DeviceRegion>>;

/// Allocations a backend exported, by id. Weak: exporting does not keep memory alive; a peer
/// asking for a freed allocation gets an error reply.
pub(crate) type ExportTable = Mutex<HashMap<u64, Weak<DeviceAllocation>>>;

/// How long the server thread sleeps in `poll` between looks at its stop flag (it is woken at
/// once through a pipe on drop; this only bounds a lost wake-up).
const POLL_PERIOD_MS: u16 = 1000;
/// Upper bound on one server-side socket operation, so one stuck client cannot hold up the
/// others for a whole job timeout.
const MAX_SERVER_IO: Duration = Duration::from_secs(10);

/// The abstract socket name (without the leading NUL) of `rank`'s FD server in communicator
/// `communicator_id` of job `job_key`.
pub(crate) fn socket_name(job_key: &str, rank: usize, communicator_id: u64) -> String {
    format!("weave-{job_key}-r{rank}-c{communicator_id}")
}

fn timeval(d: Duration) -> TimeVal {
    // Zero would mean "no timeout" to SO_RCVTIMEO: use at least a millisecond.
    let us = d.as_micros().clamp(1000, i64::MAX as u128 / 2) as i64;
    TimeVal::microseconds(us)
}

fn set_timeouts(fd: &OwnedFd, d: Duration, what: &str) -> Result<()> {
    let tv = timeval(d);
    setsockopt(fd, sockopt::ReceiveTimeout, &tv).map_err(|e| Error::errno(format!("SO_RCVTIMEO on {what}"), e))?;
    setsockopt(fd, sockopt::SendTimeout, &tv).map_err(|e| Error::errno(format!("SO_SNDTIMEO on {what}"), e))?;
    Ok(())
}

/// Runs `f` again while a signal interrupts it (`EINTR`), until `deadline`; then `EAGAIN`,
/// which callers report as a timeout.
fn retry<T>(deadline: &Deadline, mut f: impl FnMut() -> nix::Result<T>) -> nix::Result<T> {
    loop {
        match f() {
            Err(Errno::EINTR) if !deadline.expired() => continue,
            Err(Errno::EINTR) => return Err(Errno::EAGAIN),
            r => return r,
        }
    }
}

fn seqpacket_socket(what: &str) -> Result<OwnedFd> {
    socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| Error::errno(format!("socket(AF_UNIX, SOCK_SEQPACKET) for {what}"), e))
}

/// One backend's FD server thread; stopped and joined on drop.
pub(crate) struct FdServer {
    name: String,
    stop: Arc<AtomicBool>,
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

comm_core::debug_fields!(FdServer { name });

struct Served {
    ctx: Arc<CudaContext>,
    /// The device the context serves (imports are mapped for it).
    device: u32,
    exports: Arc<ExportTable>,
    maps: PeerMaps,
    uid: u32,
    io_timeout: Duration,
}

impl FdServer {
    /// Binds `@name` and starts serving the allocations in `exports`.
    pub(crate) fn start(
        name: String,
        ctx: Arc<CudaContext>,
        device: u32,
        exports: Arc<ExportTable>,
        timeout: Duration,
    ) -> Result<Self> {
        let what = format!("cudaipc fd server @{name}");
        let listener = seqpacket_socket(&what)?;
        let addr =
            UnixAddr::new_abstract(name.as_bytes()).map_err(|e| Error::errno(format!("address of {what}"), e))?;
        match bind(listener.as_raw_fd(), &addr) {
            Ok(()) => {}
            Err(Errno::EADDRINUSE) => {
                return Err(Error::transport(
                    crate::NAME,
                    format!(
                        "socket @{name} is already bound: another backend of this job claims the same rank and \
                         communicator (two communicators with one id, or a rank started twice)"
                    ),
                ));
            }
            Err(e) => return Err(Error::errno(format!("bind {what}"), e)),
        }
        listen(&listener, Backlog::new(128).unwrap_or(Backlog::MAXCONN))
            .map_err(|e| Error::errno(format!("listen on {what}"), e))?;
        let (wake_rx, wake) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::errno("pipe2", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let served = Served {
            ctx,
            device,
            exports,
            maps: Mutex::new(HashMap::new()),
            uid: nix::unistd::geteuid().as_raw(),
            io_timeout: timeout.min(MAX_SERVER_IO),
        };
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("weave-cudaipc-fd".into())
            .spawn(move || serve(&listener, &wake_rx, &thread_stop, &served))
            .map_err(|e| Error::io(format!("spawning the thread of {what}"), e))?;
        Ok(FdServer { name, stop, wake, thread: Some(thread) })
    }

    /// The abstract socket name (without the leading NUL).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for FdServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the poll at once; if the write fails the poll period bounds the wait.
        let _ = nix::unistd::write(&self.wake, &[1u8]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: &OwnedFd, wake: &OwnedFd, stop: &AtomicBool, served: &Served) {
    // First action: bind this backend's context, before any CUDA call on this thread (the
    // export call needs it; a thread without one would create a context on device 0).
    let bound = served.ctx.bind_to_thread().map_err(|e| from_driver("cuCtxSetCurrent (fd server thread)", e));
    loop {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN), PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(POLL_PERIOD_MS)) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => {
                // Not expected; do not spin on a persistent failure.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        if !fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLIN)) {
            continue;
        }
        let conn = match accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            // SAFETY: accept4 returned a fresh descriptor that nothing else owns.
            Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
            Err(_) => continue,
        };
        // A failing client only loses its own request.
        let _ = handle(&conn, served, &bound);
    }
}

fn send_reply(conn: &OwnedFd, reply: &Reply, fd: Option<RawFd>, deadline: &Deadline) -> Result<()> {
    let bytes = payload::encode_reply(reply);
    let iov = [IoSlice::new(&bytes)];
    let fds = fd.map(|f| [f]);
    let cmsgs: Vec<ControlMessage<'_>> = fds.as_ref().map(|f| ControlMessage::ScmRights(f)).into_iter().collect();
    retry(deadline, || sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None))
        .map_err(|e| Error::errno("sendmsg (cudaipc fd reply)", e))?;
    Ok(())
}

fn handle(conn: &OwnedFd, served: &Served, bound: &Result<()>) -> Result<()> {
    set_timeouts(conn, served.io_timeout, "cudaipc fd server connection")?;
    let deadline = Deadline::after(served.io_timeout);
    let reply = |r: Reply, fd: Option<RawFd>| send_reply(conn, &r, fd, &deadline);
    let cred = getsockopt(conn, sockopt::PeerCredentials).map_err(|e| Error::errno("SO_PEERCRED", e))?;
    if cred.uid() != served.uid {
        let m = format!("refused: client uid {} is not this rank's uid {}", cred.uid(), served.uid);
        return reply(Reply::Error(m), None);
    }
    let mut buf = [0u8; REQUEST_BUFFER];
    let (n, truncated) = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(conn.as_raw_fd(), &mut iov, None, MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(msg) => break (msg.bytes, msg.flags.contains(MsgFlags::MSG_TRUNC)),
            Err(Errno::EINTR) if !deadline.expired() => continue,
            Err(e) => return Err(Error::errno("recvmsg (cudaipc fd request)", e)),
        }
    };
    if truncated {
        return reply(Reply::Error("request too long".into()), None);
    }
    let request = match payload::decode_request(&buf[..n]) {
        Ok(r) => r,
        Err(e) => return reply(Reply::Error(e.to_string()), None),
    };
    if let Err(e) = bound {
        return reply(Reply::Error(e.to_string()), None);
    }
    let client = u32::try_from(cred.pid()).unwrap_or(0);
    match request {
        Request::Fd { id } => {
            let allocation = served.exports.lock().unwrap_or_else(|p| p.into_inner()).get(&id).and_then(Weak::upgrade);
            let Some(allocation) = allocation else {
                let m = format!("allocation {id} is not exported by this rank (never exported, or freed since)");
                return reply(Reply::Error(m), None);
            };
            let fd = match cu::export_fd(allocation.handle()) {
                Ok(fd) => fd,
                Err(e) => return reply(Reply::Error(e.to_string()), None),
            };
            let size = allocation.size() as u64;
            // Our copy of the descriptor closes when `fd` drops, right after sending.
            reply(Reply::Fd { size }, Some(fd.as_raw_fd()))
        }
        Request::Map { key, len, payload } => match map_for(served, client, key, len, &payload) {
            Ok(address) => {
                let sent = reply(Reply::Mapped { address }, None);
                if sent.is_err() {
                    // The client never learns of the mapping (it timed out or died): it is
                    // closed again, so nothing stays mapped and a retry of the key may map.
                    served.maps.lock().unwrap_or_else(|p| p.into_inner()).remove(&(client, key));
                }
                sent
            }
            Err(e) => reply(Reply::Error(e.to_string()), None),
        },
        Request::Unmap { key } => {
            // Dropping the region closes this process's mapping of the client's memory.
            let gone = served.maps.lock().unwrap_or_else(|p| p.into_inner()).remove(&(client, key));
            match gone {
                Some(_) => reply(Reply::Unmapped, None),
                None => reply(Reply::Error(format!("no mapping {key} of pid {client} here (unmapped already?)")), None),
            }
        }
    }
}

/// Maps the memory a client (process `client`) exported in `payload` here, under `key`.
fn map_for(served: &Served, client: u32, key: u64, len: u64, payload: &[u8]) -> Result<u64> {
    let p = Payload::decode(payload)?;
    if p.pid != client {
        return Err(Error::protocol(format!("map request from pid {client} exports memory of pid {}", p.pid)));
    }
    let Export::Legacy { handle, base, base_size, offset } = p.export else {
        return Err(Error::Unsupported("map requests carry legacy IPC exports only".into()));
    };
    let len = usize::try_from(len).map_err(|_| Error::protocol("map length does not fit usize"))?;
    if offset.checked_add(len as u64).is_none_or(|end| end > base_size) {
        return Err(Error::protocol(format!("map request: [{offset}, +{len}) past an allocation of {base_size}")));
    }
    let mut maps = served.maps.lock().unwrap_or_else(|p| p.into_inner());
    if maps.contains_key(&(client, key)) {
        return Err(Error::invalid(format!("pid {client} already mapped key {key} here")));
    }
    let kind = comm_core::memory::MemoryKind::Device(served.device);
    let region = if p.pid == std::process::id() && p.instance == region::process_instance() {
        region::same_process(served.device, base, base_size as usize, offset as usize, len, kind)?
    } else {
        region::import_ipc(&served.ctx, served.device, (p.pid, p.instance), &handle, offset as usize, len, kind)?
    };
    let address = region.device_ptr();
    maps.insert((client, key), region);
    Ok(address)
}

/// Where to ask for a peer's allocation.
pub(crate) struct FdSource<'a> {
    /// The peer's socket name.
    pub(crate) name: &'a str,
    /// The peer rank (for errors).
    pub(crate) peer: usize,
    /// The peer's pid, from its endpoint: the server must be that process.
    pub(crate) pid: u32,
    /// Bound on each socket operation.
    pub(crate) timeout: Duration,
}

impl FdSource<'_> {
    fn lost_or(&self, e: Error) -> Error {
        // ESRCH: the process no longer exists. The endpoint decoder only accepts pids in
        // 1..=i32::MAX.
        if nix::sys::signal::kill(Pid::from_raw(self.pid as i32), None) == Err(Errno::ESRCH) {
            return Error::peer_lost(
                self.peer,
                "cudaipc import",
                format!("process {} no longer exists ({e})", self.pid),
            );
        }
        e
    }

    fn io_error(&self, step: &str, e: Errno) -> Error {
        match e {
            Errno::EAGAIN | Errno::ETIMEDOUT => Error::timeout(
                format!("{step} on @{} (fd server of rank {})", self.name, self.peer),
                Some(self.peer),
                self.timeout,
            ),
            Errno::ECONNREFUSED | Errno::ENOENT => self.lost_or(Error::transport(
                crate::NAME,
                format!(
                    "nobody listens on @{}: rank {}'s cudaipc backend is gone (its communicator was dropped, or it \
                     runs in another network namespace)",
                    self.name, self.peer
                ),
            )),
            Errno::ECONNRESET | Errno::EPIPE => self.lost_or(Error::transport(
                crate::NAME,
                format!("rank {} closed the connection to its fd server during {step}", self.peer),
            )),
            e => Error::errno(format!("{step} on @{} (fd server of rank {})", self.name, self.peer), e),
        }
    }

    /// Sends `request` (`what`, for errors) to the server and returns its reply with the
    /// descriptors that rode along.
    fn ask(&self, request: &Request, what: &str) -> Result<(Reply, Vec<OwnedFd>)> {
        let sock = seqpacket_socket("cudaipc fd client")?;
        set_timeouts(&sock, self.timeout, "cudaipc fd client")?;
        let addr = UnixAddr::new_abstract(self.name.as_bytes())
            .map_err(|e| Error::errno(format!("address @{}", self.name), e))?;
        let deadline = Deadline::after(self.timeout);
        let mut attempt = 0;
        retry(&deadline, || {
            attempt += 1;
            match connect(sock.as_raw_fd(), &addr) {
                // An interrupted connect may have completed meanwhile.
                Err(Errno::EISCONN) if attempt > 1 => Ok(()),
                r => r,
            }
        })
        .map_err(|e| self.io_error("connect", e))?;
        let cred = getsockopt(&sock, sockopt::PeerCredentials).map_err(|e| Error::errno("SO_PEERCRED", e))?;
        let uid = nix::unistd::geteuid().as_raw();
        if u32::try_from(cred.pid()).ok() != Some(self.pid) || cred.uid() != uid {
            return Err(Error::transport(
                crate::NAME,
                format!(
                    "@{} is served by pid {} (uid {}), but rank {} is pid {} (uid {uid}): refusing to ask it",
                    self.name,
                    cred.pid(),
                    cred.uid(),
                    self.peer,
                    self.pid
                ),
            ));
        }
        let request = payload::encode_request(request);
        retry(&deadline, || {
            sendmsg::<()>(sock.as_raw_fd(), &[IoSlice::new(&request)], &[], MsgFlags::MSG_NOSIGNAL, None)
        })
        .map_err(|e| self.io_error("sending the request", e))?;

        let mut buf = vec![0u8; REPLY_BUFFER];
        let mut cmsg = nix::cmsg_space!([RawFd; 2]);
        let mut fds: Vec<OwnedFd> = Vec::new();
        let (n, flags, cmsg_ok) = loop {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
                Ok(msg) => msg,
                Err(Errno::EINTR) if !deadline.expired() => continue,
                Err(Errno::EINTR) => return Err(self.io_error("receiving the reply", Errno::EAGAIN)),
                Err(e) => return Err(self.io_error("receiving the reply", e)),
            };
            let mut cmsg_ok = true;
            match msg.cmsgs() {
                Ok(iter) => {
                    for c in iter {
                        if let ControlMessageOwned::ScmRights(received) = c {
                            for fd in received {
                                // SAFETY: the kernel installed these descriptors in this process
                                // for this message; nothing else owns them.
                                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                            }
                        }
                    }
                }
                Err(_) => cmsg_ok = false,
            }
            break (msg.bytes, msg.flags, cmsg_ok);
        };
        if n == 0 {
            return Err(self.lost_or(Error::transport(
                crate::NAME,
                format!("rank {} closed its fd server connection without replying to {what}", self.peer),
            )));
        }
        if flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) || !cmsg_ok {
            return Err(Error::protocol(format!(
                "cudaipc fd server reply from rank {} to {what} was truncated",
                self.peer
            )));
        }
        Ok((payload::decode_reply(&buf[..n])?, fds))
    }

    /// Asks the server for allocation `id`, which its export payload says has `size` bytes.
    pub(crate) fn fetch(&self, id: u64, size: u64) -> Result<OwnedFd> {
        let (reply, mut fds) = self.ask(&Request::Fd { id }, "a descriptor request")?;
        match reply {
            Reply::Fd { size: got } => {
                if fds.len() != 1 {
                    return Err(Error::protocol(format!(
                        "cudaipc fd reply from rank {} carried {} descriptors, expected 1",
                        self.peer,
                        fds.len()
                    )));
                }
                if got != size {
                    return Err(Error::protocol(format!(
                        "rank {} says allocation {id} has {got} bytes, its export said {size}",
                        self.peer
                    )));
                }
                fds.pop().ok_or_else(|| Error::protocol("cudaipc fd reply without a descriptor"))
            }
            Reply::Error(m) => {
                Err(Error::transport(crate::NAME, format!("rank {} did not hand out allocation {id}: {m}", self.peer)))
            }
            other => Err(Error::protocol(format!("rank {} answered a descriptor request with {other:?}", self.peer))),
        }
    }

    /// Asks the server to map this process's memory that `payload` exports (`len` bytes) under
    /// `key`; returns its address in the server's process.
    pub(crate) fn map(&self, key: u64, len: usize, payload: Vec<u8>) -> Result<u64> {
        let request = Request::Map { key, len: len as u64, payload };
        match self.ask(&request, "a map request")?.0 {
            Reply::Mapped { address } if address != 0 => Ok(address),
            Reply::Error(m) => Err(Error::transport(
                crate::NAME,
                format!("rank {} could not map this rank's memory ({len} bytes): {m}", self.peer),
            )),
            other => Err(Error::protocol(format!("rank {} answered a map request with {other:?}", self.peer))),
        }
    }

    /// Asks the server to drop the mapping it keeps under `key` for this process.
    pub(crate) fn unmap(&self, key: u64) -> Result<()> {
        match self.ask(&Request::Unmap { key }, "an unmap request")?.0 {
            Reply::Unmapped => Ok(()),
            Reply::Error(m) => {
                Err(Error::transport(crate::NAME, format!("rank {} did not unmap {key}: {m}", self.peer)))
            }
            other => Err(Error::protocol(format!("rank {} answered an unmap request with {other:?}", self.peer))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_job_rank_and_communicator() {
        assert_eq!(socket_name("abc_1", 3, 7), "weave-abc_1-r3-c7");
        assert_eq!(timeval(Duration::ZERO).num_microseconds(), 1000);
        assert_eq!(timeval(Duration::from_secs(2)).num_microseconds(), 2_000_000);
    }

    /// A fake server speaking raw bytes, to test the client against garbage without a GPU.
    fn fake_server(name: &str, reply: Vec<u8>, send_fds: usize) -> std::thread::JoinHandle<()> {
        let listener = seqpacket_socket("test").unwrap();
        let addr = UnixAddr::new_abstract(name.as_bytes()).unwrap();
        bind(listener.as_raw_fd(), &addr).unwrap();
        listen(&listener, Backlog::new(4).unwrap()).unwrap();
        std::thread::spawn(move || {
            // SAFETY: accept4 returned a fresh descriptor.
            let conn = unsafe { OwnedFd::from_raw_fd(accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC).unwrap()) };
            let mut buf = [0u8; REQUEST_BUFFER];
            let n = {
                let mut iov = [IoSliceMut::new(&mut buf)];
                match recvmsg::<()>(conn.as_raw_fd(), &mut iov, None, MsgFlags::empty()) {
                    Ok(m) => m.bytes,
                    Err(_) => return,
                }
            };
            // A client that gave up (refused this server) sends nothing.
            if payload::decode_request(&buf[..n]).is_err() {
                return;
            }
            let pipes: Vec<(OwnedFd, OwnedFd)> = (0..send_fds).map(|_| nix::unistd::pipe().unwrap()).collect();
            let raw: Vec<RawFd> = pipes.iter().map(|p| p.0.as_raw_fd()).collect();
            let cmsgs: Vec<ControlMessage<'_>> =
                if raw.is_empty() { vec![] } else { vec![ControlMessage::ScmRights(&raw)] };
            sendmsg::<()>(conn.as_raw_fd(), &[IoSlice::new(&reply)], &cmsgs, MsgFlags::MSG_NOSIGNAL, None).unwrap();
        })
    }

    fn source(name: &str) -> FdSource<'_> {
        FdSource { name, peer: 1, pid: std::process::id(), timeout: Duration::from_secs(5) }
    }

    fn unique(tag: &str) -> String {
        format!("weave-test-{tag}-{}-{:?}", std::process::id(), std::thread::current().id())
    }

    #[test]
    fn client_takes_exactly_one_descriptor_of_the_announced_size() {
        let name = unique("ok");
        let t = fake_server(&name, payload::encode_reply(&Reply::Fd { size: 4096 }), 1);
        let fd = source(&name).fetch(9, 4096).unwrap();
        assert!(fd.as_raw_fd() >= 0);
        t.join().unwrap();
    }

    #[test]
    fn client_rejects_bad_replies() {
        let cases: Vec<(&str, Vec<u8>, usize)> = vec![
            ("nofd", payload::encode_reply(&Reply::Fd { size: 4096 }), 0),
            ("twofds", payload::encode_reply(&Reply::Fd { size: 4096 }), 2),
            ("size", payload::encode_reply(&Reply::Fd { size: 8192 }), 1),
            ("garbage", b"garbage!".to_vec(), 1),
            ("refused", payload::encode_reply(&Reply::Error("no such allocation".into())), 0),
        ];
        for (tag, reply, nfds) in cases {
            let name = unique(tag);
            let t = fake_server(&name, reply, nfds);
            let r = source(&name).fetch(9, 4096);
            assert!(matches!(r, Err(Error::Protocol(_) | Error::Transport { .. })), "{tag}: {r:?}");
            t.join().unwrap();
        }
    }

    #[test]
    fn map_and_unmap_take_only_their_own_replies() {
        let payload = vec![1, 2, 3];
        let name = unique("mapped");
        let t = fake_server(&name, payload::encode_reply(&Reply::Mapped { address: 0x7f00_0000_2000 }), 0);
        assert_eq!(source(&name).map(4, 4096, payload.clone()).unwrap(), 0x7f00_0000_2000);
        t.join().unwrap();
        let name = unique("unmapped");
        let t = fake_server(&name, payload::encode_reply(&Reply::Unmapped), 0);
        source(&name).unmap(4).unwrap();
        t.join().unwrap();
        let wrong: Vec<(&str, Reply, bool)> = vec![
            ("map-fd", Reply::Fd { size: 1 }, true),
            ("map-null", Reply::Mapped { address: 0 }, true),
            ("map-refused", Reply::Error("cannot open the handle".into()), true),
            ("unmap-mapped", Reply::Mapped { address: 8 }, false),
            ("unmap-refused", Reply::Error("no mapping 4".into()), false),
        ];
        for (tag, reply, map) in wrong {
            let name = unique(tag);
            let t = fake_server(&name, payload::encode_reply(&reply), 0);
            let r = if map { source(&name).map(4, 4096, payload.clone()).map(|_| ()) } else { source(&name).unmap(4) };
            assert!(matches!(r, Err(Error::Protocol(_) | Error::Transport { .. })), "{tag}: {r:?}");
            t.join().unwrap();
        }
    }

    #[test]
    fn nobody_listening_is_a_clear_error_and_a_dead_pid_is_peer_lost() {
        let name = unique("none");
        let r = source(&name).fetch(1, 1);
        assert!(matches!(&r, Err(Error::Transport { message, .. }) if message.contains("nobody listens")), "{r:?}");
        let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let src = FdSource { name: &name, peer: 4, pid, timeout: Duration::from_secs(1) };
        assert!(matches!(src.fetch(1, 1), Err(Error::PeerLost { peer: 4, .. })));
    }

    #[test]
    fn a_server_of_another_pid_is_refused() {
        let name = unique("pid");
        let t = fake_server(&name, payload::encode_reply(&Reply::Fd { size: 1 }), 1);
        let src = FdSource { name: &name, peer: 2, pid: 1, timeout: Duration::from_secs(1) };
        let r = src.fetch(9, 1);
        assert!(matches!(&r, Err(Error::Transport { message, .. }) if message.contains("is served by pid")), "{r:?}");
        // The client hung up without a request; the fake server returns.
        t.join().unwrap();
    }

    #[test]
    fn silent_server_times_out() {
        let name = unique("silent");
        let listener = seqpacket_socket("test").unwrap();
        bind(listener.as_raw_fd(), &UnixAddr::new_abstract(name.as_bytes()).unwrap()).unwrap();
        listen(&listener, Backlog::new(4).unwrap()).unwrap();
        // Never accepted: connect succeeds (backlog), the reply never comes.
        let src = FdSource { name: &name, peer: 3, pid: std::process::id(), timeout: Duration::from_millis(100) };
        let started = std::time::Instant::now();
        let r = src.fetch(9, 1);
        assert!(matches!(r, Err(Error::Timeout { peer: Some(3), .. })), "{r:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
