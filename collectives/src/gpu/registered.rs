//! Buffers one rank registered alone ([`Registrations`]; `api/registered.rs` registers them,
//! NCCL's `ncclCommRegister`), and the all-reduce that reads and writes them in place.
//!
//! A registration is local: no peer takes part, and only the rank knows which of its buffers a
//! call uses. NCCL's rule makes the choice agree across ranks without a word: when one rank
//! passes registered buffers to a call, every rank does (input and output both). So a rank
//! whose input and output lie in registrations of the communicator runs the windowed
//! all-reduce (`kernels/cuda/windowed.cu`) in its published form: the first such call asks each
//! peer's transport to map the registration in the peer's process
//! (`comm_core::Communicator::map_at_peer`, answered by the peer's own thread, so the peer need
//! not be in a call), learning where each peer sees it; the kernel then tells each peer where
//! this rank's buffers are for it, since offsets differ between ranks. A rank that broke the
//! rule is named by the kernel's mismatch check, not read blindly.

use std::sync::Arc;

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::memory::RegisteredMemory;
use comm_core::{Error, Result};

use super::windowed::{WindowedCall, in_place_kind};
use super::{MAX_GPU_RANKS, UserRange};
use crate::call::DeviceCall;
use crate::select::device::windowed_form;

/// A buffer this rank registered with a communicator, as the GPU engine keeps it.
pub(crate) struct RegistrationState {
    /// The memory, and the communicator it was registered with.
    pub(crate) range: UserRange,
    /// The registration with the transport, where the direct kernels run (calls on it are zero
    /// copy); `None` elsewhere (kept, and calls copy).
    pub(crate) memory: Option<RegisteredMemory>,
}

/// One registration and where each rank maps it, once a call shared it.
struct Entry {
    state: Arc<RegistrationState>,
    /// Its address as each rank sees it (this rank's own at its rank), after the first call
    /// that used it asked every peer to map it; `None` before.
    at_ranks: Option<Vec<u64>>,
}

/// A communicator's registrations on this rank, in registration order.
#[derive(Default)]
pub(crate) struct Registrations {
    list: Vec<Entry>,
}

impl Registrations {
    /// Keeps a registration just made.
    pub(crate) fn add(&mut self, state: Arc<RegistrationState>) {
        self.list.push(Entry { state, at_ranks: None });
    }

    /// Drops `state`; returns where peers map it (to unmap them), or `None` when it is not here
    /// (deregistered already).
    pub(crate) fn remove(&mut self, state: &Arc<RegistrationState>) -> Option<Vec<u64>> {
        let i = self.list.iter().position(|e| Arc::ptr_eq(&e.state, state))?;
        Some(self.list.remove(i).at_ranks.unwrap_or_default())
    }

    /// Registrations kept.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// The zero-copy registration holding `[address, address + len)`, and the offset there.
    fn find(&self, address: u64, len: usize) -> Option<(usize, u64)> {
        self.list
            .iter()
            .enumerate()
            .filter(|(_, e)| e.state.memory.is_some())
            .find_map(|(i, e)| e.state.range.offset_of(address, len).map(|o| (i, o)))
    }

    /// Where each rank maps registration `i`, asking the peers to map it on first use.
    fn shared(&mut self, i: usize, core: &CoreCommunicator) -> Result<&[u64]> {
        let entry = &mut self.list[i];
        if entry.at_ranks.is_none() {
            let memory = entry.state.memory.as_ref().ok_or_else(|| Error::invalid("registration without memory"))?;
            let mut at = Vec::with_capacity(core.world_size());
            for peer in 0..core.world_size() {
                match core.map_at_peer(memory, peer) {
                    Ok(a) => at.push(a),
                    Err(e) => {
                        // Peers that mapped it already let go of it again.
                        for (q, _) in at.iter().enumerate().filter(|&(q, _)| q != core.rank()) {
                            let _ = core.unmap_at_peer(memory, q);
                        }
                        return Err(Error::invalid(format!(
                            "the registered buffer at {:#x} ({} bytes) could not be shared with rank {peer}: {e}; \
                             the call was not started (its peers wait for it until their timeout)",
                            entry.state.range.address, entry.state.range.len
                        )));
                    }
                }
            }
            entry.at_ranks = Some(at);
        }
        Ok(entry.at_ranks.as_deref().unwrap_or_default())
    }

    /// The published windowed form of an all-reduce `call` whose input and output both lie in
    /// zero-copy registrations (NCCL's rule: then every rank's do), sharing them with the peers
    /// on first use; `None` when they do not (the call copies), and for types reduced through
    /// a wider one.
    pub(crate) fn all_reduce(&mut self, call: &DeviceCall, core: &CoreCommunicator) -> Result<Option<WindowedCall>> {
        if self.list.is_empty() || !in_place_kind(call) {
            return Ok(None);
        }
        let (Some((si, so)), Some((ri, ro))) = (self.find(call.send, call.bytes), self.find(call.recv, call.bytes))
        else {
            return Ok(None);
        };
        // The peers' addresses come from their transports: an offset past the end of the
        // address space is a peer's error, not a panic.
        let at = |a: u64, offset: u64| {
            a.checked_add(offset)
                .ok_or_else(|| Error::protocol(format!("a peer's registration at {a:#x} cannot hold offset {offset}")))
        };
        let mut sends = [0; MAX_GPU_RANKS];
        for (s, a) in sends.iter_mut().zip(self.shared(si, core)?) {
            *s = at(*a, so)?;
        }
        let mut recvs = [0; MAX_GPU_RANKS];
        for (r, a) in recvs.iter_mut().zip(self.shared(ri, core)?) {
            *r = at(*a, ro)?;
        }
        let form = windowed_form(call.bytes, true, call.send == call.recv);
        Ok(Some(WindowedCall::published(form, sends, recvs)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(address: u64, len: usize) -> Arc<RegistrationState> {
        Arc::new(RegistrationState { range: UserRange { communicator: 1, address, len }, memory: None })
    }

    #[test]
    fn copy_only_registrations_are_kept_but_not_used() {
        let s = state(0x1000, 256);
        let mut r = Registrations::default();
        r.add(s.clone());
        assert_eq!(r.len(), 1);
        // Without transport memory (no direct kernels) a registration is kept but not used.
        assert_eq!(r.find(0x1000, 8), None);
        assert_eq!(r.remove(&s), Some(Vec::new()));
        assert_eq!(r.remove(&s), None, "removed twice");
        assert_eq!(r.len(), 0);
    }
}
