//! Host reduction kernels: combine several source arrays into one, block by block, in loops the
//! compiler vectorizes. Half-precision types and e4m3 accumulate in `f32`, e5m2 in `f64`, and
//! round once at the end.

use half::{bf16, f16};

use crate::fp8::{F8E4M3, F8E5M2};
use crate::op::ReduceOp;

/// Elements per block: the accumulator of one block stays in L1.
const BLOCK: usize = 1024;
/// Elements that short reductions take one at a time, without an accumulator block.
const TINY: usize = 8;
/// Elements per block for short reductions: smaller accumulators to initialize per call.
const SMALL_BLOCKS: [usize; 2] = [64, 256];

/// Arithmetic on the type sums and products are accumulated in.
pub trait Accumulator: Copy + Default + PartialOrd {
    /// `a + b` (wrapping for integers).
    fn add(a: Self, b: Self) -> Self;
    /// `a * b` (wrapping for integers).
    fn mul(a: Self, b: Self) -> Self;
    /// `a / n` (truncating for integers).
    fn div(a: Self, n: usize) -> Self;
    /// The smaller of `a` and `b`.
    #[inline(always)]
    fn min(a: Self, b: Self) -> Self {
        if b < a { b } else { a }
    }
    /// The larger of `a` and `b`.
    #[inline(always)]
    fn max(a: Self, b: Self) -> Self {
        if b > a { b } else { a }
    }
}

/// Per-type conversions behind the kernels: to and from the accumulator, whose [`Accumulator`]
/// arithmetic does the rest.
pub trait Arith: Copy + Default + PartialOrd + Send + Sync + 'static {
    /// The type sums and products are accumulated in.
    type Acc: Accumulator;
    /// Widens to the accumulator.
    fn load(self) -> Self::Acc;
    /// Narrows from the accumulator.
    fn store(acc: Self::Acc) -> Self;
}

macro_rules! float_accumulator {
    ($t:ty) => {
        impl Accumulator for $t {
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a + b
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a * b
            }
            #[inline(always)]
            fn div(a: $t, n: usize) -> $t {
                a / n as $t
            }
        }
    };
}
float_accumulator!(f32);
float_accumulator!(f64);

macro_rules! int_accumulator {
    ($t:ty) => {
        impl Accumulator for $t {
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn div(a: $t, n: usize) -> $t {
                (a as i128 / n.max(1) as i128) as $t
            }
        }
    };
}
int_accumulator!(i64);
int_accumulator!(i32);
int_accumulator!(u64);
int_accumulator!(u32);
int_accumulator!(i8);
int_accumulator!(u8);

/// Types accumulated as themselves.
macro_rules! own_accumulator {
    ($t:ty) => {
        impl Arith for $t {
            type Acc = $t;
            #[inline(always)]
            fn load(self) -> $t {
                self
            }
            #[inline(always)]
            fn store(a: $t) -> $t {
                a
            }
        }
    };
}
own_accumulator!(f32);
own_accumulator!(f64);
own_accumulator!(i64);
own_accumulator!(i32);
own_accumulator!(u64);
own_accumulator!(u32);
own_accumulator!(i8);
own_accumulator!(u8);

/// Half-precision types: accumulated in `f32`, rounded once at the end.
macro_rules! f32_accumulator {
    ($t:ty) => {
        impl Arith for $t {
            type Acc = f32;
            #[inline(always)]
            fn load(self) -> f32 {
                self.to_f32()
            }
            #[inline(always)]
            fn store(a: f32) -> $t {
                <$t>::from_f32(a)
            }
        }
    };
}
f32_accumulator!(f16);
f32_accumulator!(bf16);
f32_accumulator!(F8E4M3);

impl Arith for F8E5M2 {
    // f64: sums of e5m2 values are exact there (see crate::fp8).
    type Acc = f64;
    #[inline(always)]
    fn load(self) -> f64 {
        self.to_f64()
    }
    #[inline(always)]
    fn store(a: f64) -> F8E5M2 {
        F8E5M2::from_f64(a)
    }
}

#[inline(always)]
fn fold_block<T: Arith>(acc: &mut [T::Acc], src: &[T], f: impl Fn(T::Acc, T::Acc) -> T::Acc) {
    for (a, s) in acc.iter_mut().zip(src) {
        *a = f(*a, s.load());
    }
}

/// `out[i] = op(srcs[0][i], srcs[1][i], …)` for `i < len`; `Avg` divides by `divisor`.
///
/// `out` may alias any source exactly (in-place reduction): each block is read from every
/// source before it is written.
///
/// # Safety
/// Every pointer must be valid for `len` elements (reads for sources, writes for `out`) and
/// properly aligned for `T`; no other thread or process may write these ranges during the call.
/// `out` may overlap a source only if they are the same range.
#[inline(always)]
pub unsafe fn reduce_raw<T: Arith>(op: ReduceOp, divisor: usize, out: *mut T, srcs: &[*const T], len: usize) {
    // SAFETY: forwarded from the caller; no second output.
    unsafe { reduce_raw2(op, divisor, out, std::ptr::null_mut(), srcs, len) }
}

/// [`reduce_raw`] writing the result to two places in one pass (`out2` may be null): saves
/// re-reading the result when it is needed both in the caller's buffer and in shared scratch.
///
/// # Safety
/// As [`reduce_raw`]; `out2`, when not null, valid for `len` writes and disjoint from every
/// source and from `out`.
#[inline(always)]
pub unsafe fn reduce_raw2<T: Arith>(
    op: ReduceOp,
    divisor: usize,
    out: *mut T,
    out2: *mut T,
    srcs: &[*const T],
    len: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if len <= TINY {
            match op {
                ReduceOp::Sum => reduce_each(None, out, out2, srcs, len, Accumulator::add),
                ReduceOp::Avg => reduce_each(Some(divisor), out, out2, srcs, len, Accumulator::add),
                ReduceOp::Prod => reduce_each(None, out, out2, srcs, len, Accumulator::mul),
                ReduceOp::Min => reduce_each(None, out, out2, srcs, len, Accumulator::min),
                ReduceOp::Max => reduce_each(None, out, out2, srcs, len, Accumulator::max),
            }
        } else {
            reduce_blocked(op, divisor, out, out2, srcs, len)
        }
    }
}

/// [`reduce_raw2`] of more than [`TINY`] elements, in blocks (out of line: the tiny case
/// inlines where it is called, this one would bloat every caller).
///
/// # Safety
/// As [`reduce_raw2`].
#[inline(never)]
unsafe fn reduce_blocked<T: Arith>(
    op: ReduceOp,
    divisor: usize,
    out: *mut T,
    out2: *mut T,
    srcs: &[*const T],
    len: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        if len <= SMALL_BLOCKS[0] {
            reduce_blocks::<T, { SMALL_BLOCKS[0] }>(op, divisor, out, out2, srcs, len)
        } else if len <= SMALL_BLOCKS[1] {
            reduce_blocks::<T, { SMALL_BLOCKS[1] }>(op, divisor, out, out2, srcs, len)
        } else {
            reduce_blocks::<T, BLOCK>(op, divisor, out, out2, srcs, len)
        }
    }
}

/// [`reduce_raw2`] of a few elements, one at a time across the sources (no accumulator block
/// to set up and copy out); `Avg` divides by `divisor` when given.
///
/// # Safety
/// As [`reduce_raw2`].
#[inline(always)]
unsafe fn reduce_each<T: Arith>(
    divisor: Option<usize>,
    out: *mut T,
    out2: *mut T,
    srcs: &[*const T],
    len: usize,
    f: impl Fn(T::Acc, T::Acc) -> T::Acc,
) {
    let Some((&first, rest)) = srcs.split_first() else { return };
    for i in 0..len {
        // SAFETY: the caller guarantees every source is valid for `len` reads and `out` (and
        // `out2` when not null) for `len` writes; i < len. Element i of every source is read
        // before element i of `out` is written, so an `out` that is a source works.
        unsafe {
            let mut a = first.add(i).read().load();
            for &src in rest {
                a = f(a, src.add(i).read().load());
            }
            if let Some(d) = divisor {
                a = Accumulator::div(a, d);
            }
            let v = T::store(a);
            out.add(i).write(v);
            if !out2.is_null() {
                out2.add(i).write(v);
            }
        }
    }
}

/// [`reduce_raw2`] with an accumulator of `B` elements.
///
/// # Safety
/// As [`reduce_raw2`].
#[inline(always)]
unsafe fn reduce_blocks<T: Arith, const B: usize>(
    op: ReduceOp,
    divisor: usize,
    out: *mut T,
    out2: *mut T,
    srcs: &[*const T],
    len: usize,
) {
    let Some((&first, rest)) = srcs.split_first() else { return };
    let mut acc = [T::Acc::default(); B];
    let mut done = 0;
    while done < len {
        let n = B.min(len - done);
        let acc = &mut acc[..n];
        {
            // SAFETY: the caller guarantees `first` is valid for `len` reads; done + n <= len.
            let s0 = unsafe { std::slice::from_raw_parts(first.add(done), n) };
            for (a, s) in acc.iter_mut().zip(s0) {
                *a = s.load();
            }
            for &src in rest {
                // SAFETY: as above for every source; the slice is dropped before `out` is written.
                let s = unsafe { std::slice::from_raw_parts(src.add(done), n) };
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => fold_block(acc, s, Accumulator::add),
                    ReduceOp::Prod => fold_block(acc, s, Accumulator::mul),
                    ReduceOp::Min => fold_block(acc, s, Accumulator::min),
                    ReduceOp::Max => fold_block(acc, s, Accumulator::max),
                }
            }
        }
        if op == ReduceOp::Avg {
            for a in acc.iter_mut() {
                *a = Accumulator::div(*a, divisor);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            let v = T::store(*a);
            // SAFETY: the caller guarantees `out` (and `out2` when not null) is valid for `len`
            // writes; done + j < len. No reference into the sources is alive here.
            unsafe {
                out.add(done + j).write(v);
                if !out2.is_null() {
                    out2.add(done + j).write(v);
                }
            }
        }
        done += n;
    }
}

/// Safe form of [`reduce_raw`] for distinct slices: `out = op(srcs…)`.
///
/// Lengths are not checked here beyond `debug_assert`; the shortest length wins.
pub fn reduce_slices<T: Arith>(op: ReduceOp, divisor: usize, out: &mut [T], srcs: &[&[T]]) {
    let len = srcs.iter().map(|s| s.len()).min().unwrap_or(0).min(out.len());
    let ptrs: Vec<*const T> = srcs.iter().map(|s| s.as_ptr()).collect();
    // SAFETY: every slice is valid for `len` elements; `out` is an exclusive borrow, so it cannot
    // overlap the shared source slices.
    unsafe { reduce_raw(op, divisor, out.as_mut_ptr(), &ptrs, len) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Element;

    fn check<T: Arith + Element>(op: ReduceOp, inputs: &[Vec<f64>], want: impl Fn(&[f64]) -> f64, tol: f64) {
        let srcs: Vec<Vec<T>> = inputs.iter().map(|v| v.iter().map(|&x| T::from_f64(x)).collect()).collect();
        let refs: Vec<&[T]> = srcs.iter().map(|v| v.as_slice()).collect();
        let len = inputs[0].len();
        let mut out = vec![T::default(); len];
        reduce_slices(op, inputs.len(), &mut out, &refs);
        for i in 0..len {
            let column: Vec<f64> = srcs.iter().map(|v| v[i].to_f64()).collect();
            let w = want(&column);
            let got = out[i].to_f64();
            assert!((got - w).abs() <= tol * w.abs().max(1.0), "{:?} {op:?} at {i}: {got} vs {w}", T::DTYPE);
        }
    }

    fn inputs(ranks: usize, len: usize) -> Vec<Vec<f64>> {
        (0..ranks).map(|r| (0..len).map(|i| ((i * 7 + r * 13) % 23) as f64 - 5.0).collect()).collect()
    }

    #[test]
    fn every_op_on_every_type_matches_the_reference() {
        let ins = inputs(5, 3 * BLOCK + 17);
        type Reference = fn(&[f64]) -> f64;
        let ops: [(ReduceOp, Reference); 5] = [
            (ReduceOp::Sum, |c| c.iter().sum()),
            (ReduceOp::Prod, |c| c.iter().product()),
            (ReduceOp::Min, |c| c.iter().cloned().fold(f64::INFINITY, f64::min)),
            (ReduceOp::Max, |c| c.iter().cloned().fold(f64::NEG_INFINITY, f64::max)),
            (ReduceOp::Avg, |c| c.iter().sum::<f64>() / c.len() as f64),
        ];
        for (op, f) in ops {
            check::<f64>(op, &ins, f, 1e-12);
            check::<f32>(op, &ins, f, 1e-6);
            check::<f16>(op, &ins, f, 1e-3);
            check::<bf16>(op, &ins, f, 1e-2);
            if op != ReduceOp::Avg {
                check::<i64>(op, &ins, f, 0.0);
                check::<i32>(op, &ins, f, 0.0);
            }
        }
        // Unsigned and narrow types on non-negative data.
        let pos: Vec<Vec<f64>> = ins.iter().map(|v| v.iter().map(|x| x + 5.0).collect()).collect();
        for (op, f) in ops {
            if op == ReduceOp::Avg || op == ReduceOp::Prod {
                continue;
            }
            check::<u64>(op, &pos, f, 0.0);
            check::<u32>(op, &pos, f, 0.0);
            check::<u8>(op, &pos, f, 0.0);
        }
    }

    #[test]
    fn every_accumulator_size_and_its_edges_match_the_reference() {
        for len in [0, 1, 2, 7, 8, 9, 63, 64, 65, 255, 256, 257, 1023, 1024, 1025] {
            let ins = inputs(3, len);
            check::<f32>(ReduceOp::Sum, &ins, |c| c.iter().sum(), 1e-6);
            check::<i32>(ReduceOp::Max, &ins, |c| c.iter().cloned().fold(f64::NEG_INFINITY, f64::max), 0.0);
            check::<f16>(ReduceOp::Avg, &ins, |c| c.iter().sum::<f64>() / c.len() as f64, 1e-3);
        }
    }

    #[test]
    fn every_op_on_every_type_matches_the_reference_one_element_at_a_time() {
        for len in [1, 3, TINY] {
            let ins = inputs(4, len);
            check::<f64>(ReduceOp::Prod, &ins, |c| c.iter().product(), 1e-12);
            check::<f32>(ReduceOp::Min, &ins, |c| c.iter().cloned().fold(f64::INFINITY, f64::min), 0.0);
            check::<bf16>(ReduceOp::Avg, &ins, |c| c.iter().sum::<f64>() / c.len() as f64, 1e-2);
            check::<i64>(ReduceOp::Sum, &ins, |c| c.iter().sum(), 0.0);
            check::<i32>(ReduceOp::Max, &ins, |c| c.iter().cloned().fold(f64::NEG_INFINITY, f64::max), 0.0);
        }
        // In place and to two outputs, as the host all-reduce does.
        let mut a = [1.0f32, 2.0, 3.0];
        let b = [10.0f32, 20.0, 30.0];
        let mut second = [0.0f32; 3];
        let p = a.as_mut_ptr();
        // SAFETY: every array holds 3 elements; `out` aliases the first source exactly and
        // `out2` is disjoint from both.
        unsafe { reduce_raw2(ReduceOp::Sum, 2, p, second.as_mut_ptr(), &[p as *const f32, b.as_ptr()], 3) };
        assert_eq!((a, second), ([11.0, 22.0, 33.0], [11.0, 22.0, 33.0]));
    }

    #[test]
    fn integer_overflow_wraps_and_avg_truncates() {
        let mut out = [0u8; 1];
        reduce_slices(ReduceOp::Sum, 2, &mut out, &[&[200u8], &[100u8]]);
        assert_eq!(out[0], 44);
        let mut out = [0i32; 1];
        reduce_slices(ReduceOp::Avg, 2, &mut out, &[&[7i32], &[0i32]]);
        assert_eq!(out[0], 3);
        let mut out = [0i8; 1];
        reduce_slices(ReduceOp::Avg, 200, &mut out, &[&[-100i8], &[-100i8]]);
        assert_eq!(out[0], 0);
    }

    #[test]
    fn in_place_reduction_through_raw_pointers() {
        let mut a: Vec<f32> = (0..5000).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..5000).map(|i| 2.0 * i as f32).collect();
        let p = a.as_mut_ptr();
        // SAFETY: both vectors hold 5000 elements; `out` aliases the first source exactly.
        unsafe { reduce_raw(ReduceOp::Sum, 2, p, &[p as *const f32, b.as_ptr()], 5000) };
        assert!(a.iter().enumerate().all(|(i, &x)| x == 3.0 * i as f32));
    }
}
