//! Work requests on their way to the provider: a message's RDMA writes, split at the port's
//! message limit ([`split_writes`]), gathered on the stack in chains of up to [`MAX_CHAIN`]
//! ([`Chain`]), each chain one call into the provider ([`post_in_chains`]). Nothing here
//! allocates: a small message's requests never leave the stack.

use std::mem::MaybeUninit;

use comm_core::Result;
use comm_core::connection::CheckedWrite;

use crate::region::RemoteKey;
use crate::verbs::{MAX_CHAIN, Operation, WorkRequest};

/// Up to [`MAX_CHAIN`] work requests, kept on the stack (only the entries used are written).
pub(crate) struct Chain {
    /// The first `len` entries are initialized.
    requests: [MaybeUninit<WorkRequest>; MAX_CHAIN],
    len: usize,
}

impl Chain {
    /// An empty chain.
    pub(crate) fn new() -> Self {
        Chain { requests: [const { MaybeUninit::uninit() }; MAX_CHAIN], len: 0 }
    }

    /// Requests in the chain.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends `request`; `false` when the chain is full.
    pub(crate) fn push(&mut self, request: WorkRequest) -> bool {
        match self.requests.get_mut(self.len) {
            Some(slot) => {
                slot.write(request);
                self.len += 1;
                true
            }
            None => false,
        }
    }

    /// Forgets every entry (they are plain data: nothing to drop).
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// The requests pushed so far.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [WorkRequest] {
        let used = &mut self.requests[..self.len];
        // SAFETY: the first `len` entries were written by `push`; `MaybeUninit<T>` has `T`'s
        // layout.
        unsafe { &mut *(std::ptr::from_mut(used) as *mut [WorkRequest]) }
    }
}

/// How many requests [`split_writes`] makes of `len` bytes.
pub(crate) fn writes_needed(len: usize, max_msg_bytes: usize) -> usize {
    len.div_ceil(max_msg_bytes.max(1))
}

/// The RDMA writes of `write`, its source read under `lkey`, its destination the peer's
/// `remote`: one per `max_msg_bytes` (at least 1) or less, unsignaled, in order.
pub(crate) fn split_writes<'w>(
    write: &'w CheckedWrite<'_>,
    lkey: u32,
    remote: RemoteKey,
    max_msg_bytes: usize,
) -> impl Iterator<Item = WorkRequest> + 'w {
    let step = max_msg_bytes.max(1);
    (0..write.len).step_by(step).map(move |done| WorkRequest {
        wr_id: 0,
        op: Operation::Write,
        // Inside `write.src` (checked): host memory mapped here, or device memory the device
        // reads at its device address (so no host pointer arithmetic).
        local: write.src.as_ptr().wrapping_add(write.src_offset + done),
        len: (write.len - done).min(step) as u32,
        lkey,
        remote: remote.addr + (write.dst_offset + done) as u64,
        rkey: remote.rkey,
        signaled: false,
    })
}

/// Hands `requests` to `post` a full chain at a time, and the rest as a last, shorter one;
/// stops at the first failure and returns it.
pub(crate) fn post_in_chains(
    requests: impl IntoIterator<Item = WorkRequest>,
    mut post: impl FnMut(&mut [WorkRequest]) -> Result<()>,
) -> Result<()> {
    let mut chain = Chain::new();
    for request in requests {
        if chain.push(request) {
            continue;
        }
        post(chain.as_mut_slice())?;
        chain.clear();
        chain.push(request);
    }
    if chain.len() > 0 {
        post(chain.as_mut_slice())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm_core::Error;
    use comm_core::memory::{HeapRegion, MemoryRegion, RegisteredMemory};

    fn host(len: usize) -> RegisteredMemory {
        let region: std::sync::Arc<dyn MemoryRegion> = std::sync::Arc::new(HeapRegion::new(len).unwrap());
        RegisteredMemory::new_local(comm_core::testing::descriptor(0, len), region, crate::transport()).unwrap()
    }

    #[test]
    fn writes_split_at_the_message_limit_cover_the_range_in_order() {
        let (dst, src) = (host(64), host(64));
        let write = CheckedWrite::new(&dst, 3, &src, 5, 10).unwrap();
        let remote = RemoteKey { addr: 1 << 20, rkey: 7, id: 1 };
        let requests: Vec<WorkRequest> = split_writes(&write, 9, remote, 4).collect();
        assert_eq!(requests.len(), writes_needed(10, 4));
        let lens: Vec<u32> = requests.iter().map(|r| r.len).collect();
        assert_eq!(lens, [4, 4, 2]);
        for (i, r) in requests.iter().enumerate() {
            assert_eq!(r.remote, (1 << 20) + 3 + 4 * i as u64);
            assert_eq!(r.local, src.as_ptr().wrapping_add(5 + 4 * i).cast_const());
            assert_eq!((r.lkey, r.rkey, r.op, r.signaled), (9, 7, Operation::Write, false));
        }
        let one: Vec<WorkRequest> = split_writes(&write, 9, remote, 1 << 30).collect();
        assert_eq!((one.len(), one[0].len), (1, 10));
        let empty = CheckedWrite::new(&dst, 0, &src, 0, 0).unwrap();
        assert_eq!(split_writes(&empty, 9, remote, 4).count(), writes_needed(0, 4));
    }

    #[test]
    fn requests_are_posted_a_full_chain_at_a_time_and_a_failure_stops_them() {
        let (dst, src) = (host(4096), host(4096));
        let remote = RemoteKey { addr: 0, rkey: 1, id: 1 };
        for (len, chains) in [(20usize, vec![8, 8, 4]), (16, vec![8, 8]), (3, vec![3]), (0, vec![])] {
            let write = CheckedWrite::new(&dst, 0, &src, 0, len).unwrap();
            let mut seen = Vec::new();
            let mut next = 0u64;
            post_in_chains(split_writes(&write, 2, remote, 1), |chain| {
                for r in chain.iter() {
                    assert_eq!(r.remote, next, "requests keep their order across chains");
                    next += 1;
                }
                seen.push(chain.len());
                Ok(())
            })
            .unwrap();
            assert_eq!(seen, chains, "{len} requests");
        }
        let write = CheckedWrite::new(&dst, 0, &src, 0, 20).unwrap();
        let mut calls = 0;
        let e = post_in_chains(split_writes(&write, 2, remote, 1), |_| {
            calls += 1;
            if calls == 2 { Err(Error::invalid("refused")) } else { Ok(()) }
        })
        .unwrap_err();
        assert!(e.to_string().contains("refused"), "{e}");
        assert_eq!(calls, 2, "no chain is posted after a failure");
    }
}
