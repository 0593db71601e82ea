//! One communicator's fault tolerance: its revocation, spread to every reachable member, the
//! mailboxes of its failure agreements ([`crate::agreement`]), and its [`Ledger`], which peers
//! read to judge who is behind ([`crate::verdict`]).
//!
//! # Revocation
//!
//! [`Resilience::revoke`] raises the communicator's abort flag (every wait of it, host or
//! device, ends with an error) and runs its revocation hooks (the GPU status words), then
//! sends a [`NoticeKind::Revoke`] over a binomial graph: member `r` tells `r ± 2^i` (mod n)
//! for every `2^i < n`, about `2·log₂ n` peers, skipping those known lost; each member's
//! [`NoticeService`](crate::notice::NoticeService) passes it on the same way. A member
//! forwards only on first receipt, so each member
//! sends its share once; a member that is lost breaks no path, since every member hears from
//! about `2·log₂ n` others (ULFM's reliable broadcast). The revocation reaches every member that
//! is alive within a few notice hops — milliseconds — whatever its threads are doing.
//!
//! # Agreements
//!
//! Each agreement of the communicator has an instance number (the members call
//! [`crate::agreement::agree`] in the same order). Its messages go to a slot: queued for the
//! thread running that agreement, or, once this member decided, answered at once by the service
//! thread with the decision — so a member that returned keeps answering members that are still
//! agreeing.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::agreement::{AgreementMessage, Step};
use crate::bootstrap::Bootstrap;
use crate::deadline::Deadline;
use crate::diagnostics;
use crate::ledger::{Ledger, LedgerEntry};
use crate::notice::{NoticeKind, send_notice};
use crate::verdict::{MemberState, Verdict};

/// Decided agreements kept to answer members still agreeing; older ones are dropped.
const KEPT_DECISIONS: u64 = 64;

/// How far ahead of this member's own agreements a member's message may be; one further ahead
/// is dropped (no member can be that far ahead, and its slot would never be cleared).
const AGREEMENTS_AHEAD: u64 = 64;

/// A hook run once when the communicator is revoked (e.g. raising its GPU abort word).
pub type RevocationHook = Box<dyn Fn() + Send + Sync>;

/// Where one agreement of this member stands.
enum Slot {
    /// Messages waiting for the agreeing thread, oldest first: (sender's rank, message).
    Open(VecDeque<(usize, AgreementMessage)>),
    /// This member decided `value`.
    Decided(BTreeSet<usize>),
}

/// The fault-tolerance state of one communicator of one rank (see the module documentation).
pub struct Resilience {
    namespace: u64,
    /// Root-bootstrap rank of each member, by communicator rank.
    members: Vec<usize>,
    rank: usize,
    bootstrap: Arc<dyn Bootstrap>,
    abort: Arc<AtomicBool>,
    /// Raised by [`abort`](Self::abort) alone, never by a revocation ([`aborted`](Self::aborted)).
    aborted: Arc<AtomicBool>,
    revoked: AtomicBool,
    /// Set by [`retire`](Self::retire): the abort flag is no longer this communicator's to
    /// raise. Read and written under the `hooks` lock.
    retired: AtomicBool,
    /// Hooks to run when the communicator is revoked. Its lock also orders revocation,
    /// abortion and retirement with each other.
    hooks: Mutex<Vec<RevocationHook>>,
    agreements: Mutex<HashMap<u64, Slot>>,
    arrived: Condvar,
    next_agreement: AtomicU64,
    ledger: Ledger,
    query: Mutex<LedgerQuery>,
    answered: Condvar,
}

/// The ledger query this member has open, if any, with the answers so far.
#[derive(Default)]
struct LedgerQuery {
    /// The query's number; answers to another are dropped.
    id: u64,
    open: bool,
    answers: Vec<Option<LedgerEntry>>,
}

impl std::fmt::Debug for Resilience {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resilience")
            .field("namespace", &self.namespace)
            .field("rank", &self.rank)
            .field("size", &self.members.len())
            .field("revoked", &self.is_revoked())
            .finish()
    }
}

impl Resilience {
    /// The state of member `rank` of the communicator `namespace` whose members are the root
    /// ranks `members` of `bootstrap`; revocation raises `abort`.
    pub fn new(
        namespace: u64,
        members: Vec<usize>,
        rank: usize,
        bootstrap: Arc<dyn Bootstrap>,
        abort: Arc<AtomicBool>,
    ) -> Arc<Self> {
        Arc::new(Resilience {
            namespace,
            members,
            rank,
            bootstrap,
            abort,
            aborted: Arc::new(AtomicBool::new(false)),
            revoked: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            hooks: Mutex::new(Vec::new()),
            agreements: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
            next_agreement: AtomicU64::new(0),
            ledger: Ledger::default(),
            query: Mutex::new(LedgerQuery::default()),
            answered: Condvar::new(),
        })
    }

    /// The communicator's namespace (what notices name it by).
    pub fn namespace(&self) -> u64 {
        self.namespace
    }

    /// This member's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Why member `member` is known to be gone (its root-bootstrap link ended), if it is.
    pub fn member_lost(&self, member: usize) -> Option<String> {
        self.bootstrap.peer_lost(*self.members.get(member)?)
    }

    /// Adds a hook run when the communicator is revoked (at once if it already is).
    pub fn on_revoke(&self, hook: RevocationHook) {
        // Looked at under the hooks' lock, which `mark_revoked` holds while it sets the flag
        // and runs the hooks: either it will run this hook or this call sees the flag and runs
        // it — once either way.
        let mut hooks = self.hooks.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.is_revoked() {
            hooks.push(hook);
            return;
        }
        drop(hooks);
        hook();
    }

    /// Revokes this communicator here whenever `parent` is revoked (at once if it already is):
    /// for a communicator that carries steps of its parent's calls (the node and rail
    /// communicators of a hierarchical call), so that a revocation of the parent also stops a
    /// wait of a step. Only here: every member of this communicator is a member of `parent` and
    /// hears of the parent's revocation itself. `parent` keeps no reference to this state.
    pub fn follow(self: &Arc<Self>, parent: &Resilience) {
        let child = Arc::downgrade(self);
        parent.on_revoke(Box::new(move || {
            if let Some(child) = child.upgrade() {
                child.mark_revoked("its parent communicator was revoked");
            }
        }));
    }

    /// Whether the communicator is revoked (here, or by a notice from another member).
    #[inline]
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// Whether the communicator was [retired](Self::retire) (it is revoked too).
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Revokes the communicator: stops its calls here and tells every reachable member (see
    /// the module documentation). Idempotent; never blocks on a peer.
    pub fn revoke(&self) {
        // Passed on from this thread, before the caller can drop the communicator (a notice to
        // oneself could find it gone); notices never wait on a peer
        // (`Bootstrap::send_notice`). Over a bootstrap without notices the revocation stays
        // local (nothing would read it).
        if self.mark_revoked("revoked by this rank") && self.bootstrap.carries_notices() {
            self.pass_revocation_on();
        }
    }

    /// Raises the communicator's abort flag — every wait of it fails with
    /// [`Error::Aborted`](crate::Error::Aborted) — unless the communicator was retired, when
    /// the flag belongs to its successor and this does nothing.
    pub fn abort(&self) {
        let _order = self.hooks.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.retired.load(Ordering::Acquire) {
            self.abort.store(true, Ordering::Release);
            self.aborted.store(true, Ordering::Release);
        }
    }

    /// Set once [`abort`](Self::abort) was called, and by nothing else: the flag of the waits
    /// that an abort must end but a revocation must not — a split's exchange and its child's
    /// build, which a member that finished them may follow with a revocation of the parent
    /// before a slower member has received everything (with
    /// [`AbortableBootstrap`](crate::bootstrap::AbortableBootstrap), or as a build's cancel
    /// flag).
    pub fn aborted(&self) -> &Arc<AtomicBool> {
        &self.aborted
    }

    /// Retires the communicator in favour of one that carries over its transports and shares
    /// its abort flag ([`Communicator::carry_over`](crate::communicator::Communicator::carry_over)):
    /// marks it revoked for good here (its calls fail; its revocation hooks run if they have
    /// not), then lowers the abort flag for the successor. From then on neither a revocation
    /// — by this rank or a notice — nor [`abort`](Self::abort) touches the flag. No notice is
    /// sent: the other members retire theirs the same way.
    pub fn retire(&self) {
        let hooks = self.hooks.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.revoked.swap(true, Ordering::AcqRel) {
            for hook in hooks.iter() {
                hook();
            }
        }
        self.retired.store(true, Ordering::Release);
        self.abort.store(false, Ordering::Release);
        tracing::debug!(target: diagnostics::FAULT, rank = self.rank, namespace = self.namespace, "communicator retired");
    }

    /// Marks the communicator revoked and stops its calls; whether this was the first time.
    fn mark_revoked(&self, why: &str) -> bool {
        let hooks = self.hooks.lock().unwrap_or_else(PoisonError::into_inner);
        if self.revoked.swap(true, Ordering::AcqRel) {
            return false;
        }
        // A retired communicator is revoked already: the flag is only ever raised for its own.
        self.abort.store(true, Ordering::Release);
        for hook in hooks.iter() {
            hook();
        }
        drop(hooks);
        tracing::warn!(
            target: diagnostics::FAULT,
            rank = self.rank,
            namespace = self.namespace,
            "communicator revoked: {why}"
        );
        true
    }

    /// Tells this member's binomial-graph peers that the communicator is revoked.
    fn pass_revocation_on(&self) {
        for peer in binomial_peers(self.rank, self.size()) {
            let root = self.members[peer];
            if self.bootstrap.peer_lost(root).is_none() {
                send_notice(&*self.bootstrap, root, NoticeKind::Revoke, self.namespace, &[]);
            }
        }
    }

    /// Handles a notice from root rank `from` (called by the notice service thread).
    pub(crate) fn handle_notice(&self, from: usize, kind: NoticeKind, body: &[u8]) {
        let Some(sender) = self.members.iter().position(|&m| m == from) else {
            tracing::debug!(target: diagnostics::FAULT, rank = self.rank, from, "a notice from a non-member was dropped");
            return;
        };
        match kind {
            NoticeKind::Revoke => {
                let first = self.mark_revoked(&format!("revoked by a notice from rank {sender}"));
                if first || sender == self.rank {
                    self.pass_revocation_on();
                }
            }
            NoticeKind::Agreement => match AgreementMessage::decode(body, self.size()) {
                Ok(message)
                    if message.instance
                        > self.next_agreement.load(Ordering::Acquire).saturating_add(AGREEMENTS_AHEAD) =>
                {
                    let instance = message.instance;
                    tracing::debug!(target: diagnostics::FAULT, rank = self.rank, from, instance, "an agreement message far ahead of this member's agreements was dropped");
                }
                Ok(message) => self.deliver(sender, message),
                Err(e) => {
                    tracing::debug!(target: diagnostics::FAULT, rank = self.rank, from, "a malformed agreement message was dropped: {e}");
                }
            },
            NoticeKind::LedgerQuery => match <[u8; 8]>::try_from(body) {
                Ok(id) => {
                    let mut answer = id.to_vec();
                    answer.extend_from_slice(&self.ledger.entry().encode());
                    send_notice(&*self.bootstrap, from, NoticeKind::LedgerAnswer, self.namespace, &answer);
                }
                Err(_) => {
                    tracing::debug!(target: diagnostics::FAULT, rank = self.rank, from, "a malformed ledger query was dropped");
                }
            },
            NoticeKind::LedgerAnswer => {
                let decoded = body
                    .split_first_chunk::<8>()
                    .map(|(id, entry)| (u64::from_le_bytes(*id), LedgerEntry::decode(entry)));
                match decoded {
                    Some((id, Ok(entry))) => {
                        let mut query = self.query.lock().unwrap_or_else(PoisonError::into_inner);
                        if query.open && query.id == id && sender < query.answers.len() {
                            query.answers[sender] = Some(entry);
                            drop(query);
                            self.answered.notify_all();
                        }
                    }
                    _ => {
                        tracing::debug!(target: diagnostics::FAULT, rank = self.rank, from, "a malformed ledger answer was dropped");
                    }
                }
            }
            NoticeKind::Stop => {}
        }
    }

    /// This member's ledger of the communicator's calls.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Asks every member for its ledger and judges who is behind (see [`crate::verdict`]);
    /// waits for each answer until the member is known lost or `silence` has passed. Members
    /// still inside an earlier call than the frontier are moving (a survivor that has not yet
    /// reached the call where the others failed): they are asked again, every few
    /// milliseconds for at most half the silence more, until none is — so that every member
    /// that asks judges the same still picture. `None` over a bootstrap that carries no
    /// notices (nobody would answer).
    pub fn verdict(&self, silence: Duration) -> Option<Verdict> {
        if !self.bootstrap.carries_notices() {
            return None;
        }
        let mut states = self.ask(silence, &vec![MemberState::Silent; self.size()]);
        let settle = Deadline::after(silence / 2);
        while moving(&states) && !settle.expired() {
            std::thread::sleep(Duration::from_millis(5));
            // Members that answered answer at once; the silent are not waited for again.
            states = self.ask(silence / 10, &states);
        }
        Some(Verdict::judge(states, silence))
    }

    /// One round of ledger queries: asks every member not known lost whose state in `before`
    /// is not [`MemberState::Lost`], and waits for the answers at most `wait`; a member that
    /// said nothing keeps its state of `before` where that was an answer, else is silent.
    fn ask(&self, wait: Duration, before: &[MemberState]) -> Vec<MemberState> {
        let n = self.size();
        let id = {
            let mut query = self.query.lock().unwrap_or_else(PoisonError::into_inner);
            query.id += 1;
            query.open = true;
            query.answers = vec![None; n];
            query.answers[self.rank] = Some(self.ledger.entry());
            query.id
        };
        let asked = |m: usize| m != self.rank && before[m] != MemberState::Lost && self.member_lost(m).is_none();
        for member in (0..n).filter(|&m| asked(m)) {
            send_notice(
                &*self.bootstrap,
                self.members[member],
                NoticeKind::LedgerQuery,
                self.namespace,
                &id.to_le_bytes(),
            );
        }
        let deadline = Deadline::after(wait);
        let mut query = self.query.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let settled = |q: &LedgerQuery| (0..n).all(|m| q.answers[m].is_some() || !asked(m));
            let left = deadline.remaining();
            if settled(&query) || left.is_zero() {
                break;
            }
            // Losses wake nobody: look again every few milliseconds.
            let nap = left.min(Duration::from_millis(5));
            query = self.answered.wait_timeout(query, nap).unwrap_or_else(PoisonError::into_inner).0;
        }
        query.open = false;
        let answers = std::mem::take(&mut query.answers);
        drop(query);
        answers
            .into_iter()
            .enumerate()
            .map(|(m, a)| match a {
                Some(entry) => MemberState::Answered(entry),
                None if self.member_lost(m).is_some() || before[m] == MemberState::Lost => MemberState::Lost,
                None => match &before[m] {
                    MemberState::Answered(entry) => MemberState::Answered(*entry),
                    _ => MemberState::Silent,
                },
            })
            .collect()
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<u64, Slot>> {
        self.agreements.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Files an agreement message from member `sender`, or answers it with this member's
    /// decision.
    fn deliver(&self, sender: usize, message: AgreementMessage) {
        let mut slots = self.slots();
        match slots.entry(message.instance).or_insert_with(|| Slot::Open(VecDeque::new())) {
            Slot::Open(queue) => {
                queue.push_back((sender, message));
                drop(slots);
                self.arrived.notify_all();
            }
            Slot::Decided(value) => {
                if matches!(message.step, Step::Up | Step::Probe | Step::NewView) {
                    let answer = AgreementMessage::decided(message.instance, value);
                    drop(slots);
                    self.send_agreement(sender, &answer);
                }
            }
        }
    }

    /// A new agreement's instance number (members number their agreements alike).
    pub(crate) fn next_agreement(&self) -> u64 {
        self.next_agreement.fetch_add(1, Ordering::AcqRel)
    }

    /// The next message of agreement `instance`, waiting at most `timeout`.
    pub(crate) fn next_message(&self, instance: u64, timeout: Duration) -> Option<(usize, AgreementMessage)> {
        let deadline = std::time::Instant::now() + timeout;
        let mut slots = self.slots();
        loop {
            if let Slot::Open(queue) = slots.entry(instance).or_insert_with(|| Slot::Open(VecDeque::new()))
                && let Some(m) = queue.pop_front()
            {
                return Some(m);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            slots = self.arrived.wait_timeout(slots, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Puts a message back in front of agreement `instance`'s queue (it belongs to the attempt
    /// it just started).
    pub(crate) fn put_back(&self, instance: u64, sender: usize, message: AgreementMessage) {
        if let Some(Slot::Open(queue)) = self.slots().get_mut(&instance) {
            queue.push_front((sender, message));
        }
    }

    /// Records this member's decision of agreement `instance` and answers the messages still
    /// queued for it; later ones are answered by the service thread.
    pub(crate) fn decide(&self, instance: u64, value: &BTreeSet<usize>) {
        let queued = {
            let mut slots = self.slots();
            let old = slots.insert(instance, Slot::Decided(value.clone()));
            slots.retain(|&i, _| i.saturating_add(KEPT_DECISIONS) > instance);
            match old {
                Some(Slot::Open(queue)) => queue,
                _ => VecDeque::new(),
            }
        };
        let answer = AgreementMessage::decided(instance, value);
        for (sender, m) in queued {
            if matches!(m.step, Step::Up | Step::Probe | Step::NewView) {
                self.send_agreement(sender, &answer);
            }
        }
    }

    /// Sends an agreement message to member `to`; whether it left.
    pub(crate) fn send_agreement(&self, to: usize, message: &AgreementMessage) -> bool {
        match self.members.get(to) {
            Some(&root) => {
                send_notice(&*self.bootstrap, root, NoticeKind::Agreement, self.namespace, &message.encode(self.size()))
            }
            None => false,
        }
    }
}

/// Whether some member that answered is inside a collective below the highest one begun: on
/// its way to where the others stopped.
fn moving(states: &[MemberState]) -> bool {
    let answered = || {
        states.iter().filter_map(|s| match s {
            MemberState::Answered(e) => Some(e),
            _ => None,
        })
    };
    let top = answered().map(|e| e.collectives_begun).max().unwrap_or(0);
    answered().any(|e| e.collectives_begun < top && e.in_call())
}

/// The members `rank` tells of a revocation in an `n`-member communicator: `rank ± 2^i` (mod n)
/// for every `2^i < n`, without itself and without repeats.
pub fn binomial_peers(rank: usize, n: usize) -> Vec<usize> {
    let mut peers = Vec::new();
    let mut d = 1;
    while d < n {
        for p in [(rank + d) % n, (rank + n - d % n) % n] {
            if p != rank && !peers.contains(&p) {
                peers.push(p);
            }
        }
        d *= 2;
    }
    peers
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loopback::LoopbackBootstrap;

    fn member(namespace: u64, b: &Arc<dyn Bootstrap>) -> Arc<Resilience> {
        Resilience::new(namespace, vec![0], 0, b.clone(), Arc::new(AtomicBool::new(false)))
    }

    #[test]
    fn a_follower_is_revoked_with_its_parent_and_only_then() {
        let b: Arc<dyn Bootstrap> = Arc::new(LoopbackBootstrap::group(1, Duration::from_secs(1)).remove(0));
        let (parent, step) = (member(1, &b), member(65, &b));
        step.follow(&parent);
        step.revoke();
        assert!(!parent.is_revoked(), "a step's revocation went up to its parent");
        let (parent, step, late) = (member(1, &b), member(65, &b), member(66, &b));
        step.follow(&parent);
        parent.revoke();
        assert!(step.is_revoked() && step.abort.load(Ordering::Acquire), "the step was not revoked");
        // Following a parent revoked already revokes at once.
        late.follow(&parent);
        assert!(late.is_revoked());
        // A dropped follower is not kept alive by its parent's hook.
        let (living, gone) = (member(2, &b), member(67, &b));
        let weak = Arc::downgrade(&gone);
        gone.follow(&living);
        drop(gone);
        assert!(weak.upgrade().is_none());
        living.revoke();
        assert!(living.is_revoked());
    }

    #[test]
    fn a_retired_communicator_leaves_the_abort_flag_to_its_successor() {
        let b: Arc<dyn Bootstrap> = Arc::new(LoopbackBootstrap::group(1, Duration::from_secs(1)).remove(0));
        let old = member(3, &b);
        let hooked = Arc::new(AtomicBool::new(false));
        let seen = hooked.clone();
        old.on_revoke(Box::new(move || seen.store(true, Ordering::Release)));
        old.revoke();
        assert!(old.abort.load(Ordering::Acquire), "the revocation did not raise the flag");
        old.retire();
        assert!(old.is_revoked() && old.is_retired() && hooked.load(Ordering::Acquire));
        assert!(!old.abort.load(Ordering::Acquire), "retiring left the flag raised");
        old.revoke();
        old.abort();
        old.handle_notice(0, NoticeKind::Revoke, &[]);
        assert!(!old.abort.load(Ordering::Acquire), "a retired communicator raised its successor's flag");
        // Retiring a communicator nobody revoked runs its hooks (its GPU work stops) once.
        let fresh = member(4, &b);
        let runs = Arc::new(AtomicU64::new(0));
        let counted = runs.clone();
        fresh.on_revoke(Box::new(move || {
            counted.fetch_add(1, Ordering::AcqRel);
        }));
        fresh.retire();
        fresh.retire();
        fresh.revoke();
        assert_eq!(runs.load(Ordering::Acquire), 1);
        assert!(!fresh.abort.load(Ordering::Acquire));
        // An unretired communicator's abort raises the flag.
        let live = member(5, &b);
        live.abort();
        assert!(live.abort.load(Ordering::Acquire) && !live.is_revoked());
    }

    #[test]
    fn binomial_peers_reach_everyone_in_log_steps() {
        assert_eq!(binomial_peers(0, 1), Vec::<usize>::new());
        assert_eq!(binomial_peers(0, 2), vec![1]);
        assert_eq!(binomial_peers(3, 8), vec![4, 2, 5, 1, 7]);
        for n in [2usize, 3, 5, 16, 100, 1024] {
            let log = (usize::BITS - (n - 1).leading_zeros()) as usize;
            // Flooding from rank 0 reaches every rank within log2(n) + 1 rounds.
            let mut reached = vec![false; n];
            reached[0] = true;
            let mut frontier = vec![0];
            let mut rounds = 0;
            while !frontier.is_empty() {
                let mut next = Vec::new();
                for r in frontier {
                    let peers = binomial_peers(r, n);
                    assert!(peers.len() <= 2 * log, "{n} ranks: rank {r} tells {} peers", peers.len());
                    for p in peers {
                        if !reached[p] {
                            reached[p] = true;
                            next.push(p);
                        }
                    }
                }
                frontier = next;
                rounds += 1;
            }
            assert!(reached.iter().all(|&r| r), "{n} ranks: not everyone was reached");
            assert!(rounds <= log + 2, "{n} ranks: {rounds} rounds");
        }
    }
}
