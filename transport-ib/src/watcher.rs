//! The backend's watcher: one thread that applies peers' flags on the connections no rank is
//! waiting on at the moment (see [`crate::inbound`]).
//!
//! Every [`TICK`] it looks at each connection's count of waiter calls. A count that moved means
//! a waiter drains that connection itself, and the watcher leaves it alone (a thread woken for
//! every message would compete with the waiter for the CPU). Otherwise it arms the connection's
//! receive queue on the backend's completion channel and drains what is already there (arming
//! first, so nothing that arrives in between goes unnoticed), then sleeps on the channel until
//! an armed queue gets an entry, or the tick ends. So a flag nobody spins for is stored within a
//! wake-up of its arrival, and one a rank spins for costs the watcher nothing.
//!
//! The thread stops when the last owner (the backend and its connections) drops the watcher.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use comm_core::{Error, Result};

use crate::inbound::Inbound;
use crate::verbs::{CompletionChannel, Port};

/// How often the watcher looks whether a connection is attended, and its longest sleep.
const TICK: Duration = Duration::from_millis(2);

/// The watcher of one backend.
pub(crate) struct Watcher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    channel: Arc<CompletionChannel>,
    /// The connections' receiving sides, by the context their receive queue's events carry.
    inbounds: Mutex<HashMap<u64, Weak<Inbound>>>,
    last_context: AtomicU64,
    stop: AtomicBool,
}

impl Watcher {
    /// A channel on `port` and the thread watching it.
    pub(crate) fn start(port: &Arc<Port>) -> Result<Arc<Self>> {
        let shared = Arc::new(Shared {
            channel: CompletionChannel::new(port)?,
            inbounds: Mutex::default(),
            last_context: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let theirs = shared.clone();
        let thread = std::thread::Builder::new()
            .name("weave-ib-watch".into())
            .spawn(move || theirs.run())
            .map_err(|e| Error::transport(crate::NAME, format!("starting the ib watcher thread: {e}")))?;
        Ok(Arc::new(Watcher { shared, thread: Some(thread) }))
    }

    /// The channel receive queues report to.
    pub(crate) fn channel(&self) -> &Arc<CompletionChannel> {
        &self.shared.channel
    }

    /// A fresh context for a receive queue on [`channel`](Self::channel).
    pub(crate) fn next_context(&self) -> u64 {
        self.shared.last_context.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Watches `inbound`, whose receive queue was made with `context`.
    pub(crate) fn watch(&self, context: u64, inbound: &Arc<Inbound>) {
        self.shared.inbounds.lock().unwrap_or_else(|p| p.into_inner()).insert(context, Arc::downgrade(inbound));
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // It ends within a tick; a panic in it has nothing left to report.
            let _ = thread.join();
        }
    }
}

/// What the watcher knows of one connection.
#[derive(Default)]
struct Seen {
    attended: Option<u64>,
    armed: bool,
}

impl Shared {
    fn run(&self) {
        let mut seen: HashMap<u64, Seen> = HashMap::new();
        while !self.stop.load(Ordering::Relaxed) {
            let live: Vec<(u64, Arc<Inbound>)> = {
                let mut map = self.inbounds.lock().unwrap_or_else(|p| p.into_inner());
                map.retain(|_, w| w.strong_count() > 0);
                map.iter().filter_map(|(&c, w)| Some((c, w.upgrade()?))).collect()
            };
            seen.retain(|c, _| live.iter().any(|(l, _)| l == c));
            for (context, inbound) in &live {
                let s = seen.entry(*context).or_default();
                let calls = inbound.attended();
                if s.attended.replace(calls) != Some(calls) || inbound.failure().is_some() {
                    // A waiter drains it (or it broke, which its users hear of).
                    continue;
                }
                if !s.armed {
                    s.armed = inbound.queue().arm().is_ok();
                }
                // An error is kept in the connection, for its users.
                let _ = inbound.drain();
            }
            drop(live);
            match self.channel.wait(TICK) {
                Ok(true) => self.take_events(&mut seen),
                Ok(false) => {}
                // Not expected; the ticks still drain every connection nobody waits on.
                Err(_) => std::thread::sleep(TICK),
            }
        }
    }

    /// Takes the channel's events and drains the queues they name.
    fn take_events(&self, seen: &mut HashMap<u64, Seen>) {
        while let Ok(Some(context)) = self.channel.take_event() {
            if let Some(s) = seen.get_mut(&context) {
                s.armed = false;
            }
            let inbound = self.inbounds.lock().unwrap_or_else(|p| p.into_inner()).get(&context).and_then(Weak::upgrade);
            if let Some(inbound) = inbound {
                let _ = inbound.drain();
            }
        }
    }
}
