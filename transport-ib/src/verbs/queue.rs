//! Completion queues, the completion channel that tells a sleeping thread a queue has entries,
//! and reliable-connected queue pairs with the work requests posted to them.
//!
//! Ownership keeps verbs' destruction order: a queue pair holds its completion queues, and a
//! completion queue holds its channel, so each goes only after everything that uses it.

use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use comm_core::{Error, Result};
use ibverbs_sys as ffi;

use super::{Port, PortAddress, ProtectionDomain, created, errno, verbs_failed};

/// Inline bytes asked of a queue pair: a small write or a flag record then travels inside the
/// work request, and the device reads no memory for it (providers that offer less get less).
const INLINE_BYTES_WANTED: u32 = 256;

/// A completion channel: a file descriptor that becomes readable when a completion queue armed
/// on it ([`CompletionQueue::arm`]) gets an entry.
pub struct CompletionChannel {
    port: Arc<Port>,
    channel: NonNull<ffi::ibv_comp_channel>,
}

// SAFETY: a channel is a file descriptor verbs lets any thread read; this type adds no state.
unsafe impl Send for CompletionChannel {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    /// A channel on `port`'s device, its descriptor non-blocking.
    pub fn new(port: &Arc<Port>) -> Result<Arc<Self>> {
        // SAFETY: an open context.
        let channel = unsafe { ffi::ibv_create_comp_channel(port.context.as_ptr()) };
        let channel = created(channel, "ibv_create_comp_channel", &port.device)?;
        let this = CompletionChannel { port: port.clone(), channel };
        let fd = this.fd();
        // SAFETY: fcntl on the channel's own open descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(Error::transport(
                crate::NAME,
                format!("making the completion channel of {} non-blocking: {}", port.device, errno()),
            ));
        }
        Ok(Arc::new(this))
    }

    fn fd(&self) -> RawFd {
        // SAFETY: a live channel.
        unsafe { self.channel.as_ref().fd }
    }

    /// Waits up to `timeout` for the channel to hold an event; whether it does.
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        let mut pfd = libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = errno();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(Error::transport(crate::NAME, format!("poll on the completion channel: {e}")));
        }
        Ok(n > 0)
    }

    /// Takes one event without waiting and acknowledges it: the `context` of the queue it came
    /// from (as given to [`CompletionQueue::with_channel`]), or `None` when there is none. The
    /// queue is disarmed by its event: arm it again to hear of the next entry.
    pub fn take_event(&self) -> Result<Option<u64>> {
        let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
        let mut context: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: a live channel whose descriptor is non-blocking; out-pointers to locals.
        let rc = unsafe { ffi::ibv_get_cq_event(self.channel.as_ptr(), &mut cq, &mut context) };
        if rc != 0 {
            let e = errno();
            if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(None);
            }
            return Err(Error::transport(crate::NAME, format!("ibv_get_cq_event on {}: {e}", self.port.device)));
        }
        // SAFETY: the event names a live queue (destroying it waits for this acknowledgment).
        unsafe { ffi::ibv_ack_cq_events(cq, 1) };
        Ok(Some(context as u64))
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: every queue on this channel holds an `Arc` of it: none is alive.
        unsafe { ffi::ibv_destroy_comp_channel(self.channel.as_ptr()) };
    }
}

/// A completion queue.
pub struct CompletionQueue {
    port: Arc<Port>,
    cq: NonNull<ffi::ibv_cq>,
    /// The channel its events go to, kept alive while the queue is.
    _channel: Option<Arc<CompletionChannel>>,
}

// SAFETY: polling is serialized by the owner (a connection's lock); the handle itself may move.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// A queue of at least `entries` completions.
    pub fn new(port: &Arc<Port>, entries: i32) -> Result<Arc<Self>> {
        Self::create(port, entries, None, 0)
    }

    /// A queue of at least `entries` completions whose events, once armed, go to `channel`
    /// tagged with `context`.
    pub fn with_channel(
        port: &Arc<Port>,
        entries: i32,
        channel: &Arc<CompletionChannel>,
        context: u64,
    ) -> Result<Arc<Self>> {
        Self::create(port, entries, Some(channel), context)
    }

    fn create(
        port: &Arc<Port>,
        entries: i32,
        channel: Option<&Arc<CompletionChannel>>,
        context: u64,
    ) -> Result<Arc<Self>> {
        let ch = channel.map_or(std::ptr::null_mut(), |c| c.channel.as_ptr());
        // SAFETY: an open context and a live channel (or none); the context is an opaque tag.
        let cq = unsafe { ffi::ibv_create_cq(port.context.as_ptr(), entries, context as *mut _, ch, 0) };
        let cq = created(cq, "ibv_create_cq", &port.device)?;
        Ok(Arc::new(CompletionQueue { port: port.clone(), cq, _channel: channel.cloned() }))
    }

    /// Takes the completions that are there (at most `out.len()`), without waiting. Inlined: a
    /// waiter polls on every turn of its spin.
    #[inline]
    pub fn poll(&self, out: &mut [ffi::ibv_wc]) -> Result<usize> {
        // SAFETY: the context outlives the queue (`port`); `poll_cq` is set by every provider.
        let poll = unsafe { (*self.port.context.as_ptr()).ops.poll_cq }
            .ok_or_else(|| Error::transport(crate::NAME, "the verbs provider has no poll_cq"))?;
        let max = i32::try_from(out.len()).unwrap_or(i32::MAX);
        // SAFETY: a live queue and room for `max` completions.
        let n = unsafe { poll(self.cq.as_ptr(), max, out.as_mut_ptr()) };
        usize::try_from(n).map_err(|_| Error::transport(crate::NAME, format!("ibv_poll_cq failed ({n})")))
    }

    /// Asks for one event on the queue's channel at its next entry.
    pub fn arm(&self) -> Result<()> {
        // SAFETY: the context outlives the queue (`port`).
        let notify = unsafe { (*self.port.context.as_ptr()).ops.req_notify_cq }
            .ok_or_else(|| Error::transport(crate::NAME, "the verbs provider has no req_notify_cq"))?;
        // SAFETY: a live queue.
        let rc = unsafe { notify(self.cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(Error::transport(
                crate::NAME,
                format!("ibv_req_notify_cq on {}: errno {rc}", self.port.device),
            ));
        }
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: queue pairs that use this queue hold an `Arc` of it: none is alive.
        unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

/// A zeroed work completion, to poll into.
pub fn empty_completion() -> ffi::ibv_wc {
    // SAFETY: every field of `ibv_wc` is a plain integer.
    unsafe { std::mem::zeroed() }
}

/// A reliable-connected queue pair.
pub struct QueuePair {
    pd: Arc<ProtectionDomain>,
    qp: NonNull<ffi::ibv_qp>,
    /// The first packet sequence number this side sends.
    psn: u32,
    /// Bytes a work request may carry inline.
    max_inline: u32,
    /// Kept alive while the queue pair is (dropped after it: `Drop` runs before fields drop).
    _queues: [Arc<CompletionQueue>; 2],
}

// SAFETY: posting is serialized by the owners (a connection's send lock, its receive lock).
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

/// What a peer needs to connect its queue pair to this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePairAddress {
    /// The port the queue pair lives on.
    pub port: PortAddress,
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number it sends.
    pub psn: u32,
}

impl QueuePair {
    /// Creates an RC queue pair with room for `depth` outstanding sends (completing on
    /// `send_cq`) and `receives` posted receives (completing on `recv_cq`), moved to INIT.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        depth: u32,
        receives: u32,
        psn: u32,
    ) -> Result<Self> {
        // SAFETY: zeroed is a valid init attribute (null pointers, zero counts).
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.cq.as_ptr();
        init.recv_cq = recv_cq.cq.as_ptr();
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        init.cap.max_send_wr = depth;
        init.cap.max_recv_wr = receives.max(1);
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = INLINE_BYTES_WANTED;
        let device = &pd.port.device;
        // SAFETY: a live domain and queues, and a filled attribute struct (updated with what
        // the provider granted).
        let mut qp = unsafe { ffi::ibv_create_qp(pd.pd.as_ptr(), &mut init) };
        if qp.is_null() {
            // A provider that offers no inline data refuses the request: ask for none.
            init.cap.max_inline_data = 0;
            // SAFETY: as above.
            qp = unsafe { ffi::ibv_create_qp(pd.pd.as_ptr(), &mut init) };
        }
        let qp = created(qp, "ibv_create_qp", device)?;
        let this = QueuePair {
            pd: pd.clone(),
            qp,
            psn: psn & 0xff_ffff,
            max_inline: init.cap.max_inline_data,
            _queues: [send_cq.clone(), recv_cq.clone()],
        };
        // SAFETY: zeroed is a valid attribute struct.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = pd.port.port;
        attr.qp_access_flags = (ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC)
            .0;
        use ffi::ibv_qp_attr_mask as m;
        this.modify(
            &mut attr,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )?;
        Ok(this)
    }

    /// This queue pair's address for the peer.
    pub fn address(&self) -> QueuePairAddress {
        // SAFETY: a live queue pair.
        let qpn = unsafe { self.qp.as_ref().qp_num };
        QueuePairAddress { port: self.pd.port.address(), qpn, psn: self.psn }
    }

    /// Bytes a write or send of this queue pair carries inside its work request.
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }

    fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask, state: &str) -> Result<()> {
        // SAFETY: a live queue pair and a filled attribute struct.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32) };
        if rc != 0 {
            return Err(verbs_failed(&format!("ibv_modify_qp to {state}"), &self.pd.port.device, rc));
        }
        Ok(())
    }

    /// Connects to the peer's queue pair at `remote`: ready to receive, then to send.
    pub fn connect(&self, remote: &QueuePairAddress) -> Result<()> {
        let port = &self.pd.port;
        if remote.port.roce != port.roce {
            return Err(Error::Unsupported(format!(
                "{}: a RoCE port and an InfiniBand port cannot be joined (the peer's is {})",
                port.device,
                if remote.port.roce { "RoCE" } else { "InfiniBand" }
            )));
        }
        // SAFETY: zeroed is a valid attribute struct.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = ffi::ibv_mtu::from(remote.port.mtu).min(port.active_mtu).max(ffi::IBV_MTU_256);
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        attr.max_dest_rd_atomic = 1;
        // Receiver not ready: retry after 0.08 ms (a receive ring is reposted as it is used).
        attr.min_rnr_timer = 4;
        attr.ah_attr.port_num = port.port;
        attr.ah_attr.dlid = remote.port.lid;
        if port.roce {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid.raw = remote.port.gid;
            attr.ah_attr.grh.sgid_index = port.gid_index;
            attr.ah_attr.grh.hop_limit = 64;
        }
        use ffi::ibv_qp_attr_mask as m;
        let rtr = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, rtr, "RTR")?;
        // SAFETY: zeroed is a valid attribute struct.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        attr.sq_psn = self.psn;
        attr.timeout = 14;
        attr.retry_cnt = 7;
        // 7: retry without limit while the peer's receive ring is full (it is reposted as the
        // peer applies what arrived; a peer that is gone fails the bootstrap's liveness instead).
        attr.rnr_retry = 7;
        attr.max_rd_atomic = 1;
        let rts = m::IBV_QP_STATE
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, rts, "RTS")
    }

    /// Posts one work request (see [`WorkRequest`]).
    ///
    /// # Safety
    /// `local` must stay valid and registered (`lkey`) until the request completes (not needed
    /// for a request carried inline: at most [`max_inline`](Self::max_inline) bytes of a write
    /// or send), and the remote range must lie inside the peer's registration of `rkey` (the
    /// caller checks ranges).
    pub unsafe fn post(&self, request: WorkRequest) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.post_chain(&[request]) }
    }

    /// Posts up to [`MAX_CHAIN`] work requests (each as in [`post`](Self::post)) with one call
    /// into the provider: one doorbell, executed in order. Writes and sends of at most
    /// [`max_inline`](Self::max_inline) bytes travel inline.
    ///
    /// # Safety
    /// As [`post`](Self::post), for every request.
    #[inline]
    pub unsafe fn post_chain(&self, requests: &[WorkRequest]) -> Result<()> {
        if requests.is_empty() || requests.len() > MAX_CHAIN {
            return Err(Error::invalid(format!(
                "ib post of {} work requests: a chain holds 1 to {MAX_CHAIN}",
                requests.len()
            )));
        }
        // Only the entries used are written (a small message posts one: no need to clear eight).
        let mut sges = [const { MaybeUninit::<ffi::ibv_sge>::uninit() }; MAX_CHAIN];
        let mut wrs = [const { MaybeUninit::<ffi::ibv_send_wr>::uninit() }; MAX_CHAIN];
        let n = requests.len();
        for (i, request) in requests.iter().enumerate() {
            sges[i].write(ffi::ibv_sge { addr: request.local as u64, length: request.len, lkey: request.lkey });
            // SAFETY: zeroed is a valid work request (null next, no flags).
            let wr = wrs[i].write(unsafe { std::mem::zeroed() });
            wr.wr_id = request.wr_id;
            wr.num_sge = i32::from(request.len > 0);
            let mut flags = if request.signaled { ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 } else { 0 };
            let rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: request.remote, rkey: request.rkey };
            match request.op {
                Operation::Write => {
                    wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                    wr.wr.rdma = rdma;
                }
                Operation::WriteWithImm(imm) => {
                    wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                    wr.wr.rdma = rdma;
                    wr.__bindgen_anon_1.imm_data = imm.to_be();
                }
                Operation::Read => {
                    wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_READ;
                    wr.wr.rdma = rdma;
                }
                Operation::Send => wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND,
                Operation::FetchAdd(add) => {
                    wr.opcode = ffi::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
                    wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                        remote_addr: request.remote,
                        compare_add: add,
                        swap: 0,
                        rkey: request.rkey,
                    };
                }
            }
            let reads_back = matches!(request.op, Operation::FetchAdd(_) | Operation::Read);
            if !reads_back && request.len > 0 && request.len <= self.max_inline {
                flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
            }
            wr.send_flags = flags;
        }
        // Link them only now: the arrays no longer move.
        for i in 0..n {
            let next = if i + 1 < n { wrs[i + 1].as_mut_ptr() } else { std::ptr::null_mut() };
            let sge = sges[i].as_mut_ptr();
            // SAFETY: entry i was written above.
            let wr = unsafe { wrs[i].assume_init_mut() };
            wr.sg_list = sge;
            wr.next = next;
        }
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the context outlives the queue pair (through `pd`).
        let post = unsafe { (*self.pd.port.context.as_ptr()).ops.post_send }
            .ok_or_else(|| Error::transport(crate::NAME, "the verbs provider has no post_send"))?;
        // SAFETY: a live queue pair in RTS and well-formed requests whose memory is valid
        // (caller), linked inside arrays that outlive the call; verbs copies them (and inline
        // payloads) before returning.
        let rc = unsafe { post(self.qp.as_ptr(), wrs[0].as_mut_ptr(), &mut bad) };
        if rc != 0 {
            return Err(verbs_failed(&format!("ibv_post_send of {n} requests"), &self.pd.port.device, rc));
        }
        Ok(())
    }

    /// Posts receives, each for one incoming send of up to `len` bytes at `local` (or one
    /// incoming write with immediate, which uses no buffer); their completions carry `wr_id`.
    ///
    /// # Safety
    /// Every buffer must stay valid and registered (`lkey`) until its receive completes or the
    /// queue pair is destroyed.
    pub unsafe fn post_receives(&self, requests: &[ReceiveRequest]) -> Result<()> {
        // SAFETY: the context outlives the queue pair (through `pd`).
        let post = unsafe { (*self.pd.port.context.as_ptr()).ops.post_recv }
            .ok_or_else(|| Error::transport(crate::NAME, "the verbs provider has no post_recv"))?;
        for batch in requests.chunks(MAX_CHAIN) {
            // SAFETY: zeroed is a valid scatter entry and receive request.
            let mut sges: [ffi::ibv_sge; MAX_CHAIN] = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut wrs: [ffi::ibv_recv_wr; MAX_CHAIN] = unsafe { std::mem::zeroed() };
            for (i, r) in batch.iter().enumerate() {
                sges[i] = ffi::ibv_sge { addr: r.local as u64, length: r.len, lkey: r.lkey };
                wrs[i].wr_id = r.wr_id;
                wrs[i].num_sge = 1;
            }
            for i in 0..batch.len() {
                wrs[i].sg_list = &mut sges[i];
                if i + 1 < batch.len() {
                    wrs[i].next = &mut wrs[i + 1];
                }
            }
            let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
            // SAFETY: a live queue pair past RESET and well-formed requests whose buffers are
            // valid (caller), linked inside arrays that outlive the call.
            let rc = unsafe { post(self.qp.as_ptr(), wrs.as_mut_ptr(), &mut bad) };
            if rc != 0 {
                let what = format!("ibv_post_recv of {} receives", batch.len());
                return Err(verbs_failed(&what, &self.pd.port.device, rc));
            }
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: the queue pair is live and dropped once; its completion queues outlive it
        // (held by this struct's fields, which drop after this).
        unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

/// Work requests one [`QueuePair::post_chain`] posts at most.
pub const MAX_CHAIN: usize = 8;

/// What a work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// An RDMA write of `len` bytes from `local` to `remote`.
    Write,
    /// An RDMA write that also completes one of the peer's receives with this immediate value,
    /// once the bytes (and every earlier request's) are placed.
    WriteWithImm(u32),
    /// A send of `len` bytes from `local` into the peer's next posted receive.
    Send,
    /// An RDMA read of `len` bytes from `remote` into `local`.
    Read,
    /// An atomic fetch-and-add of this value on the 8-byte word at `remote`; the old value lands
    /// at `local`.
    FetchAdd(u64),
}

/// One work request for [`QueuePair::post`].
#[derive(Debug, Clone, Copy)]
pub struct WorkRequest {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What it does.
    pub op: Operation,
    /// Local address (source of a write or send, target of a read or of a fetch-and-add's old
    /// value).
    pub local: *const u8,
    /// Bytes to write or send (8 for a fetch-and-add; 0 is allowed for writes and sends).
    pub len: u32,
    /// Key of the registration holding `local`.
    pub lkey: u32,
    /// Remote address in the peer's registration (unused by a send).
    pub remote: u64,
    /// Key of the peer's registration (unused by a send).
    pub rkey: u32,
    /// Ask for a completion.
    pub signaled: bool,
}

/// One receive for [`QueuePair::post_receives`].
#[derive(Debug, Clone, Copy)]
pub struct ReceiveRequest {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where an incoming send's bytes go.
    pub local: *mut u8,
    /// Room at `local`.
    pub len: u32,
    /// Key of the registration holding `local`.
    pub lkey: u32,
}

/// What went wrong with a failed completion (status and vendor error), or `None` for success.
#[inline]
pub fn completion_failure(wc: &ffi::ibv_wc) -> Option<String> {
    let (status, vendor) = wc.error()?;
    Some(failure_text(status, vendor))
}

/// A failed completion's status and vendor error, in words.
#[cold]
fn failure_text(status: ffi::ibv_wc_status::Type, vendor: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static C string for any status.
    let text = unsafe { std::ffi::CStr::from_ptr(ffi::ibv_wc_status_str(status)) };
    format!("{} (vendor error {vendor})", text.to_string_lossy())
}
