//! The one description of a call that every executor takes: a collective with this rank's
//! buffers ([`CollectiveCall`]) or a group's point-to-point operations ([`P2pOp`]), the
//! buffers an algorithm works on ([`Buffers`]), and the signature every rank of a call must
//! share ([`signature`]).

#[cfg(feature = "cuda")]
use comm_core::ledger::CallSignature;

use comm_core::Error;

use crate::dtype::DataType;
use crate::op::ReduceOp;
use crate::table::{Algorithm, Collective};

/// One collective call with this rank's buffers: what every executor takes.
#[derive(Clone, Copy)]
pub(crate) enum CollectiveCall<T> {
    /// All-reduce `count` elements.
    AllReduce { send: *const T, recv: *mut T, count: usize, op: ReduceOp },
    /// All-gather `count` elements per rank.
    AllGather { send: *const T, recv: *mut T, count: usize },
    /// Reduce-scatter into `count` elements per rank.
    ReduceScatter { send: *const T, recv: *mut T, count: usize, op: ReduceOp },
    /// Broadcast `count` elements from `root`.
    Broadcast { send: *const T, recv: *mut T, count: usize, root: usize },
    /// Reduce `count` elements to `root`.
    Reduce { send: *const T, recv: *mut T, count: usize, op: ReduceOp, root: usize },
    /// All-to-all of `count` elements per pair.
    AllToAll { send: *const T, recv: *mut T, count: usize },
}

impl<T> CollectiveCall<T> {
    /// The collective this call runs, and its reduction where it has one.
    pub(crate) fn collective(&self) -> (Collective, Option<ReduceOp>) {
        match *self {
            CollectiveCall::AllReduce { op, .. } => (Collective::AllReduce, Some(op)),
            CollectiveCall::AllGather { .. } => (Collective::AllGather, None),
            CollectiveCall::ReduceScatter { op, .. } => (Collective::ReduceScatter, Some(op)),
            CollectiveCall::Broadcast { .. } => (Collective::Broadcast, None),
            CollectiveCall::Reduce { op, .. } => (Collective::Reduce, Some(op)),
            CollectiveCall::AllToAll { .. } => (Collective::AllToAll, None),
        }
    }

    /// The root of a rooted call.
    pub(crate) fn root(&self) -> Option<usize> {
        match *self {
            CollectiveCall::Broadcast { root, .. } | CollectiveCall::Reduce { root, .. } => Some(root),
            _ => None,
        }
    }

    /// The send and receive buffers.
    pub(crate) fn buffers(&self) -> (*const T, *mut T) {
        match *self {
            CollectiveCall::AllReduce { send, recv, .. }
            | CollectiveCall::AllGather { send, recv, .. }
            | CollectiveCall::ReduceScatter { send, recv, .. }
            | CollectiveCall::Broadcast { send, recv, .. }
            | CollectiveCall::Reduce { send, recv, .. }
            | CollectiveCall::AllToAll { send, recv, .. } => (send, recv),
        }
    }
}

/// The user's buffers of a call and its element count, as the collective defines it: what the
/// algorithms of every executor take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Buffers<T> {
    pub(crate) send: *const T,
    pub(crate) recv: *mut T,
    pub(crate) count: usize,
}

/// Packs what every rank must agree on into one word.
#[inline]
pub(crate) fn signature(c: Collective, dtype: DataType, op: Option<ReduceOp>, algo: Algorithm) -> u64 {
    // Each enum lists its variants in `ALL` in declaration order (tested below), so the
    // discriminant is the position `describe` looks up.
    let ci = c as u64 + 1;
    let di = dtype as u64 + 1;
    let oi = op.map_or(0, |o| o as u64 + 1);
    let ai = algo as u64 + 1;
    ci | di << 8 | oi << 16 | ai << 24
}

/// The call a signature stands for, in words (for error messages).
pub(crate) fn describe(sig: u64) -> String {
    let pick = |shift: u32| ((sig >> shift) & 0xff) as usize;
    let c = pick(0).checked_sub(1).and_then(|i| Collective::ALL.get(i)).map_or("?", |c| c.name());
    let d = pick(8).checked_sub(1).and_then(|i| DataType::ALL.get(i)).map_or("?", |d| d.name());
    let o = pick(16).checked_sub(1).and_then(|i| ReduceOp::ALL.get(i)).map_or("-", |o| o.name());
    let a = pick(24).checked_sub(1).and_then(|i| Algorithm::ALL.get(i)).map_or("?", |a| a.name());
    format!("{c}({d}, op {o}, algorithm {a})")
}

/// One operation of a group.
#[derive(Debug, Clone, Copy)]
pub(crate) enum P2pOp {
    /// Send `len` bytes at `data` to `peer`.
    Send { peer: usize, data: *const u8, len: usize },
    /// Receive exactly `len` bytes from `peer` into `data`.
    Recv { peer: usize, data: *mut u8, len: usize },
}

impl P2pOp {
    /// The peer of the operation.
    pub(crate) fn peer(&self) -> usize {
        match *self {
            P2pOp::Send { peer, .. } | P2pOp::Recv { peer, .. } => peer,
        }
    }

    /// Bytes the operation moves.
    pub(crate) fn len(&self) -> usize {
        match *self {
            P2pOp::Send { len, .. } | P2pOp::Recv { len, .. } => len,
        }
    }
}

/// One collective call on device buffers: what the GPU engine takes.
#[cfg(feature = "cuda")]
pub(crate) struct DeviceCall {
    pub(crate) collective: Collective,
    pub(crate) dtype: DataType,
    pub(crate) op: Option<ReduceOp>,
    pub(crate) send: u64,
    pub(crate) recv: u64,
    /// Elements (reducing kernels) — converted to bytes for data kernels.
    pub(crate) count: usize,
    pub(crate) root: usize,
    pub(crate) aux: [u64; 4],
    /// Bytes of the call, as the algorithm table measures them.
    pub(crate) bytes: usize,
}

#[cfg(feature = "cuda")]
impl DeviceCall {
    /// A call with root 0 and no counts arrays; `bytes` is what the algorithm table sees.
    pub(crate) fn new(
        collective: Collective,
        dtype: DataType,
        op: Option<ReduceOp>,
        (send, recv): (u64, u64),
        count: usize,
        bytes: usize,
    ) -> Self {
        DeviceCall { collective, dtype, op, send, recv, count, root: 0, aux: [0; 4], bytes }
    }

    /// A call of `collective` on `world` ranks with root `root` (0 where it has none), its bytes
    /// as the algorithm table measures them: `count` elements, or `world × count` for the
    /// collectives that move a block per rank.
    pub(crate) fn sized(
        collective: Collective,
        dtype: DataType,
        op: Option<ReduceOp>,
        buffers: (u64, u64),
        count: usize,
        root: usize,
        world: usize,
    ) -> Self {
        let per_rank = matches!(collective, Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll);
        // Saturating: the ledger and the plan read it; the caller checked the buffers' sizes.
        let bytes = count.saturating_mul(dtype.size()).saturating_mul(if per_rank { world } else { 1 });
        DeviceCall { root, ..DeviceCall::new(collective, dtype, op, buffers, count, bytes) }
    }

    /// The call in the ledger (queued on a stream: finished there once queued).
    pub(crate) fn signature(&self) -> CallSignature {
        let rooted = matches!(self.collective, Collective::Broadcast | Collective::Reduce);
        let root = rooted.then_some(self.root);
        CallSignature { device: true, ..CallSignature::host(self.collective.call_kind(), self.bytes, root) }
    }
}

/// One transfer of a device group (`Communicator::group_device_raw`): bytes at a device
/// address, sent to or received from a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceTransfer {
    /// Send `bytes` at `addr` to `peer`.
    Send {
        /// Device address of the data.
        addr: u64,
        /// Bytes to send.
        bytes: usize,
        /// The rank to send to.
        peer: usize,
    },
    /// Receive exactly `bytes` from `peer` into `addr`.
    Recv {
        /// Device address to write.
        addr: u64,
        /// Bytes to receive.
        bytes: usize,
        /// The rank to receive from.
        peer: usize,
    },
}

impl DeviceTransfer {
    /// The peer.
    pub fn peer(&self) -> usize {
        match *self {
            DeviceTransfer::Send { peer, .. } | DeviceTransfer::Recv { peer, .. } => peer,
        }
    }

    /// The bytes moved.
    pub fn bytes(&self) -> usize {
        match *self {
            DeviceTransfer::Send { bytes, .. } | DeviceTransfer::Recv { bytes, .. } => bytes,
        }
    }

    /// The device address.
    pub fn addr(&self) -> u64 {
        match *self {
            DeviceTransfer::Send { addr, .. } | DeviceTransfer::Recv { addr, .. } => addr,
        }
    }

    /// Whether it is a send.
    pub fn is_send(&self) -> bool {
        matches!(self, DeviceTransfer::Send { .. })
    }
}

/// The error of a call made while another call of the same communicator runs on this thread
/// (from a callback inside it): the first call holds the engine.
pub(crate) fn already_in_a_call() -> Error {
    Error::invalid("this communicator is already inside a call on this thread; calls cannot nest")
}

/// What a call of the channel algorithms is, host or device, as every rank must agree.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallSpec {
    pub(crate) collective: Collective,
    pub(crate) algorithm: Algorithm,
    pub(crate) dtype: DataType,
    pub(crate) op: Option<ReduceOp>,
    pub(crate) count: usize,
    pub(crate) root: usize,
    /// This rank's arguments were invalid: it takes part with no data and fails.
    pub(crate) invalid: bool,
    /// Which form of its collective the call takes (the channel message header's `variant`;
    /// 0 but for the steps of a hierarchical call that has several).
    pub(crate) variant: u8,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_number_every_variant_by_its_place_in_all() {
        assert!(Collective::ALL.iter().enumerate().all(|(i, &c)| c as usize == i));
        assert!(DataType::ALL.iter().enumerate().all(|(i, &d)| d as usize == i));
        assert!(ReduceOp::ALL.iter().enumerate().all(|(i, &o)| o as usize == i));
        assert!(Algorithm::ALL.iter().enumerate().all(|(i, &a)| a as usize == i));
        for (i, &a) in Algorithm::ALL.iter().enumerate() {
            let s = signature(Collective::Reduce, DataType::U8, None, a);
            assert!(describe(s).ends_with(&format!("algorithm {})", Algorithm::ALL[i].name())), "{}", describe(s));
        }
    }

    #[test]
    fn signatures_describe_themselves() {
        let s = signature(Collective::AllReduce, DataType::Bf16, Some(ReduceOp::Max), Algorithm::Ring);
        assert_eq!(describe(s), "all_reduce(bfloat16, op max, algorithm ring)");
        assert_ne!(s, signature(Collective::AllReduce, DataType::Bf16, Some(ReduceOp::Min), Algorithm::Ring));
    }
}
