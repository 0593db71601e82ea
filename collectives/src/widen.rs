//! Reductions of FP8 elements, carried in a wide type ([`DataType::reduced_in`]): the inputs
//! are widened, the call runs on the wide elements with whatever the plan picks, and the result
//! is narrowed once (see [`crate::fp8`] for why that rounds once whatever the algorithm).
//! `exec/` runs the wide call; this module makes its buffers and brings its result back.

use crate::call::CollectiveCall;
use crate::dtype::Element;
use crate::table::Collective;

/// The element counts of the send and receive buffers of `collective` of `count` elements (per
/// rank where it has blocks) with root `root`, on rank `me` of `world` (receive 0 on a reduce's
/// non-root, which passes no receive buffer): the lengths a widened call converts, on host and
/// device buffers. `None` for a collective that does not reduce.
pub(crate) fn reduced_lengths(
    collective: Collective,
    count: usize,
    root: usize,
    world: usize,
    me: usize,
) -> Option<(usize, usize)> {
    match collective {
        Collective::AllReduce => Some((count, count)),
        Collective::ReduceScatter => Some((world.checked_mul(count)?, count)),
        Collective::Reduce => Some((count, if me == root { count } else { 0 })),
        _ => None,
    }
}

/// [`reduced_lengths`] of a host call.
fn host_lengths<T>(call: &CollectiveCall<T>, world: usize, me: usize) -> Option<(usize, usize)> {
    let count = match *call {
        CollectiveCall::AllReduce { count, .. }
        | CollectiveCall::ReduceScatter { count, .. }
        | CollectiveCall::Reduce { count, .. } => count,
        _ => return None,
    };
    reduced_lengths(call.collective().0, count, call.root().unwrap_or(0), world, me)
}

/// The wide copy of a reducing host call: its buffers, owned, and the call on them.
pub(crate) struct WideHostCall<W> {
    send: Vec<W>,
    recv: Vec<W>,
    /// The call on `send` and `recv`, out of place.
    pub(crate) call: CollectiveCall<W>,
}

impl<W: Element> WideHostCall<W> {
    /// The wide form of `call` (a reducing call) on rank `me` of `world`: its input widened,
    /// a zeroed wide output. Where the call's arguments failed validation (`valid` false) its
    /// buffers are not read: the wide call takes part with empty buffers and the same counts, as
    /// an invalid call does anyway. `None` for a call that does not reduce.
    ///
    /// # Safety
    /// When `valid`, `call`'s send pointer must be readable for its send length.
    pub(crate) unsafe fn new<T: Element>(
        call: &CollectiveCall<T>,
        world: usize,
        me: usize,
        valid: bool,
    ) -> Option<Self> {
        let (send_len, recv_len) = host_lengths(call, world, me)?;
        let (send_len, recv_len) = if valid { (send_len, recv_len) } else { (0, 0) };
        let (source, _) = call.buffers();
        // SAFETY: the caller guarantees `send_len` readable elements when valid (else 0).
        let input = unsafe { std::slice::from_raw_parts(source, send_len) };
        let send: Vec<W> = input.iter().map(|x| W::from_f64(x.to_f64())).collect();
        let mut recv = vec![W::default(); recv_len];
        let (s, r) = (send.as_ptr(), recv.as_mut_ptr());
        let call = match *call {
            CollectiveCall::AllReduce { count, op, .. } => CollectiveCall::AllReduce { send: s, recv: r, count, op },
            CollectiveCall::ReduceScatter { count, op, .. } => {
                CollectiveCall::ReduceScatter { send: s, recv: r, count, op }
            }
            CollectiveCall::Reduce { count, op, root, .. } => {
                CollectiveCall::Reduce { send: s, recv: r, count, op, root }
            }
            _ => return None,
        };
        Some(WideHostCall { send, recv, call })
    }

    /// Narrows the wide result into `call`'s receive buffer (each element rounded once).
    ///
    /// # Safety
    /// `call` is the call this one was made from, validated: its receive pointer writable for
    /// its receive length.
    pub(crate) unsafe fn narrow_into<T: Element>(self, call: &CollectiveCall<T>) {
        let (_, out) = call.buffers();
        // The input was fully widened before the wide call ran, so writing over it (in place)
        // is safe now.
        drop(self.send);
        for (i, w) in self.recv.iter().enumerate() {
            // SAFETY: `recv` has the call's receive length; the caller guarantees `out` is
            // writable for it.
            unsafe { out.add(i).write(T::from_f64(w.to_f64())) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp8::F8E4M3;
    use crate::op::ReduceOp;

    #[test]
    fn lengths_follow_the_collective_and_the_root() {
        let (s, r) = (std::ptr::null::<u8>(), std::ptr::null_mut::<u8>());
        let op = ReduceOp::Sum;
        let scatter = CollectiveCall::ReduceScatter { send: s, recv: r, count: 5, op };
        assert_eq!(host_lengths(&scatter, 4, 1), Some((20, 5)));
        let reduce = CollectiveCall::Reduce { send: s, recv: r, count: 5, op, root: 2 };
        assert_eq!(host_lengths(&reduce, 4, 2), Some((5, 5)));
        assert_eq!(host_lengths(&reduce, 4, 1), Some((5, 0)));
        assert_eq!(host_lengths(&CollectiveCall::AllGather { send: s, recv: r, count: 5 }, 4, 1), None);
        assert_eq!(reduced_lengths(Collective::ReduceScatter, usize::MAX, 0, 2, 0), None, "overflow");
    }

    #[test]
    fn widening_is_exact_and_narrowing_rounds_once_in_place() {
        let mut buf: Vec<F8E4M3> = [1.0, -2.5, 448.0, 0.015625].map(F8E4M3::from_f64).to_vec();
        let p = buf.as_mut_ptr();
        let call = CollectiveCall::AllReduce { send: p, recv: p, count: 4, op: ReduceOp::Sum };
        // SAFETY: `buf` holds the 4 elements, read then written.
        let mut wide = unsafe { WideHostCall::<f32>::new(&call, 2, 0, true) }.expect("a reducing call");
        assert_eq!(wide.send, [1.0, -2.5, 448.0, 0.015625]);
        // Stand-in for the collective: twice each input, plus 1 + 1/32 (rounds to nearest).
        wide.recv = wide.send.iter().map(|x| 2.0 * x + 1.03125).collect();
        // SAFETY: as above.
        unsafe { wide.narrow_into(&call) };
        let got: Vec<f64> = buf.iter().map(|x| x.to_f64()).collect();
        assert_eq!(got, [3.0, -4.0, 448.0, 1.0]);
    }
}
