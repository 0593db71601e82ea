//! The sending side: a connection to one peer over several sockets (stripes), each fed by a
//! thread of its own, so large writes cross the network on every socket at once. The sockets
//! are the pair's one set, which carries the peer's frames to this rank too (see
//! [`crate::listener`]): the lower rank dials it, the higher takes it as accepted.
//!
//! [`write`](Connection::write) cuts the bytes into frames of at most `MAX_FRAME_BYTES`, deals
//! them round-robin to the stripes and returns (the source must stay untouched until the peer
//! has it, as for every asynchronous connection). [`update_and_sync`](Connection::update_and_sync)
//! sends a flag on stripe 0 carrying how many data frames each stripe had been given, so the
//! peer stores it only after all of them; [`flush`](Connection::flush) asks the peer to answer
//! once it has applied everything and waits for the answer. A socket that fails marks the
//! connection lost: every later call is [`Error::PeerLost`].
//!
//! Small frames skip the hand-off: when nothing is queued on their stripe, the caller writes
//! them to the socket itself (under the stripe's socket lock, which the stripe's thread holds
//! for each frame it writes), saving a thread wake-up on the latency path of small messages.
//! A small write goes on stripe 0, where its flag follows, so the peer needs no other stripe
//! to store the flag; [`write_and_sync`](Connection::write_and_sync) sends both frames with one
//! `writev`. [`progress`](Connection::progress) applies the peer's frames *to this rank* on the
//! calling thread (see [`crate::receive`]).
//!
//! A credit ([`update_lazily`](Connection::update_lazily)) is held back rather than sent in a
//! frame of its own: it goes out in front of the next frame on stripe 0 — in the same `writev`
//! as the next message to this peer, typically — or when this rank next waits on this peer
//! ([`progress`](Connection::progress)), or when any wait of this process outlasts its spin
//! ([`comm_core::deferred`]). At most one is held per connection: a second one sends both.

use std::io::{IoSlice, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use comm_core::connection::{CheckedWrite, Connection, spin_until_peer};
use comm_core::deadline::Deadline;
use comm_core::deferred::HeldSends;
use comm_core::memory::RegisteredMemory;
use comm_core::tcp_bounded::{connect_within, read_exact_within, write_all_within};
use comm_core::transport::Transport;
use comm_core::{Error, Result};

use crate::listener::{Inbound, OFFER_GRACE};
use crate::receive::PeerInbound;
use crate::region::RemoteRegion;
use crate::wire::{FrameHeader, FrameKind, HANDSHAKE_OK, Handshake, MAX_FRAME_BYTES};
use crate::writer::SocketWriter;

/// One unit of work for a stripe's thread.
enum Job {
    /// A data frame: `len` bytes at `offset` of `src` (kept alive until sent).
    Data { header: FrameHeader, src: RegisteredMemory, offset: usize },
    /// A flag or flush frame and the per-stripe data frame counts it waits for.
    Control { header: FrameHeader, counts: Vec<u64> },
    /// A small data frame and the flag behind it, written with one system call.
    DataAndFlag { data: FrameHeader, src: RegisteredMemory, offset: usize, flag: FrameHeader, counts: Vec<u64> },
}

/// Largest data frame a caller writes itself when its stripe has nothing queued. A write of at
/// most this many bytes also goes on stripe 0, with the flags: the peer then finds the data
/// before the flag on the same socket, without waiting for another stripe. A whole slot of a
/// two-rank channel link (512 KiB and its header) fits: handing such a message to a stripe's
/// thread cost a thread wake-up per message (docs/perf-log/nodes.md, "Across nodes: messages up
/// to 1 MiB written by the caller"); larger writes are striped over the sockets by their
/// threads. At most one frame.
const INLINE_MAX_BYTES: usize = MAX_FRAME_BYTES;

/// One socket of the connection: its thread's queue, and what the thread and the callers share.
struct Stripe {
    queue: Sender<Job>,
    /// Written by the stripe's thread, one frame per lock, by callers sending inline, and by
    /// this rank's answers to the peer's flushes.
    socket: Arc<SocketWriter>,
    /// Jobs handed to the thread and not written yet (decremented under the socket lock).
    queued: Arc<AtomicUsize>,
}

impl Stripe {
    /// Sends `job` on this stripe, behind `first` (a held control frame) when there is one:
    /// written here when the job is a small data or flag frame and nothing is queued before
    /// it, else handed to the stripe's thread. A failed write marks the connection lost for
    /// every later call, but counts as handed off — a peer that closed its side after its last
    /// call simply does not read it (a credit returned as it finishes, say).
    fn send(&self, first: Option<Job>, job: Job, shared: &Shared, peer: usize) -> Result<()> {
        let small = match &job {
            Job::Data { header, .. } | Job::DataAndFlag { data: header, .. } => {
                header.value as usize <= INLINE_MAX_BYTES
            }
            Job::Control { header, .. } => header.kind == FrameKind::Flag,
        };
        if small && self.queued.load(Ordering::Acquire) == 0 {
            let mut socket = self.socket.lock();
            // The thread decrements under this lock: zero here means all it was given is out.
            if self.queued.load(Ordering::Acquire) == 0 {
                let prefix = match &first {
                    Some(Job::Control { header, counts }) => control_frame(header, counts),
                    _ => Vec::new(),
                };
                let written = write_job(&mut socket, &prefix, &job);
                if written.is_err() {
                    let _ = socket.shutdown(std::net::Shutdown::Both);
                }
                drop(socket);
                if let Err(e) = written.and_then(|()| self.socket.send_owed()) {
                    shared.fail(format!("tcp socket to rank {peer}: {e}"));
                }
                return Ok(());
            }
            drop(socket);
        }
        if let Some(first) = first {
            self.enqueue(first, peer)?;
        }
        self.enqueue(job, peer)
    }

    fn enqueue(&self, job: Job, peer: usize) -> Result<()> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        self.queue.send(job).map_err(|_| Error::peer_lost(peer, "tcp send", "the sender thread stopped"))
    }
}

/// A credit this connection holds back (see the module doc), and what sending it needs.
struct Held {
    flag: Mutex<Option<Job>>,
    /// Whether [`comm_core::deferred`] holds this holder now: it registers once per wait that
    /// sends it, not once per credit (a rank whose messages are always there before it looks
    /// may return many credits between two waits).
    registered: AtomicBool,
    /// Stripe 0, while the connection lives.
    stripe: Weak<Stripe>,
    shared: Arc<Shared>,
    peer: usize,
}

impl Held {
    fn take(&self) -> Option<Job> {
        self.flag.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl HeldSends for Held {
    fn send_held(&self) {
        // Cleared before the take: a credit held after it registers again.
        self.registered.store(false, Ordering::Release);
        let Some(flag) = self.take() else { return };
        if let Some(stripe) = self.stripe.upgrade() {
            // A failure marks the connection lost; its next call reports it.
            let _ = stripe.send(None, flag, &self.shared, self.peer);
        }
    }
}

/// What the stripes' threads share with the connection.
struct Shared {
    failure: Mutex<Option<String>>,
}

impl Shared {
    fn fail(&self, why: String) {
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(why);
    }

    fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Per-stripe data frames handed out so far, and the next flush number.
struct Order {
    sent: Vec<u64>,
    next_stripe: usize,
    flushes: u64,
}

/// A connection to one peer over TCP.
pub struct TcpConnection {
    transport: Transport,
    peer: usize,
    stripes: Vec<Arc<Stripe>>,
    held: Arc<Held>,
    threads: Vec<JoinHandle<()>>,
    order: Mutex<Order>,
    shared: Arc<Shared>,
    inbound: Arc<Inbound>,
    /// The peer's sockets into this rank, which [`progress`](Connection::progress) drains.
    from_peer: Arc<PeerInbound>,
    timeout: Duration,
    abort: Arc<AtomicBool>,
}

impl std::fmt::Debug for TcpConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConnection").field("peer", &self.peer).field("stripes", &self.stripes.len()).finish()
    }
}

/// Everything [`TcpConnection::open`] needs besides the peer's address.
pub(crate) struct Dial {
    pub(crate) transport: Transport,
    pub(crate) rank: usize,
    pub(crate) stripes: usize,
    pub(crate) inbound: Arc<Inbound>,
    pub(crate) timeout: Duration,
    pub(crate) abort: Arc<AtomicBool>,
}

impl TcpConnection {
    /// The connection to `peer` at `addr` (whose `token` its sockets present): on the set of
    /// sockets the peer dialled to this rank when the peer is the lower rank and its set comes
    /// within [`OFFER_GRACE`], else on `dial.stripes` sockets dialled here.
    pub(crate) fn open(peer: usize, addr: SocketAddr, token: [u8; 16], dial: Dial) -> Result<Self> {
        let offered =
            if peer < dial.rank { dial.inbound.take_offered(peer, OFFER_GRACE.min(dial.timeout)) } else { None };
        let sockets = match offered {
            Some(set) => set,
            None => dial_set(peer, addr, token, &dial)?,
        };
        let shared = Arc::new(Shared { failure: Mutex::new(None) });
        let (mut stripes, mut threads) = (Vec::new(), Vec::new());
        for (stripe, socket) in sockets.into_iter().enumerate() {
            let queued = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = channel();
            let (shared, thread_socket, thread_queued) = (shared.clone(), socket.clone(), queued.clone());
            let t = std::thread::Builder::new()
                .name(format!("weave-tcp-send-{peer}.{stripe}"))
                .spawn(move || send_loop(&thread_socket, rx, &shared, &thread_queued, peer))
                .map_err(|e| Error::io("spawn a tcp sender thread", e))?;
            stripes.push(Arc::new(Stripe { queue: tx, socket, queued }));
            threads.push(t);
        }
        let held = Arc::new(Held {
            flag: Mutex::new(None),
            registered: AtomicBool::new(false),
            stripe: Arc::downgrade(&stripes[0]),
            shared: shared.clone(),
            peer,
        });
        Ok(TcpConnection {
            transport: dial.transport,
            peer,
            held,
            order: Mutex::new(Order { sent: vec![0; stripes.len()], next_stripe: 0, flushes: 0 }),
            stripes,
            threads,
            shared,
            from_peer: dial.inbound.peer(peer),
            inbound: dial.inbound,
            timeout: dial.timeout,
            abort: dial.abort,
        })
    }

    /// `Err(PeerLost)` once a socket to the peer failed. A peer that merely closed its side
    /// after its last call does not fail a send: like a store into shared memory it has left,
    /// the bytes are simply not read (a credit returned as it finishes, say).
    fn check_sending(&self) -> Result<()> {
        match self.shared.failure() {
            Some(why) => Err(self.lost("tcp send", why)),
            None => Ok(()),
        }
    }

    fn lost(&self, operation: &str, why: String) -> Error {
        Error::peer_lost(self.peer, operation, why)
    }

    /// Sends `job` on `stripe`; on stripe 0, behind the credit held back, if any.
    fn send(&self, stripe: usize, job: Job) -> Result<()> {
        let first = if stripe == 0 { self.held.take() } else { None };
        self.stripes[stripe].send(first, job, &self.shared, self.peer)
    }

    /// Hands `job` to `stripe`'s thread (behind the held credit, on stripe 0).
    fn enqueue(&self, stripe: usize, job: Job) -> Result<()> {
        if stripe == 0
            && let Some(first) = self.held.take()
        {
            self.stripes[0].enqueue(first, self.peer)?;
        }
        self.stripes[stripe].enqueue(job, self.peer)
    }

    fn remote<'a>(&self, dst: &'a RegisteredMemory) -> Result<&'a RemoteRegion> {
        comm_core::connection::peer_region(dst, self.peer, crate::NAME)
    }

    /// The header of a flag storing `value` at `dst[dst_offset]`, once the word was checked to
    /// lie in the peer's region, 8-byte aligned.
    fn flag_header(&self, dst: &RegisteredMemory, dst_offset: usize, value: u64) -> Result<FrameHeader> {
        dst.check_range(dst_offset, 8)?;
        let remote = self.remote(dst)?;
        if !dst_offset.is_multiple_of(8) {
            return Err(Error::invalid(format!("tcp flag at offset {dst_offset} is not 8-byte aligned")));
        }
        Ok(FrameHeader { kind: FrameKind::Flag, region: remote.id, offset: dst_offset as u64, value, sequence: 0 })
    }
}

/// Dials `dial.stripes` sockets to `peer` at `addr` and reads each of them here as well.
fn dial_set(peer: usize, addr: SocketAddr, token: [u8; 16], dial: &Dial) -> Result<Vec<Arc<SocketWriter>>> {
    let rank = u32::try_from(dial.rank).map_err(|_| Error::invalid("rank does not fit the tcp handshake"))?;
    let stripes = u16::try_from(dial.stripes).map_err(|_| Error::invalid("too many tcp sockets"))?;
    (0..stripes)
        .map(|stripe| {
            let hello = Handshake { token, rank, stripe, stripes };
            let socket = dial_socket(peer, addr, &hello, dial.timeout, &dial.abort)?;
            dial.inbound.attach(socket, peer, stripe, stripes)
        })
        .collect()
}

/// Dials one socket to `peer` at `addr` and presents `hello` on it: the connect and the
/// listener's answer are bounded by `timeout` and end within
/// [`CANCEL_LOOK`](comm_core::deadline::CANCEL_LOOK) once `abort` is set (a peer whose host
/// drops the handshake holds no one up for longer than the caller wants).
fn dial_socket(
    peer: usize,
    addr: SocketAddr,
    hello: &Handshake,
    timeout: Duration,
    abort: &Arc<AtomicBool>,
) -> Result<TcpStream> {
    let deadline = Deadline::cancellable(timeout, abort.clone());
    let operation = || format!("tcp connect to {addr}");
    let lost = |e: std::io::Error| {
        if deadline.expired() {
            deadline.give_up(operation(), Some(peer))
        } else {
            Error::peer_lost(peer, operation(), format!("{e}"))
        }
    };
    let s = connect_within(addr, timeout, &deadline).map_err(lost)?;
    s.set_nodelay(true).map_err(lost)?;
    write_all_within(&s, &hello.encode(), &deadline).map_err(lost)?;
    let mut ok = [0u8; 1];
    read_exact_within(&s, &mut ok, &deadline).map_err(lost)?;
    if ok[0] != HANDSHAKE_OK {
        return Err(Error::protocol(format!("rank {peer} refused the tcp handshake")));
    }
    // The handshake left its last short slice as the timeouts; later frames get the comm timeout.
    s.set_read_timeout(Some(timeout)).map_err(lost)?;
    s.set_write_timeout(Some(timeout)).map_err(lost)?;
    Ok(s)
}

/// The payload of a data frame: `header.value` bytes at `offset` of `src`.
fn payload<'a>(header: &FrameHeader, src: &'a RegisteredMemory, offset: usize) -> &'a [u8] {
    // SAFETY: `offset + header.value` was checked against `src`, a host-mapped registration
    // that the job holding `src` keeps alive while the slice is used.
    unsafe { std::slice::from_raw_parts(src.as_ptr().add(offset), header.value as usize) }
}

/// A flag or flush frame: its header, then one count per stripe.
fn control_frame(header: &FrameHeader, counts: &[u64]) -> Vec<u8> {
    let mut frame = header.encode().to_vec();
    counts.iter().for_each(|c| frame.extend_from_slice(&c.to_le_bytes()));
    frame
}

/// Writes all of `bufs`, with as few system calls as the socket takes.
fn write_all_vectored(socket: &mut TcpStream, mut bufs: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    while !bufs.is_empty() {
        match socket.write_vectored(bufs) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `prefix` (frames sent ahead, or nothing) and one job's frames to `socket`, in one
/// system call where the socket takes them.
fn write_job(socket: &mut TcpStream, prefix: &[u8], job: &Job) -> std::io::Result<()> {
    match job {
        Job::Data { header, src, offset } => {
            let head = header.encode();
            let mut bufs = [IoSlice::new(prefix), IoSlice::new(&head), IoSlice::new(payload(header, src, *offset))];
            write_all_vectored(socket, &mut bufs)
        }
        Job::DataAndFlag { data, src, offset, flag, counts } => {
            let (head, tail) = (data.encode(), control_frame(flag, counts));
            let mut bufs = [
                IoSlice::new(prefix),
                IoSlice::new(&head),
                IoSlice::new(payload(data, src, *offset)),
                IoSlice::new(&tail),
            ];
            write_all_vectored(socket, &mut bufs)
        }
        Job::Control { header, counts } => {
            let frame = control_frame(header, counts);
            write_all_vectored(socket, &mut [IoSlice::new(prefix), IoSlice::new(&frame)])
        }
    }
}

/// A stripe's thread: writes its jobs in order, one frame per hold of the socket lock, and
/// counts each one out of `queued` before it lets go (then sends any flush answer owed).
fn send_loop(socket: &SocketWriter, jobs: Receiver<Job>, shared: &Shared, queued: &AtomicUsize, peer: usize) {
    for job in jobs {
        let mut s = socket.lock();
        let r = write_job(&mut s, &[], &job);
        queued.fetch_sub(1, Ordering::AcqRel);
        if r.is_err() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        drop(s);
        if let Err(e) = r.and_then(|()| socket.send_owed()) {
            shared.fail(format!("tcp socket to rank {peer}: {e}"));
            return;
        }
    }
    let s = socket.lock();
    let _ = s.shutdown(std::net::Shutdown::Write);
}

impl Drop for TcpConnection {
    fn drop(&mut self) {
        self.stripes.clear(); // the threads finish what is queued, then end
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Connection for TcpConnection {
    fn transport(&self) -> Transport {
        self.transport
    }

    fn peer(&self) -> usize {
        self.peer
    }

    fn write_checked(&self, write: CheckedWrite<'_>) -> Result<()> {
        let remote = self.remote(write.dst)?;
        if !write.src.is_host_mapped() {
            return Err(Error::invalid(format!("tcp write from {:?}: not host memory mapped here", write.src.label())));
        }
        self.check_sending()?;
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        let mut done = 0;
        while done < write.len {
            let n = (write.len - done).min(MAX_FRAME_BYTES);
            let stripe = if write.len <= INLINE_MAX_BYTES {
                0
            } else {
                let s = order.next_stripe;
                order.next_stripe = (s + 1) % self.stripes.len();
                s
            };
            let header = FrameHeader {
                kind: FrameKind::Data,
                region: remote.id,
                offset: (write.dst_offset + done) as u64,
                value: n as u64,
                sequence: 0,
            };
            self.send(stripe, Job::Data { header, src: write.src.clone(), offset: write.src_offset + done })?;
            order.sent[stripe] += 1;
            done += n;
        }
        Ok(())
    }

    fn update_and_sync(&self, dst: &RegisteredMemory, dst_offset: usize, value: u64) -> Result<()> {
        let header = self.flag_header(dst, dst_offset, value)?;
        self.check_sending()?;
        let order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        self.send(0, Job::Control { header, counts: order.sent.clone() })
    }

    fn update_lazily(&self, dst: &RegisteredMemory, dst_offset: usize, value: u64) -> Result<()> {
        let header = self.flag_header(dst, dst_offset, value)?;
        self.check_sending()?;
        let order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        let flag = Job::Control { header, counts: order.sent.clone() };
        let earlier = {
            let mut held = self.held.flag.lock().unwrap_or_else(|p| p.into_inner());
            match held.take() {
                None => {
                    *held = Some(flag);
                    drop(held);
                    if !self.held.registered.swap(true, Ordering::AcqRel) {
                        comm_core::deferred::hold(self.held.clone());
                    }
                    return Ok(());
                }
                Some(earlier) => earlier,
            }
        };
        // One credit is held already: this one goes out now, behind it.
        self.stripes[0].send(Some(earlier), flag, &self.shared, self.peer)
    }

    fn write_and_sync(&self, write: CheckedWrite<'_>, flag_offset: usize, value: u64) -> Result<()> {
        if write.len == 0 || write.len > INLINE_MAX_BYTES {
            self.write_checked(write)?;
            return self.update_and_sync(write.dst, flag_offset, value);
        }
        let remote = self.remote(write.dst)?;
        if !write.src.is_host_mapped() {
            return Err(Error::invalid(format!("tcp write from {:?}: not host memory mapped here", write.src.label())));
        }
        let flag = self.flag_header(write.dst, flag_offset, value)?;
        self.check_sending()?;
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        let data = FrameHeader {
            kind: FrameKind::Data,
            region: remote.id,
            offset: write.dst_offset as u64,
            value: write.len as u64,
            sequence: 0,
        };
        // The flag counts the data frame it travels behind, as if the two were sent apart.
        order.sent[0] += 1;
        let counts = order.sent.clone();
        self.send(0, Job::DataAndFlag { data, src: write.src.clone(), offset: write.src_offset, flag, counts })
    }

    fn flush(&self) -> Result<()> {
        self.check_peer()?;
        let sequence = {
            let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
            order.flushes += 1;
            let header =
                FrameHeader { kind: FrameKind::Flush, region: 0, offset: 0, value: 0, sequence: order.flushes };
            self.enqueue(0, Job::Control { header, counts: order.sent.clone() })?;
            order.flushes
        };
        let operation = format!("tcp flush to rank {}", self.peer);
        spin_until_peer(self, &operation, self.timeout, &self.abort, || self.from_peer.answered() >= sequence)
    }

    fn progress(&self) -> Result<()> {
        // The wait this serves is on the peer, which may need the credit to go on.
        if let Some(flag) = self.held.take() {
            self.stripes[0].send(None, flag, &self.shared, self.peer)?;
        }
        self.from_peer.progress(self.peer, &self.inbound)
    }

    fn check_peer(&self) -> Result<()> {
        if let Some(why) = self.shared.failure() {
            return Err(self.lost("tcp send", why));
        }
        if let Some(why) = self.inbound.lost(self.peer) {
            return Err(self.lost("tcp receive", why));
        }
        Ok(())
    }
}
