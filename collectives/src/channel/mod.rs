//! The channel executor: every collective over [`Link`]s, i.e. over nothing but
//! [`Connection`](comm_core::connection::Connection)s (write, update-and-sync), so the same
//! algorithms run over shared memory, CUDA IPC, and transports without direct access to a
//! peer's memory (network transports). The calling thread drives the links.
//!
//! Links are built on demand, only to the peers an algorithm uses (a ring needs two), in
//! ascending peer order on every rank, which cannot deadlock: the lowest pair not yet built
//! always has both of its ranks ready to build it.
//!
//! **Agreement.** Every message carries a [`Header`] with the call number, the call's
//! signature (collective, dtype, op, algorithm), count and root. A receiver compares it with its
//! own: a different call number is a protocol error (the communicator is then unusable); a
//! different signature, count or root, or a sender that marked its own arguments invalid, makes
//! the call fail with [`Error::InvalidArgument`] — after the call's messages were all exchanged,
//! so the ranks stay in step — and taints the receiver's later messages of the call, so the
//! news travels on. In the direct algorithms every rank hears from every rank that sends to
//! it; in the ring algorithms it reaches every rank downstream. Ranks whose counts differ so
//! much that they exchange different numbers of messages get a timeout instead.

mod bruck;
mod direct;
mod eager;
mod header;
pub(crate) mod link;
mod p2p;
mod recursive;
mod ring;
mod swap;
mod tree;

pub(crate) use direct::{AllToAllvCounts, all_to_allv};
pub(crate) use p2p::run_group;

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::{Error, Result};

use crate::call::{Buffers, CallSpec, CollectiveCall};
use crate::dtype::Element;
use crate::health::Health;
use crate::op::ReduceOp;
use crate::schedule::{SLOTS, missing_links, payload_for};
use crate::table::Algorithm;
use header::Header;
use link::Link;

/// Payload bytes of one eager message: the eager rows cover calls up to this size in one
/// message per peer.
const EAGER_PAYLOAD_BYTES: usize = 4 << 10;
/// Most slots per eager link direction: how far an eager sender may run ahead of a receiver.
const EAGER_MAX_SLOTS: usize = 64;
/// Credit batches per eager link's slots: a receiver returns credits every `slots / this`
/// messages (see [`link`]'s module doc).
const EAGER_CREDIT_BATCHES: usize = 4;
/// Bytes a rank may give its eager links together (each direction's region and outbox).
const EAGER_BUDGET: usize = 16 << 20;

/// Slots per eager link direction in a world of `n` ranks: the depth that fits the budget
/// when a root links to every peer, at least [`SLOTS`].
fn eager_slots_for(n: usize) -> usize {
    let per_link = EAGER_BUDGET / n.saturating_sub(1).max(1);
    (per_link / (2 * (EAGER_PAYLOAD_BYTES + header::HEADER_BYTES))).clamp(SLOTS, EAGER_MAX_SLOTS)
}
/// Set in a header's signature by a rank whose own arguments were invalid.
const INVALID_MARK: u64 = header::INVALID_SIGNATURE;

/// Per-communicator state of the channel executor.
pub(crate) struct ChannelEngine {
    rank: usize,
    world_size: usize,
    /// The links every algorithm but the eager ones runs over: few, large slots.
    links: Links,
    /// The links of the eager algorithms: many small slots.
    eager: Links,
    /// Channel calls made so far (every rank counts them the same way).
    calls: u64,
    health: Health,
}

/// One channel call in progress: what this rank says in its headers, and what it has heard.
#[derive(Debug)]
pub(crate) struct Call {
    header: Header,
    problem: Option<Error>,
    what: &'static str,
}

impl Call {
    /// The header of this rank's next message, carrying `len` payload bytes.
    fn header(&self, len: usize) -> Header {
        Header { tainted: self.problem.is_some() || self.header.tainted, len: len as u64, ..self.header }
    }

    /// Checks a received header against this call; a mismatch is remembered, not returned, so
    /// the algorithm finishes its messages and the ranks stay in step.
    #[inline]
    fn check(&mut self, from: usize, theirs: &Header, me: usize) -> Result<()> {
        if theirs.call == self.header.call && (self.problem.is_some() || theirs.agrees_with(&self.header)) {
            return Ok(());
        }
        self.judge(from, theirs, me)
    }

    /// [`check`](Self::check) for a header that is not plainly in agreement: says why.
    #[cold]
    #[inline(never)]
    fn judge(&mut self, from: usize, theirs: &Header, me: usize) -> Result<()> {
        if theirs.signature & !INVALID_MARK == p2p::P2P_SIGNATURE {
            return Err(Error::protocol(format!(
                "point-to-point mismatch: rank {from} sent {} B in its point-to-point group {}, which no receive of \
                 rank {me} took before this {}; sends and receives of a pair must match one to one within their \
                 groups, between the same collectives. The communicator is revoked; shrink it or build a new one",
                theirs.count & p2p::COUNT_MASK,
                theirs.call,
                self.what
            )));
        }
        if theirs.call != self.header.call {
            return Err(Error::protocol(format!(
                "rank {from} sent a message of channel call {} while rank {me} is in call {}; every rank must \
                 call the same collectives in the same order",
                theirs.call, self.header.call
            )));
        }
        if self.problem.is_some() || theirs.agrees_with(&self.header) {
            return Ok(());
        }
        let mine = &self.header;
        let what = self.what;
        self.problem = if theirs.signature & INVALID_MARK != 0 && mine.signature & INVALID_MARK == 0 {
            Some(Error::invalid(format!(
                "rank {from} passed invalid arguments to {what} (its own error says which); this call did nothing"
            )))
        } else if theirs.signature & !INVALID_MARK != mine.signature & !INVALID_MARK {
            Some(Error::invalid(format!(
                "rank {from} called {} while rank {me} called {}; every rank must make the same call (and set the \
                 same WEAVE_ALGO)",
                crate::call::describe(theirs.signature & !INVALID_MARK),
                crate::call::describe(mine.signature & !INVALID_MARK)
            )))
        } else if theirs.count != mine.count && mine.signature & INVALID_MARK == 0 {
            Some(Error::invalid(format!(
                "{what}: rank {from} passed {} elements where rank {me} expects {}; counts must match",
                theirs.count, mine.count
            )))
        } else if theirs.root != mine.root {
            Some(Error::invalid(format!(
                "{what}: rank {from} named root {}, rank {me} named root {}",
                theirs.root, mine.root
            )))
        } else if theirs.variant != mine.variant {
            Some(Error::invalid(format!(
                "{what}: rank {from} ran this step in form {} of its call, rank {me} in form {}; the ranks chose \
                 different forms (a hierarchical call is small on one node and larger on another when their counts \
                 differ)",
                theirs.variant, mine.variant
            )))
        } else if theirs.tainted && mine.signature & INVALID_MARK == 0 {
            Some(Error::invalid(format!(
                "{what}: a rank upstream of rank {from} found mismatched arguments (its error says which); this call \
                 did nothing"
            )))
        } else {
            None
        };
        Ok(())
    }

    /// Ends the call: the first mismatch heard of, if any.
    fn finish(self) -> Result<()> {
        match self.problem {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl ChannelEngine {
    /// An engine with no links yet (links are built by the first call that needs them).
    pub(crate) fn new(core: &CoreCommunicator, revocation: std::sync::Arc<comm_core::resilience::Resilience>) -> Self {
        let n = core.world_size();
        ChannelEngine {
            rank: core.rank(),
            world_size: n,
            links: Links::new(n, SLOTS, payload_for(n), 1),
            eager: Links::new(n, eager_slots_for(n), EAGER_PAYLOAD_BYTES, eager_slots_for(n) / EAGER_CREDIT_BATCHES),
            calls: 0,
            health: Health::new(revocation),
        }
    }

    /// Errors if an earlier failure broke the communicator.
    #[inline]
    pub(crate) fn check_usable(&self) -> Result<()> {
        self.health.check()
    }

    /// Whether an earlier failure broke this engine.
    pub(crate) fn is_broken(&self) -> bool {
        self.health.is_broken()
    }

    /// Records a failure that leaves the ranks out of step.
    pub(crate) fn poison(&mut self, e: Error) -> Error {
        self.health.poison(e)
    }

    /// Elements of `T` one message carries.
    fn chunk<T: Element>(&self) -> usize {
        self.links.payload / std::mem::size_of::<T>()
    }

    fn link(&mut self, peer: usize) -> Result<&mut Link> {
        self.links.get(peer)
    }

    /// Starts a call that talks to `peers` over the (bulk) links.
    fn begin(&mut self, core: &CoreCommunicator, peers: &[usize], spec: CallSpec) -> Result<Call> {
        self.links.connect(core, self.rank, peers)?;
        Ok(self.next_call(spec))
    }

    /// Counts a new call and makes its header.
    #[inline]
    fn next_call(&mut self, spec: CallSpec) -> Call {
        self.calls += 1;
        let signature = crate::call::signature(spec.collective, spec.dtype, spec.op, spec.algorithm)
            | if spec.invalid { INVALID_MARK } else { 0 };
        let header = Header {
            // Modulo 2³², as the header carries it.
            call: self.calls & u64::from(u32::MAX),
            signature,
            count: spec.count as u64,
            root: (spec.root as u64).min(u64::from(u32::MAX)),
            variant: spec.variant,
            ..Header::default()
        };
        // An invalid rank's own error is what it returns; this only keeps it from judging the
        // lengths of the messages it receives against the count 0 it announced.
        let problem = spec.invalid.then(|| Error::invalid("this rank's arguments were invalid"));
        Call { header, problem, what: spec.collective.name() }
    }

    /// Waits until `peer` may take another message; returns where to stage it.
    fn outbox(&mut self, peer: usize, what: &str) -> Result<*mut u8> {
        self.link(peer)?.outbox(what)
    }

    /// Posts the message staged in `peer`'s outbox, `len` bytes long.
    fn post(&mut self, call: &Call, peer: usize, len: usize) -> Result<()> {
        let header = call.header(len);
        self.link(peer)?.post(header)
    }

    /// Stages `len` bytes at `src` and posts them to `peer`.
    ///
    /// # Safety
    /// `src` valid for `len` reads; `len` at most the payload of a message.
    unsafe fn send_bytes(&mut self, call: &Call, peer: usize, src: *const u8, len: usize) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { stage_and_post(self.links.get(peer)?, call, src, len, false) }
    }

    /// Waits for `peer`'s next message of this call and checks its header; returns its payload
    /// (valid for `len` bytes, `len` at most a message's payload, until
    /// [`release`](Self::release)), which must be `len` bytes long.
    fn receive(&mut self, call: &mut Call, peer: usize, len: usize) -> Result<*const u8> {
        let me = self.rank;
        let (header, payload) = self.link(peer)?.receive(call.what)?;
        call.check(peer, &header, me)?;
        if call.problem.is_none() && header.len != len as u64 {
            return Err(Error::protocol(format!(
                "{}: rank {peer} sent {} bytes where rank {me} expects {len}",
                call.what, header.len
            )));
        }
        // In a mismatched call a shorter message leaves stale bytes in the rest of the slot; the
        // call fails, and the receive buffer's contents are then unspecified.
        Ok(payload)
    }

    /// Frees `peer`'s slot of the message last received.
    fn release(&mut self, peer: usize) -> Result<()> {
        self.link(peer)?.release()
    }
}

/// One set of links of this rank, one per peer at most, all alike (slot count, payload and
/// credit batch, see [`Link::new`]).
struct Links {
    links: Vec<Option<Link>>,
    /// Every link of the set is built (so [`connect`](Self::connect) has nothing to look at).
    complete: bool,
    slots: usize,
    payload: usize,
    credit_batch: usize,
}

impl Links {
    /// No links yet, to any of `n` ranks.
    fn new(n: usize, slots: usize, payload: usize, credit_batch: usize) -> Self {
        Links { links: (0..n).map(|_| None).collect(), complete: n == 1, slots, payload, credit_batch }
    }

    /// Builds the links to `peers` that do not exist yet, in ascending peer order.
    #[inline(always)]
    fn connect(&mut self, core: &CoreCommunicator, me: usize, peers: &[usize]) -> Result<()> {
        let built = |p: usize| p == me || self.links.get(p).is_some_and(Option::is_some);
        if self.complete || matches!(peers, [p] if built(*p)) || peers.iter().all(|&p| built(p)) {
            return Ok(());
        }
        self.build_missing(core, me, peers)
    }

    /// [`connect`](Self::connect) once some link is missing: builds them (a call's first use of
    /// the set, off every later call's path).
    #[cold]
    #[inline(never)]
    fn build_missing(&mut self, core: &CoreCommunicator, me: usize, peers: &[usize]) -> Result<()> {
        for p in missing_links(me, peers, &self.links) {
            self.links[p] = Some(Link::new(core, p, self.slots, self.payload, self.credit_batch)?);
        }
        self.complete = self.links.iter().enumerate().all(|(p, l)| p == me || l.is_some());
        Ok(())
    }

    /// Builds the links to every other rank that do not exist yet.
    #[inline(always)]
    fn connect_to_all(&mut self, core: &CoreCommunicator, me: usize) -> Result<()> {
        if self.complete {
            return Ok(());
        }
        let others: Vec<usize> = (0..self.links.len()).filter(|&p| p != me).collect();
        self.build_missing(core, me, &others)
    }

    /// The link to `peer`, which must have been built.
    #[inline(always)]
    fn get(&mut self, peer: usize) -> Result<&mut Link> {
        let n = self.links.len();
        match self.links.get_mut(peer) {
            Some(Some(link)) => Ok(link),
            _ => Err(no_link(peer, n)),
        }
    }
}

/// The error of a link looked up before it was built.
#[cold]
#[inline(never)]
fn no_link(peer: usize, n: usize) -> Error {
    Error::invalid(format!("no channel link to rank {peer} in a {n}-rank communicator"))
}

/// Waits for credit on `link`, stages `len` bytes at `src` in its outbox and posts them with
/// `call`'s header (`last`: the sender's last message of the call to this peer).
///
/// # Safety
/// `src` valid for `len` reads; `len` at most the link's payload.
#[inline(always)]
unsafe fn stage_and_post(link: &mut Link, call: &Call, src: *const u8, len: usize, last: bool) -> Result<()> {
    let dst = link.outbox(call.what)?;
    // SAFETY: the outbox slot holds a full payload (len fits, by the caller), src is valid
    // (caller), and the slot is memory no one else writes until the post below (a copy that
    // inlines small messages, where a library call would cost more than the bytes).
    unsafe { crate::copy::copy_bytes(src, dst, len) };
    link.post(Header { last, ..call.header(len) })
}

impl ChannelEngine {
    /// Runs `c` with `algorithm` (a channel algorithm) in form `variant` (0 for an ordinary
    /// call, see [`Header::variant`]), or — when `invalid` — takes part in it with no data so
    /// that every peer fails too.
    ///
    /// # Safety
    /// Pointers as the matching method of the user API guarantees: valid for their counts,
    /// receive ranges writable and either identical to or disjoint from send ranges. The engine
    /// is usable (checked by whoever took it, as `Communicator::channel_engine` does).
    #[inline]
    pub(crate) unsafe fn run<T: Element>(
        &mut self,
        core: &CoreCommunicator,
        algorithm: Algorithm,
        c: CollectiveCall<T>,
        invalid: bool,
        variant: u8,
    ) -> Result<()> {
        // The caller took this engine through `Communicator::channel_engine`, which checked
        // that it is usable.
        let spec = CallSpec { variant, ..spec_of(&c, algorithm, invalid) };
        let r = match algorithm {
            // SAFETY: forwarded from the caller.
            Algorithm::ChannelRing => unsafe { ring::run(Run { e: self, core, spec, c }) },
            // SAFETY: forwarded from the caller.
            Algorithm::ChannelDirect => unsafe { direct::run(Run { e: self, core, spec, c }) },
            // SAFETY: forwarded from the caller.
            Algorithm::ChannelEager => unsafe { eager::run(Run { e: self, core, spec, c }) },
            Algorithm::ChannelDoubling => match c {
                CollectiveCall::AllReduce { send, recv, op, .. } => {
                    let b = Buffers { send, recv, count: spec.count };
                    // SAFETY: forwarded from the caller.
                    unsafe { recursive::all_reduce_doubling(self, core, spec, b, op) }
                }
                // SAFETY: forwarded from the caller (only all-reduce has a doubling row).
                _ => unsafe { direct::run(Run { e: self, core, spec, c }) },
            },
            // SAFETY: forwarded from the caller.
            Algorithm::ChannelHalving => unsafe { recursive::run(Run { e: self, core, spec, c }) },
            // SAFETY: forwarded from the caller.
            Algorithm::ChannelBruck => unsafe { bruck::run(Run { e: self, core, spec, c }) },
            // SAFETY: forwarded from the caller.
            Algorithm::ChannelTree => unsafe { tree::run(Run { e: self, core, spec, c }) },
            other => Err(Error::invalid(format!("{other} is not a channel algorithm"))),
        };
        r.map_err(|e| self.poison(e))
    }
}

/// One channel call being run, what every algorithm's `run` takes: the engine, the
/// communicator under it, what the call is, and this rank's buffers.
pub(super) struct Run<'a, T> {
    pub(super) e: &'a mut ChannelEngine,
    pub(super) core: &'a CoreCommunicator,
    pub(super) spec: CallSpec,
    pub(super) c: CollectiveCall<T>,
}

/// The call spec of `c` on this rank (an invalid rank announces count 0).
fn spec_of<T: Element>(c: &CollectiveCall<T>, algorithm: Algorithm, invalid: bool) -> CallSpec {
    let (collective, op) = c.collective();
    let (count, root) = match *c {
        CollectiveCall::Broadcast { count, root, .. } | CollectiveCall::Reduce { count, root, .. } => (count, root),
        CollectiveCall::AllReduce { count, .. }
        | CollectiveCall::AllGather { count, .. }
        | CollectiveCall::ReduceScatter { count, .. }
        | CollectiveCall::AllToAll { count, .. } => (count, 0),
    };
    CallSpec {
        collective,
        algorithm,
        dtype: T::DTYPE,
        op,
        count: if invalid { 0 } else { count },
        root,
        invalid,
        variant: 0,
    }
}

/// Messages a block of `elems` elements takes at `chunk` elements a message (at least one:
/// an empty block still sends its header, so every rank hears from every sender).
#[inline]
fn pieces(elems: usize, chunk: usize) -> usize {
    elems.div_ceil(chunk).max(1)
}

/// Message `c` of a block of `elems` elements: its first element and length, or `None` past
/// the block's last message.
#[inline]
fn piece(c: usize, elems: usize, chunk: usize) -> Option<(usize, usize)> {
    if c >= pieces(elems, chunk) {
        return None;
    }
    let a = (c * chunk).min(elems);
    Some((a, (elems - a).min(chunk)))
}

/// The reduction for partial results: `Avg` sums until the last step divides.
fn partial(op: ReduceOp) -> ReduceOp {
    if op == ReduceOp::Avg { ReduceOp::Sum } else { op }
}
