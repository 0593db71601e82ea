//! Notices: small messages any rank may send any other at any time — a revocation, a round of
//! a failure agreement — handled by one thread per root bootstrap, the [`NoticeService`],
//! whatever the rank's own threads are doing (blocked in a collective, or in no call at all).
//!
//! # Wire format
//!
//! A notice travels as one bootstrap message with tag [`TAG_NOTICE`] between root-bootstrap
//! ranks: a [`wire`](crate::wire) message with magic `WVNT`, version 1, then `kind: u8`,
//! `namespace: u64` (the communicator it is about: 0 for a job's first communicator, a split's
//! or shrink's own number otherwise), then the kind's body:
//!
//! | kind | body |
//! |---|---|
//! | [`NoticeKind::Revoke`] | nothing |
//! | [`NoticeKind::Agreement`] | an [`AgreementMessage`](crate::agreement::AgreementMessage) |
//! | [`NoticeKind::Stop`] | nothing; only a rank to itself, to end its service |
//! | [`NoticeKind::LedgerQuery`] | `query: u64` |
//! | [`NoticeKind::LedgerAnswer`] | `query: u64`, then a [`LedgerEntry`](crate::ledger::LedgerEntry) |
//!
//! Decoding checks every field; a malformed notice or one for a communicator this rank does not
//! hold is dropped (a `debug` event says so), never a panic.
//!
//! # The service
//!
//! Each communicator registers its [`Resilience`] under its namespace; the service thread reads
//! notices ([`Bootstrap::recv_notice`]) and hands each to the communicator it names. Notices for
//! a namespace not registered yet (a peer revoked or started agreeing before this rank built the
//! communicator) are kept, a bounded number, and handed over at registration. Dropping the
//! service sends the rank a [`NoticeKind::Stop`] and joins the thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::bootstrap::{Bootstrap, TAG_NOTICE};
use crate::diagnostics;
use crate::error::{Error, Result};
use crate::resilience::Resilience;
use crate::wire::{Decoder, Encoder};

/// Magic of a notice.
const MAGIC: [u8; 4] = *b"WVNT";
/// Version of the notice format.
const VERSION: u16 = 1;
/// Notices kept for namespaces not registered yet; older ones are dropped beyond it.
const EARLY_LIMIT: usize = 4096;
/// How long the service waits for a notice before it looks at its stop flag again.
const POLL: Duration = Duration::from_millis(200);

/// What a notice is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum NoticeKind {
    /// The communicator is revoked: pass it on and stop every call of it.
    Revoke = 1,
    /// A message of a failure agreement.
    Agreement = 2,
    /// Ends the service (a rank to itself).
    Stop = 3,
    /// Asks for the member's ledger entry (see [`crate::verdict`]).
    LedgerQuery = 4,
    /// Answers a [`NoticeKind::LedgerQuery`].
    LedgerAnswer = 5,
}

impl NoticeKind {
    fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(NoticeKind::Revoke),
            2 => Some(NoticeKind::Agreement),
            3 => Some(NoticeKind::Stop),
            4 => Some(NoticeKind::LedgerQuery),
            5 => Some(NoticeKind::LedgerAnswer),
            _ => None,
        }
    }
}

/// Encodes a notice of `kind` about communicator `namespace` with `body`.
pub fn encode_notice(kind: NoticeKind, namespace: u64, body: &[u8]) -> Vec<u8> {
    Encoder::new(MAGIC, VERSION).u8(kind as u8).u64(namespace).bytes(body).finish()
}

/// Decodes a notice into its kind, namespace and body.
pub fn decode_notice(bytes: &[u8]) -> Result<(NoticeKind, u64, Vec<u8>)> {
    let mut d = Decoder::new(bytes, MAGIC, VERSION, "notice")?;
    let kind = d.u8()?;
    let kind = NoticeKind::from_u8(kind).ok_or_else(|| Error::protocol(format!("notice of unknown kind {kind}")))?;
    let namespace = d.u64()?;
    let body = d.bytes()?.to_vec();
    d.finish()?;
    Ok((kind, namespace, body))
}

/// What the service thread and the communicators share.
struct Registry {
    communicators: HashMap<u64, Weak<Resilience>>,
    /// Notices for namespaces not registered yet: (namespace, sender, kind, body).
    early: Vec<(u64, usize, NoticeKind, Vec<u8>)>,
}

/// The thread that hands notices to the communicators of one root bootstrap (see the module
/// documentation). Shared by every communicator over that bootstrap; dropped with the last.
pub struct NoticeService {
    bootstrap: Arc<dyn Bootstrap>,
    registry: Arc<Mutex<Registry>>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    supported: bool,
}

impl std::fmt::Debug for NoticeService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoticeService")
            .field("rank", &self.bootstrap.rank())
            .field("supported", &self.supported)
            .finish()
    }
}

impl NoticeService {
    /// Starts the service of `bootstrap` (a root bootstrap). Over a bootstrap that carries no
    /// notices no thread starts: revocation stays local and agreement is unsupported.
    pub fn start(bootstrap: Arc<dyn Bootstrap>) -> Result<Arc<Self>> {
        let registry = Arc::new(Mutex::new(Registry { communicators: HashMap::new(), early: Vec::new() }));
        let stopping = Arc::new(AtomicBool::new(false));
        let supported = bootstrap.carries_notices();
        let thread = if supported {
            let (b, r, s) = (bootstrap.clone(), registry.clone(), stopping.clone());
            let rank = bootstrap.rank();
            let handle = std::thread::Builder::new()
                .name(format!("weave-notices-{rank}"))
                .stack_size(256 << 10)
                .spawn(move || serve(&*b, &r, &s))
                .map_err(|e| Error::io("start the notice service thread", e))?;
            Some(handle)
        } else {
            None
        };
        Ok(Arc::new(NoticeService { bootstrap, registry, stopping, thread, supported }))
    }

    /// Whether notices reach other ranks (the bootstrap carries them).
    pub fn supported(&self) -> bool {
        self.supported
    }

    /// Registers `member` under its namespace and hands it the notices that came early.
    pub fn register(&self, member: &Arc<Resilience>) {
        let namespace = member.namespace();
        let early: Vec<_> = {
            let mut registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
            registry.communicators.retain(|_, w| w.strong_count() > 0);
            registry.communicators.insert(namespace, Arc::downgrade(member));
            let (mine, rest) = std::mem::take(&mut registry.early).into_iter().partition(|e| e.0 == namespace);
            registry.early = rest;
            mine
        };
        for (_, from, kind, body) in early {
            member.handle_notice(from, kind, &body);
        }
    }
}

/// Sends one notice over `bootstrap`; whether it was handed to the link.
pub(crate) fn send_notice(bootstrap: &dyn Bootstrap, to: usize, kind: NoticeKind, namespace: u64, body: &[u8]) -> bool {
    match bootstrap.send_notice(to, &encode_notice(kind, namespace, body)) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(target: diagnostics::FAULT, rank = bootstrap.rank(), to, "notice {kind:?} not sent: {e}");
            false
        }
    }
}

impl Drop for NoticeService {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            // Wake the thread at once; without it, it notices the flag within `POLL`.
            let me = self.bootstrap.rank();
            let _ = self.bootstrap.send(me, TAG_NOTICE, &encode_notice(NoticeKind::Stop, 0, &[]));
            let _ = thread.join();
        }
    }
}

/// The service thread: reads notices until stopped.
fn serve(bootstrap: &dyn Bootstrap, registry: &Mutex<Registry>, stopping: &AtomicBool) {
    let me = bootstrap.rank();
    while !stopping.load(Ordering::Acquire) {
        let (from, bytes) = match bootstrap.recv_notice(POLL) {
            Ok(Some(notice)) => notice,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(target: diagnostics::FAULT, rank = me, "the notice service stops: {e}");
                return;
            }
        };
        let (kind, namespace, body) = match decode_notice(&bytes) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(target: diagnostics::FAULT, rank = me, from, "a malformed notice was dropped: {e}");
                continue;
            }
        };
        if kind == NoticeKind::Stop {
            if from == me {
                return;
            }
            continue;
        }
        let member = {
            let mut r = registry.lock().unwrap_or_else(PoisonError::into_inner);
            match r.communicators.get(&namespace).and_then(Weak::upgrade) {
                Some(m) => Some(m),
                None => {
                    if r.early.len() >= EARLY_LIMIT {
                        r.early.remove(0);
                    }
                    r.early.push((namespace, from, kind, body.clone()));
                    None
                }
            }
        };
        if let Some(member) = member {
            member.handle_notice(from, kind, &body);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_round_trip_and_garbage_is_an_error() {
        let bytes = encode_notice(NoticeKind::Agreement, 77, b"body");
        assert_eq!(decode_notice(&bytes).unwrap(), (NoticeKind::Agreement, 77, b"body".to_vec()));
        for damaged in crate::wire::damaged_messages(&bytes) {
            let _ = decode_notice(&damaged);
        }
        let mut unknown = bytes.clone();
        let kind_at = 4 + 2;
        unknown[kind_at] = 99;
        assert!(decode_notice(&unknown).is_err(), "unknown kind");
        assert!(decode_notice(b"WVNT").is_err());
    }
}
