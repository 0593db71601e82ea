//! Every call of a communicator goes into its ledger ([`comm_core::ledger`]): begun with its
//! sequence number and signature, finished when it returns without error. A call that fails on
//! a timeout or a lost peer asks every member for its ledger and returns the verdict — which
//! ranks are behind, in which call, how far each got — inside the error
//! ([`Error::verdict`]), and says it on the `weave::fault` target. A call that finds the
//! ranks out of step ([`Error::Protocol`]: a message of another call, an unmatched send)
//! revokes the communicator, so that its peers stop too.

use std::time::Duration;

use comm_core::diagnostics;
use comm_core::ledger::{CallKind, CallSignature};
use comm_core::{Error, Result};

use crate::api::communicator::Communicator;
use crate::table::Collective;

/// The longest a failed call waits for the members' ledgers: a member silent that long is
/// stopped, hung or cut off.
const SILENCE: Duration = Duration::from_millis(500);

impl Collective {
    /// The ledger's name for this collective.
    pub(crate) fn call_kind(self) -> CallKind {
        match self {
            Collective::AllReduce => CallKind::AllReduce,
            Collective::AllGather => CallKind::AllGather,
            Collective::ReduceScatter => CallKind::ReduceScatter,
            Collective::Broadcast => CallKind::Broadcast,
            Collective::Reduce => CallKind::Reduce,
            Collective::AllToAll => CallKind::AllToAll,
            Collective::AllToAllv => CallKind::AllToAllv,
            Collective::SendRecv => CallKind::Group,
        }
    }
}

impl Communicator {
    /// Runs `call` as the call `signature` of this communicator's ledger (see the module
    /// documentation).
    #[inline]
    pub(crate) fn ledgered<R>(&self, signature: CallSignature, call: impl FnOnce() -> Result<R>) -> Result<R> {
        let ledger = self.resilience.ledger();
        let seq = ledger.begin(signature);
        match call() {
            Ok(r) => {
                ledger.finish(&signature, seq);
                Ok(r)
            }
            Err(e) => Err(self.judged(e)),
        }
    }

    /// `e` with the members' verdict when it is a timeout or a lost peer of a communicator
    /// not revoked (a revocation's error is the revoker's story, told by the rank that
    /// revoked). Device calls are judged when [`check_gpu`](Self::check_gpu) finds their
    /// failure: by the calls each rank queued.
    #[cold]
    #[inline(never)]
    pub(crate) fn judged(&self, e: Error) -> Error {
        // Ranks out of step (a message of another call, an unmatched send): the finder
        // revokes, so that peers waiting for it stop at once.
        if let Error::Protocol(_) = e {
            self.revoke();
            return e;
        }
        if let Error::Timeout { peer: Some(p), .. } = e {
            self.resilience.ledger().waited_on(p);
        }
        if !matches!(e, Error::Timeout { .. } | Error::PeerLost { .. }) || self.is_revoked() {
            return e;
        }
        let silence = SILENCE.min(self.core().config().timeout);
        match self.resilience.verdict(silence) {
            Some(verdict) => {
                tracing::warn!(target: diagnostics::FAULT, rank = self.rank(), "{verdict}");
                e.with_verdict(verdict)
            }
            None => e,
        }
    }
}
