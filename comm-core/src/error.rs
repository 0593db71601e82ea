//! The one error type of weave, with kinds a caller can act on.

use std::time::Duration;

use crate::verdict::Verdict;

/// Result alias used across weave.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in weave.
///
/// Each variant names what failed and where; the message says what to do about it where there
/// is something to do. Library code returns these instead of panicking on input from a user or
/// a peer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A bounded wait ran out. Raise `WEAVE_TIMEOUT`, or look at the named peer: it is slow,
    /// stuck, or running a different sequence of calls.
    #[error(
        "timed out after {waited:?} waiting for {operation}{}; check that peer or raise WEAVE_TIMEOUT{}",
        peer_suffix(*.peer),
        verdict_suffix(.verdict)
    )]
    Timeout {
        /// What was being waited for.
        operation: String,
        /// The peer rank waited on, when there is one.
        peer: Option<usize>,
        /// How long the wait lasted.
        waited: Duration,
        /// Who is behind, by the members' ledgers, when a communicator's call judged it.
        verdict: Option<Box<Verdict>>,
    },
    /// A peer process went away (its socket closed, or its process no longer exists).
    #[error("peer rank {peer} was lost during {operation}: {reason}{}", verdict_suffix(.verdict))]
    PeerLost {
        /// The rank that was lost.
        peer: usize,
        /// What was in progress.
        operation: String,
        /// How the loss was noticed.
        reason: String,
        /// Who is behind, by the members' ledgers, when a communicator's call judged it.
        verdict: Option<Box<Verdict>>,
    },
    /// An argument from the caller is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Ranks registered or exchanged memory in different orders or with different contents.
    #[error("registration mismatch: {0}")]
    RegistrationMismatch(String),
    /// A peer (or a stranger) sent bytes that do not follow weave's wire format.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A transport failed to do its job (map memory, connect, copy).
    #[error("transport {transport} failed: {message}")]
    Transport {
        /// The transport's name ([`Transport::name`](crate::transport::Transport::name)).
        transport: String,
        /// What failed.
        message: String,
    },
    /// A CUDA driver call failed, or there is no CUDA driver.
    #[error("CUDA error in {operation}: {message}")]
    Cuda {
        /// The CUDA call or step.
        operation: String,
        /// The driver's message.
        message: String,
    },
    /// The request is valid but this build or this machine cannot serve it.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The operation stopped because the communicator was aborted (by the user, or after an
    /// earlier error).
    #[error("aborted: {0}")]
    Aborted(String),
    /// The communicator was revoked (by a rank of it, or because its members hold this rank
    /// failed): its calls fail until it is shrunk into a new communicator
    /// (`Communicator::shrink`), which works on a revoked one.
    #[error("revoked: {0}")]
    Revoked(String),
    /// An operating-system call failed.
    #[error("{operation} failed: {source}")]
    Io {
        /// The call and its object, e.g. "shm_open /weave-…".
        operation: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn verdict_suffix(verdict: &Option<Box<Verdict>>) -> String {
    match verdict {
        Some(v) => format!("; {v}"),
        None => String::new(),
    }
}

fn peer_suffix(peer: Option<usize>) -> String {
    match peer {
        Some(p) => format!(" from peer rank {p}"),
        None => String::new(),
    }
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument(message.into())
    }

    /// Shorthand for [`Error::Protocol`].
    pub fn protocol(message: impl Into<String>) -> Self {
        Error::Protocol(message.into())
    }

    /// Shorthand for [`Error::Timeout`]; a `warn` event of [`crate::diagnostics::FAULT`] names
    /// the operation and the peer.
    pub fn timeout(operation: impl Into<String>, peer: Option<usize>, waited: Duration) -> Self {
        let operation = operation.into();
        tracing::warn!(target: crate::diagnostics::FAULT, peer, ?waited, "timed out: {operation}");
        Error::Timeout { operation, peer, waited, verdict: None }
    }

    /// Shorthand for [`Error::PeerLost`]; a `warn` event of [`crate::diagnostics::FAULT`] names
    /// the peer, the operation and why.
    pub fn peer_lost(peer: usize, operation: impl Into<String>, reason: impl Into<String>) -> Self {
        let (operation, reason) = (operation.into(), reason.into());
        tracing::warn!(target: crate::diagnostics::FAULT, peer, "rank {peer} lost during {operation}: {reason}");
        Error::PeerLost { peer, operation, reason, verdict: None }
    }

    /// Shorthand for [`Error::Transport`].
    pub fn transport(transport: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Transport { transport: transport.into(), message: message.into() }
    }

    /// Shorthand for [`Error::Io`].
    pub fn io(operation: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { operation: operation.into(), source }
    }

    /// Wraps a `nix` errno as [`Error::Io`].
    pub fn errno(operation: impl Into<String>, errno: nix::errno::Errno) -> Self {
        Error::Io { operation: operation.into(), source: std::io::Error::from(errno) }
    }

    /// `self` with `judged` attached when it is a timeout or a lost peer (the errors a verdict
    /// explains); any other error unchanged.
    pub fn with_verdict(mut self, judged: Verdict) -> Self {
        if let Error::Timeout { verdict, .. } | Error::PeerLost { verdict, .. } = &mut self {
            *verdict = Some(Box::new(judged));
        }
        self
    }

    /// The verdict attached to a timeout or a lost peer, if a communicator's call judged it.
    pub fn verdict(&self) -> Option<&Verdict> {
        match self {
            Error::Timeout { verdict, .. } | Error::PeerLost { verdict, .. } => verdict.as_deref(),
            _ => None,
        }
    }

    /// True for errors after which the communicator cannot be trusted any more (a peer is gone,
    /// a wait expired, the job was aborted), as opposed to a rejected argument.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. }
                | Error::PeerLost { .. }
                | Error::Aborted(_)
                | Error::Revoked(_)
                | Error::Protocol(_)
                | Error::RegistrationMismatch(_)
        )
    }
}
