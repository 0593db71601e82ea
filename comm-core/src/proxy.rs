//! The proxy service: a host thread that executes the triggers port channels (and, later, GPU
//! kernels) push into a [`TriggerFifo`].
//!
//! A [`ProxyService`] owns the FIFO and two tables: registered memories ([`MemoryId`]) and host
//! semaphores ([`SemaphoreId`]). A trigger's semaphore id also selects the connection: the
//! copy of a `DATA` trigger and the flush of a `SYNC` trigger go through
//! [`HostSemaphore::connection`]. For each trigger the thread runs `DATA` (copy), then `FLAG`
//! (signal), then `SYNC` (flush), then pops it.
//!
//! # Lifecycle
//!
//! - Build, add memories and semaphores, make channels, then [`start`](ProxyService::start)
//!   with an init hook; the hook is the proxy thread's first action (bind the CUDA context, NUMA
//!   node) before it touches a trigger. Triggers pushed before `start` wait in the FIFO.
//! - The tables are append-only behind `RwLock`s, so adding memories and semaphores after
//!   `start` is supported: a new id is usable as soon as `add_*` returns.
//! - [`stop`](ProxyService::stop), or dropping the service, sets the stop flag and joins the
//!   thread. Triggers still in the FIFO are not executed; flush first to be sure your
//!   operations completed. The shared state (FIFO, tables) stays alive while a channel holds it;
//!   pushing into a stopped proxy is [`Error::Aborted`].
//!
//! # Errors
//!
//! The first failure — the init hook's error, an unknown id in a trigger, a failing copy,
//! signal or flush — is recorded and the service is *failed*: the thread stops executing
//! triggers but keeps popping them, so pushers never get stuck; every later push or flush on
//! any channel of this proxy returns the recorded error (see [`ProxyService::error`]). A failed
//! init hook ends the thread at once; waits notice and return the hook's error.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::fifo::{MAX_MEMORIES, MAX_SEMAPHORES, Trigger, TriggerFifo, TriggerType};
pub use crate::fifo::{MemoryId, SemaphoreId};
use crate::memory::RegisteredMemory;
use crate::semaphore::HostSemaphore;
use crate::spin::WaitContext;

/// Empty polls the idle proxy spins through before it starts yielding its core.
const IDLE_SPINS: u32 = 1_000;
/// Empty polls, counted from the start of idling, before the proxy starts sleeping.
const IDLE_YIELDS: u32 = IDLE_SPINS + 100;
/// How long an idle proxy sleeps between polls, so it does not burn a core when ranks
/// outnumber cores.
const IDLE_SLEEP: Duration = Duration::from_micros(50);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded values stay consistent at every step, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A copy of `e` (weave's error owns an `io::Error`, which is not `Clone`), so the one recorded
/// proxy error can be reported to every channel.
fn duplicate(e: &Error) -> Error {
    match e {
        Error::Timeout { operation, peer, waited, verdict } => {
            Error::Timeout { operation: operation.clone(), peer: *peer, waited: *waited, verdict: verdict.clone() }
        }
        Error::PeerLost { peer, operation, reason, verdict } => Error::PeerLost {
            peer: *peer,
            operation: operation.clone(),
            reason: reason.clone(),
            verdict: verdict.clone(),
        },
        Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
        Error::RegistrationMismatch(m) => Error::RegistrationMismatch(m.clone()),
        Error::Protocol(m) => Error::Protocol(m.clone()),
        Error::Transport { transport, message } => {
            Error::Transport { transport: transport.clone(), message: message.clone() }
        }
        Error::Cuda { operation, message } => Error::Cuda { operation: operation.clone(), message: message.clone() },
        Error::Unsupported(m) => Error::Unsupported(m.clone()),
        Error::Aborted(m) => Error::Aborted(m.clone()),
        Error::Revoked(m) => Error::Revoked(m.clone()),
        Error::Io { operation, source } => Error::Io {
            operation: operation.clone(),
            source: match source.raw_os_error() {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::new(source.kind(), source.to_string()),
            },
        },
    }
}

/// Prefixes plain-message errors with where in the proxy they happened.
fn in_context(e: Error, context: &str) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("{context}: {m}")),
        Error::Protocol(m) => Error::Protocol(format!("{context}: {m}")),
        Error::Unsupported(m) => Error::Unsupported(format!("{context}: {m}")),
        Error::Aborted(m) => Error::Aborted(format!("{context}: {m}")),
        other => other,
    }
}

/// What the proxy thread, the service and its channels share.
pub(crate) struct ProxyShared {
    fifo: TriggerFifo,
    memories: RwLock<Vec<RegisteredMemory>>,
    semaphores: RwLock<Vec<Arc<HostSemaphore>>>,
    timeout: Duration,
    abort: Arc<AtomicBool>,
    /// Set by `stop`; the thread exits at its next poll.
    stop: AtomicBool,
    /// True from `start` until the thread function returns.
    running: AtomicBool,
    /// Fast check for `error.is_some()`.
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
}

impl ProxyShared {
    pub(crate) fn fifo(&self) -> &TriggerFifo {
        &self.fifo
    }

    /// Keeps the first error; marks the service failed.
    fn record(&self, e: Error) {
        let mut slot = lock(&self.error);
        if slot.is_none() {
            *slot = Some(e);
        }
        // Release: pairs with the acquire in `check_failed`; a thread that sees the flag finds the
        // error under the lock (the lock orders it too; the flag is only a fast path).
        self.failed.store(true, Ordering::Release);
    }

    pub(crate) fn error(&self) -> Option<Error> {
        lock(&self.error).as_ref().map(duplicate)
    }

    /// The recorded error, if the service failed.
    pub(crate) fn check_failed(&self) -> Result<()> {
        // Acquire: see `record`.
        if self.failed.load(Ordering::Acquire) {
            return Err(self.error().unwrap_or_else(|| Error::Aborted("the proxy service failed".into())));
        }
        Ok(())
    }

    /// Ok while triggers pushed now will be executed (eventually): not failed, not stopped.
    pub(crate) fn check_usable(&self) -> Result<()> {
        self.check_failed()?;
        // Relaxed: the flag publishes no data; it only tells us to give up.
        if self.stop.load(Ordering::Relaxed) {
            return Err(Error::Aborted("the proxy service was stopped".into()));
        }
        Ok(())
    }

    fn wait_context<'a>(
        &'a self,
        operation: &'a str,
        connection: &'a dyn Connection,
        check: &'a dyn Fn() -> Result<()>,
    ) -> WaitContext<'a> {
        WaitContext {
            operation,
            peer: Some(connection.peer()),
            timeout: self.timeout,
            abort: &self.abort,
            check_peer: check,
        }
    }

    /// Pushes `trigger` for a channel whose peer is behind `connection`; waits (bounded) while
    /// the FIFO is full. Returns the ticket.
    pub(crate) fn push(&self, trigger: Trigger, operation: &str, connection: &dyn Connection) -> Result<u64> {
        let check = || -> Result<()> {
            self.check_usable()?;
            connection.check_peer()
        };
        self.fifo.push(trigger, &self.wait_context(operation, connection, &check))
    }

    /// Waits (bounded) until the proxy handled the trigger with `ticket`, then reports the
    /// proxy's error if it has one.
    pub(crate) fn wait_processed(&self, ticket: u64, operation: &str, connection: &dyn Connection) -> Result<()> {
        let check = || -> Result<()> {
            self.check_usable()?;
            connection.check_peer()
        };
        self.fifo.wait_processed(ticket, &self.wait_context(operation, connection, &check))?;
        self.check_failed()
    }

    /// The memory with `id`, or the table's length.
    fn memory(&self, id: MemoryId) -> std::result::Result<RegisteredMemory, usize> {
        let table = self.memories.read().unwrap_or_else(PoisonError::into_inner);
        table.get(id.0 as usize).cloned().ok_or(table.len())
    }

    /// The semaphore with `id`, or the table's length.
    fn semaphore(&self, id: SemaphoreId) -> std::result::Result<Arc<HostSemaphore>, usize> {
        let table = self.semaphores.read().unwrap_or_else(PoisonError::into_inner);
        table.get(id.0 as usize).cloned().ok_or(table.len())
    }

    /// Runs one trigger: DATA, then FLAG, then SYNC.
    fn execute(&self, seq: u64, trigger: Trigger) -> Result<()> {
        let kind = trigger.kind();
        if kind.is_empty() {
            return Ok(()); // only a device could push this; nothing to do
        }
        // Clone the table entries (reference counts) so no lock is held during slow operations.
        let context = || format!("proxy trigger #{seq} {trigger:?}");
        let unknown = |what: &str, id: u32, registered: usize| {
            Error::invalid(format!("{}: {what} id {id} is not registered ({registered} are)", context()))
        };
        let semaphore =
            self.semaphore(trigger.semaphore()).map_err(|n| unknown("semaphore", trigger.semaphore().0, n))?;
        let connection = semaphore.connection();
        if kind.contains(TriggerType::DATA) {
            let dst = self.memory(trigger.dst_memory()).map_err(|n| unknown("memory", trigger.dst_memory().0, n))?;
            let src = self.memory(trigger.src_memory()).map_err(|n| unknown("memory", trigger.src_memory().0, n))?;
            let usize_of = |v: u64| {
                usize::try_from(v).map_err(|_| Error::invalid(format!("{}: {v} does not fit usize", context())))
            };
            let (dst_offset, src_offset, size) =
                (usize_of(trigger.dst_offset())?, usize_of(trigger.src_offset())?, usize_of(trigger.size())?);
            connection.write(&dst, dst_offset, &src, src_offset, size).map_err(|e| in_context(e, &context()))?;
        }
        if kind.contains(TriggerType::FLAG) {
            semaphore.signal().map_err(|e| in_context(e, &context()))?;
        }
        if kind.contains(TriggerType::SYNC) {
            connection.flush().map_err(|e| in_context(e, &context()))?;
        }
        Ok(())
    }

    /// The proxy thread.
    fn run(&self, init_hook: impl FnOnce() -> Result<()>) {
        let _exit = ExitGuard(self);
        if let Err(e) = init_hook() {
            self.record(e);
            return;
        }
        let mut idle: u32 = 0;
        // Relaxed: the stop flag publishes nothing; `stop` joins the thread afterwards.
        while !self.stop.load(Ordering::Relaxed) {
            let Some(trigger) = self.fifo.poll() else {
                idle = idle.saturating_add(1);
                if idle < IDLE_SPINS {
                    std::hint::spin_loop();
                } else if idle < IDLE_YIELDS {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(IDLE_SLEEP);
                }
                continue;
            };
            idle = 0;
            // Relaxed is enough here: only this thread sets `failed` after start (besides the
            // hook's failure, which ends the thread).
            if !self.failed.load(Ordering::Relaxed) {
                let seq = self.fifo.tail();
                if let Err(e) = self.execute(seq, trigger) {
                    self.record(e);
                }
            }
            self.fifo.pop();
        }
    }
}

/// Marks the thread as gone when it returns or unwinds; records a panic as the proxy's error.
struct ExitGuard<'a>(&'a ProxyShared);

impl Drop for ExitGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.record(Error::Aborted("the proxy thread panicked".into()));
        }
        // Release: pairs with the acquire in `is_running`.
        self.0.running.store(false, Ordering::Release);
    }
}

enum ThreadState {
    NotStarted,
    Running(JoinHandle<()>),
    Stopped,
}

/// Executes port-channel triggers on its own thread. See the [module docs](self).
///
/// `Drop` stops and joins the thread.
pub struct ProxyService {
    shared: Arc<ProxyShared>,
    state: Mutex<ThreadState>,
}

impl fmt::Debug for ProxyService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyService")
            .field("fifo", &self.shared.fifo)
            .field("memories", &self.shared.memories.read().map(|t| t.len()).unwrap_or(0))
            .field("semaphores", &self.shared.semaphores.read().map(|t| t.len()).unwrap_or(0))
            .field("running", &self.is_running())
            .field("failed", &self.shared.failed.load(Ordering::Relaxed))
            .finish()
    }
}

impl ProxyService {
    /// A stopped service with a host-heap FIFO of `fifo_capacity` slots (a power of two; see
    /// [`DEFAULT_FIFO_CAPACITY`](crate::fifo::DEFAULT_FIFO_CAPACITY)). Channel waits give up
    /// after `timeout` or when `abort` is set.
    pub fn new(fifo_capacity: u32, timeout: Duration, abort: Arc<AtomicBool>) -> Result<Self> {
        Ok(Self::with_fifo(TriggerFifo::new(fifo_capacity)?, timeout, abort))
    }

    /// A stopped service over a FIFO built elsewhere (e.g. in device-mapped memory).
    pub fn with_fifo(fifo: TriggerFifo, timeout: Duration, abort: Arc<AtomicBool>) -> Self {
        ProxyService {
            shared: Arc::new(ProxyShared {
                fifo,
                memories: RwLock::new(Vec::new()),
                semaphores: RwLock::new(Vec::new()),
                timeout,
                abort,
                stop: AtomicBool::new(false),
                running: AtomicBool::new(false),
                failed: AtomicBool::new(false),
                error: Mutex::new(None),
            }),
            state: Mutex::new(ThreadState::NotStarted),
        }
    }

    /// Adds a memory to the table (before or after `start`); `Err(InvalidArgument)` once
    /// [`MAX_MEMORIES`] are registered.
    pub fn add_memory(&self, memory: RegisteredMemory) -> Result<MemoryId> {
        let mut table = self.shared.memories.write().unwrap_or_else(PoisonError::into_inner);
        if table.len() >= MAX_MEMORIES {
            return Err(Error::invalid(format!("a proxy service holds at most {MAX_MEMORIES} memories")));
        }
        table.push(memory);
        Ok(MemoryId((table.len() - 1) as u32))
    }

    /// Adds a semaphore (and thereby its connection) to the table (before or after `start`);
    /// `Err(InvalidArgument)` once [`MAX_SEMAPHORES`] are registered.
    pub fn add_semaphore(&self, semaphore: Arc<HostSemaphore>) -> Result<SemaphoreId> {
        let mut table = self.shared.semaphores.write().unwrap_or_else(PoisonError::into_inner);
        if table.len() >= MAX_SEMAPHORES {
            return Err(Error::invalid(format!("a proxy service holds at most {MAX_SEMAPHORES} semaphores")));
        }
        table.push(semaphore);
        Ok(SemaphoreId((table.len() - 1) as u32))
    }

    /// The registered memory with `id`.
    pub fn memory(&self, id: MemoryId) -> Result<RegisteredMemory> {
        self.shared.memory(id).map_err(|_| Self::unknown("memory", id.0))
    }

    /// The semaphore with `id`.
    pub fn semaphore(&self, id: SemaphoreId) -> Result<Arc<HostSemaphore>> {
        self.shared.semaphore(id).map_err(|_| Self::unknown("semaphore", id.0))
    }

    /// The state the proxy thread shares with the port channels it serves.
    pub(crate) fn shared(&self) -> &Arc<ProxyShared> {
        &self.shared
    }

    fn unknown(what: &str, id: u32) -> Error {
        Error::invalid(format!("{what} id {id} is not registered with this proxy service"))
    }

    /// Spawns the proxy thread. Its first action is `init_hook` (bind the CUDA context, …); if
    /// the hook fails, its error is recorded (see [`error`](Self::error)) and the thread exits.
    /// `Err(InvalidArgument)` when already started or stopped; `Err(Io)` when the thread
    /// cannot be spawned.
    pub fn start<F>(&self, init_hook: F) -> Result<()>
    where
        F: FnOnce() -> Result<()> + Send + 'static,
    {
        let mut state = lock(&self.state);
        match *state {
            ThreadState::NotStarted => {}
            ThreadState::Running(_) => return Err(Error::invalid("the proxy service is already running")),
            ThreadState::Stopped => {
                return Err(Error::invalid("the proxy service was stopped; build a new one"));
            }
        }
        let shared = Arc::clone(&self.shared);
        // Relaxed: a status flag; the spawn below orders it for the new thread anyway.
        self.shared.running.store(true, Ordering::Relaxed);
        let spawned = std::thread::Builder::new().name("weave-proxy".into()).spawn(move || shared.run(init_hook));
        match spawned {
            Ok(handle) => {
                *state = ThreadState::Running(handle);
                Ok(())
            }
            Err(e) => {
                self.shared.running.store(false, Ordering::Relaxed);
                Err(Error::io("spawning the proxy thread", e))
            }
        }
    }

    /// Stops and joins the proxy thread; triggers still queued are not executed. Idempotent;
    /// the service cannot be started again.
    pub fn stop(&self) {
        // Relaxed: the flag publishes nothing; the join below synchronizes with the thread.
        self.shared.stop.store(true, Ordering::Relaxed);
        let previous = std::mem::replace(&mut *lock(&self.state), ThreadState::Stopped);
        if let ThreadState::Running(handle) = previous {
            if handle.thread().id() == std::thread::current().id() {
                // Dropped on the proxy thread itself (a hook kept the service alive): a thread
                // cannot join itself; it returns at its next stop check.
                return;
            }
            if handle.join().is_err() {
                self.shared.record(Error::Aborted("the proxy thread panicked".into()));
            }
        }
    }

    /// True while the proxy thread runs (from `start` until it exits).
    pub fn is_running(&self) -> bool {
        // Acquire: pairs with the release in the thread's exit guard.
        self.shared.running.load(Ordering::Acquire)
    }

    /// The proxy thread's id while it exists.
    pub fn thread_id(&self) -> Option<ThreadId> {
        match &*lock(&self.state) {
            ThreadState::Running(handle) => Some(handle.thread().id()),
            _ => None,
        }
    }

    /// The first error the proxy recorded (a failed init hook, a bad trigger, a failed copy,
    /// signal or flush); once set, every channel of this proxy reports it.
    pub fn error(&self) -> Option<Error> {
        self.shared.error()
    }

    /// The FIFO triggers are pushed into (for device handles and for tests). Only the proxy
    /// thread may [`poll`](TriggerFifo::poll) or [`pop`](TriggerFifo::pop) it.
    pub fn fifo(&self) -> &TriggerFifo {
        &self.shared.fifo
    }
}

impl Drop for ProxyService {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Two in-process "ranks" for proxy and port-channel tests.
#[cfg(test)]
pub(crate) mod test_support;

#[cfg(test)]
mod tests;
