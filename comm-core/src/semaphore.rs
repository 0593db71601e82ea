//! Host semaphores: monotonic 64-bit counters, never reset.
//!
//! `signal` stores the next outbound count into the peer's inbound token through the
//! connection (release, ordered after earlier writes); `wait` bumps the local expected count and
//! spins, bounded, until the inbound token reaches it (acquire).
//!
//! A semaphore over tokens that already count (a shrunk communicator's pair, which goes on
//! with its parent's tokens) starts from those counts: [`HostSemaphore::resume`].
//!
//! A *signal-only* semaphore ([`HostSemaphore::signal_only`]) has no inbound side on the host:
//! a proxy signals through it on behalf of a kernel, and the peer's kernel waits on the token
//! in device memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::connection::{Connection, spin_until_peer};
use crate::error::{Error, Result};
use crate::memory::RegisteredMemory;
use crate::sync;

/// One 8-byte token inside registered memory.
#[derive(Debug, Clone)]
pub struct Token {
    /// The memory holding the token.
    pub memory: RegisteredMemory,
    /// Byte offset of the token (8-byte aligned).
    pub offset: usize,
}

/// Bytes between two semaphore tokens in a pool (one cache line each, so waiters do not share
/// lines).
pub(crate) const TOKEN_STRIDE: usize = 64;
/// Tokens in one pool.
pub(crate) const TOKENS_PER_POOL: usize = 64;
/// Bytes of one token pool (one page).
pub(crate) const POOL_BYTES: usize = TOKEN_STRIDE * TOKENS_PER_POOL;

/// The token pools a rank shares with one peer: this rank's (the peer signals into them), the
/// peer's (imported; this rank signals into them), and the index of the next semaphore's
/// tokens, which both sides hand out in the same order.
#[derive(Debug, Default)]
pub(crate) struct PeerTokens {
    local: Vec<RegisteredMemory>,
    remote: Vec<RegisteredMemory>,
    next: usize,
}

impl PeerTokens {
    /// The index of the next semaphore's tokens.
    pub(crate) fn next_slot(&self) -> usize {
        self.next
    }

    /// Pools swapped so far.
    pub(crate) fn pools(&self) -> usize {
        self.local.len()
    }

    /// Whether the next semaphore needs one more pool ([`add_pool`](Self::add_pool)) first.
    pub(crate) fn needs_pool(&self) -> bool {
        self.next / TOKENS_PER_POOL >= self.local.len()
    }

    /// Adds a swapped pair of pools: this rank's and the peer's, of [`POOL_BYTES`] each.
    pub(crate) fn add_pool(&mut self, local: RegisteredMemory, remote: RegisteredMemory) {
        self.local.push(local);
        self.remote.push(remote);
    }

    /// The next semaphore's tokens: (this rank's inbound one, the peer's). Call only once its
    /// pool is there (not [`needs_pool`](Self::needs_pool)).
    pub(crate) fn next_tokens(&self) -> (Token, Token) {
        let (pool, offset) = (self.next / TOKENS_PER_POOL, (self.next % TOKENS_PER_POOL) * TOKEN_STRIDE);
        (Token { memory: self.local[pool].clone(), offset }, Token { memory: self.remote[pool].clone(), offset })
    }

    /// Counts the next semaphore's tokens as handed out.
    pub(crate) fn advance(&mut self) {
        self.next += 1;
    }
}

/// Where a semaphore's two counts start: the signals already taken from the inbound token and
/// the count this side last stored into the peer's token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SemaphoreCounts {
    /// Signals from the peer already consumed: a wait waits for the inbound token to pass it.
    pub received: u64,
    /// Signals already given: the next signal stores one more into the peer's token.
    pub signalled: u64,
}

/// The counting half of a semaphore, apart from where its tokens live: the signals this side
/// has given and the signals it has taken. Any number of threads may signal, wait and poll at
/// once: signals reach the peer's token in increasing order, and every signal is taken once.
/// The loom models check it over every interleaving (`crate::loom_models`).
#[derive(Debug)]
pub(crate) struct SemaphoreTally {
    /// The count last stored into the peer's token; locked across the store, so signals of
    /// several threads store increasing counts in that order.
    signalled: sync::Mutex<u64>,
    /// Signals of the peer taken (by polls) or claimed (by waits, which then wait for them).
    taken: sync::AtomicU64,
}

impl SemaphoreTally {
    /// A tally that starts from `counts`.
    pub(crate) fn new(counts: SemaphoreCounts) -> Self {
        SemaphoreTally { signalled: sync::Mutex::new(counts.signalled), taken: sync::AtomicU64::new(counts.received) }
    }

    /// Gives one signal: `store(count)` stores the next count into the peer's token (after the
    /// writes it must follow); the tally moves on only when it succeeded.
    pub(crate) fn signal(&self, store: impl FnOnce(u64) -> Result<()>) -> Result<()> {
        let mut signalled = self.signalled.lock().unwrap_or_else(|p| p.into_inner());
        let next = *signalled + 1;
        store(next)?;
        *signalled = next;
        Ok(())
    }

    /// Takes the next signal: claims its number `n`, then `wait_for(n)` waits until the inbound
    /// token reaches `n`. Returns `n`. On error the claim is given back, so a caller that
    /// handles the error (with no other wait on this semaphore under way) finds the tally as
    /// it was.
    pub(crate) fn wait(&self, wait_for: impl FnOnce(u64) -> Result<()>) -> Result<u64> {
        // AcqRel: claims are a total order among waits and polls.
        let target = self.taken.fetch_add(1, Ordering::AcqRel) + 1;
        match wait_for(target) {
            Ok(()) => Ok(target),
            Err(e) => {
                self.taken.fetch_sub(1, Ordering::AcqRel);
                Err(e)
            }
        }
    }

    /// Takes one signal if `received` (the inbound token, loaded with acquire ordering) holds
    /// one that no wait or poll has taken or claimed; returns its number. Never blocks.
    pub(crate) fn poll(&self, received: u64) -> Option<u64> {
        let mut taken = self.taken.load(Ordering::Acquire);
        // A compare-and-swap, not an add after the look: a wait or poll of another thread may
        // claim the same signal between the two.
        while received > taken {
            match self.taken.compare_exchange_weak(taken, taken + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(taken + 1),
                Err(now) => taken = now,
            }
        }
        None
    }

    /// Signals taken or claimed so far.
    pub(crate) fn taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }
}

/// A semaphore between this rank and one peer, driven from host threads.
pub struct HostSemaphore {
    connection: Arc<dyn Connection>,
    /// The local token the peer signals; `None` for a signal-only semaphore.
    inbound: Option<Token>,
    remote_inbound: Token,
    tally: SemaphoreTally,
    timeout: Duration,
    abort: Arc<AtomicBool>,
}

impl std::fmt::Debug for HostSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSemaphore")
            .field("peer", &self.connection.peer())
            .field("inbound", &self.inbound)
            .field("remote_inbound", &self.remote_inbound)
            .field("taken", &self.tally.taken())
            .finish()
    }
}

impl HostSemaphore {
    /// A semaphore whose inbound token is `inbound` (local, host-mapped, zero when first used)
    /// and which signals the peer's token `remote_inbound` through `connection`. Waits give up
    /// after `timeout` or when `abort` is set.
    pub fn new(
        connection: Arc<dyn Connection>,
        inbound: Token,
        remote_inbound: Token,
        timeout: Duration,
        abort: Arc<AtomicBool>,
    ) -> Result<Self> {
        Self::resume(connection, inbound, remote_inbound, SemaphoreCounts::default(), timeout, abort)
    }

    /// [`new`](Self::new) over tokens that already count: the semaphore starts at `counts`
    /// instead of zero. Both sides of a pair must start from the same picture — this side's
    /// `signalled` is the peer's `received` — which they get by reading the tokens once
    /// neither writes them (as a shrink does, after every member left the parent's calls).
    pub fn resume(
        connection: Arc<dyn Connection>,
        inbound: Token,
        remote_inbound: Token,
        counts: SemaphoreCounts,
        timeout: Duration,
        abort: Arc<AtomicBool>,
    ) -> Result<Self> {
        if !inbound.memory.is_local() {
            return Err(Error::invalid("semaphore inbound token must be local memory"));
        }
        // Checks range, mapping and alignment once, so later loads cannot fail. The count
        // starts at `counts`, not at whatever the token holds: the peer may have signalled
        // before this side is built.
        inbound.memory.load_u64(inbound.offset)?;
        remote_inbound.memory.check_range(remote_inbound.offset, 8)?;
        if !remote_inbound.offset.is_multiple_of(8) {
            return Err(Error::invalid("semaphore remote token must be 8-byte aligned"));
        }
        Ok(HostSemaphore {
            connection,
            inbound: Some(inbound),
            remote_inbound,
            tally: SemaphoreTally::new(counts),
            timeout,
            abort,
        })
    }

    /// A semaphore that only signals: each [`signal`](Self::signal) adds one to the peer's
    /// token `remote_inbound` through `connection`, after every earlier write of the connection.
    /// Its inbound side lives where the host does not wait on it (a kernel waits on a token in
    /// device memory), so [`wait`](Self::wait) is `Err(Unsupported)` and [`poll`](Self::poll)
    /// is always false.
    pub fn signal_only(
        connection: Arc<dyn Connection>,
        remote_inbound: Token,
        timeout: Duration,
        abort: Arc<AtomicBool>,
    ) -> Result<Self> {
        remote_inbound.memory.check_range(remote_inbound.offset, 8)?;
        if !remote_inbound.offset.is_multiple_of(8) {
            return Err(Error::invalid("semaphore remote token must be 8-byte aligned"));
        }
        Ok(HostSemaphore {
            connection,
            inbound: None,
            remote_inbound,
            tally: SemaphoreTally::new(SemaphoreCounts::default()),
            timeout,
            abort,
        })
    }

    /// The peer this semaphore pairs with.
    pub fn peer(&self) -> usize {
        self.connection.peer()
    }

    /// The local token the peer signals (this side's inbound counter); `None` for a
    /// signal-only semaphore.
    pub fn inbound_token(&self) -> Option<&Token> {
        self.inbound.as_ref()
    }

    /// The peer's token this side signals.
    pub fn remote_token(&self) -> &Token {
        &self.remote_inbound
    }

    /// The connection used to signal.
    pub fn connection(&self) -> &Arc<dyn Connection> {
        &self.connection
    }

    /// The inbound counter, or `None` for a signal-only semaphore.
    fn inbound_word(&self) -> Option<&AtomicU64> {
        // The range, mapping and alignment were checked in `new`, so the lookup cannot fail.
        self.inbound.as_ref().and_then(|t| t.memory.atomic_u64(t.offset).ok())
    }

    /// Adds one to the peer's inbound counter, after all earlier writes of the connection.
    pub fn signal(&self) -> Result<()> {
        self.tally.signal(|next| {
            self.connection.update_and_sync(&self.remote_inbound.memory, self.remote_inbound.offset, next)
        })
    }

    /// Waits, bounded by the timeout, for the next signal from the peer.
    pub fn wait(&self) -> Result<()> {
        let Some(word) = self.inbound_word() else {
            return Err(Error::Unsupported(format!(
                "the semaphore with rank {} only signals: its inbound token is waited on by a kernel",
                self.peer()
            )));
        };
        self.tally.wait(|target| {
            let op = format!("semaphore signal #{target}");
            spin_until_peer(self.connection.as_ref(), &op, self.timeout, &self.abort, || {
                word.load(Ordering::Acquire) >= target
            })
        })?;
        Ok(())
    }

    /// Consumes one signal if it has arrived; never blocks.
    pub fn poll(&self) -> bool {
        let Some(word) = self.inbound_word() else { return false };
        self.tally.poll(word.load(Ordering::Acquire)).is_some()
    }

    /// Signals received so far (the inbound counter); 0 for a signal-only semaphore.
    pub fn received(&self) -> u64 {
        self.inbound_word().map_or(0, |w| w.load(Ordering::Acquire))
    }
}
