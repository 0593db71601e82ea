//! The collectives correctness matrix: every collective × dtype × op × count, in place and out
//! of place, checked against a reference computed in `f64` from inputs every rank can
//! recompute.
//!
//! Inputs are small integers, so sums and products are exact in every type; integer results
//! are compared exactly (wrapping arithmetic included), floating-point results within
//! [`tolerance`]: `f64` 1e-12, `f32` 1e-6, `f16` 1e-3 and `bf16` 8e-3, relative (absolute
//! below 1), and only `avg` rounds. FP8 sums exceed the integers FP8 holds exactly (16 in
//! e4m3, 8 in e5m2); as weave rounds an FP8 reduction once, its results are compared exactly
//! with the exact result rounded to the type.

use collectives::{Communicator, DataType, Element, ForEachElement, ReduceOp};
use comm_core::{Error, Result};

/// What to run.
#[derive(Debug, Clone)]
pub struct MatrixSpec {
    /// Element types.
    pub dtypes: Vec<DataType>,
    /// Reduction operators (for the reducing collectives).
    pub ops: Vec<ReduceOp>,
    /// Element counts per rank (per block for the block collectives).
    pub counts: Vec<usize>,
    /// Extra large count, run only for these (dtype, op) pairs.
    pub large: Option<(usize, Vec<(DataType, ReduceOp)>)>,
}

impl MatrixSpec {
    /// The dtypes the matrix runs: every type but `u64`, `u32` and `i8`, left out to keep the
    /// matrix short (their sizes are those of `i64`, `i32` and `u8`, which it runs).
    pub fn dtypes() -> Vec<DataType> {
        DataType::ALL.into_iter().filter(|d| !matches!(d, DataType::U64 | DataType::U32 | DataType::I8)).collect()
    }

    /// The reduced matrix CI runs.
    pub fn ci() -> Self {
        MatrixSpec {
            dtypes: Self::dtypes(),
            ops: ReduceOp::ALL.to_vec(),
            counts: vec![0, 1, 7, 1023, 65536 + 3],
            large: Some(((4 << 20) + 5, vec![(DataType::F32, ReduceOp::Sum), (DataType::Bf16, ReduceOp::Max)])),
        }
    }

    /// The full matrix (`cargo xtask test --long`).
    pub fn long() -> Self {
        let mut large = Vec::new();
        for d in DataType::ALL {
            for o in ReduceOp::ALL {
                large.push((d, o));
            }
        }
        MatrixSpec {
            dtypes: DataType::ALL.to_vec(),
            ops: ReduceOp::ALL.to_vec(),
            counts: vec![0, 1, 7, 1023, 65536 + 3],
            large: Some(((4 << 20) + 5, large)),
        }
    }
}

/// Relative tolerance for a dtype.
pub fn tolerance(d: DataType) -> f64 {
    match d {
        DataType::F64 => 1e-12,
        DataType::F32 => 1e-6,
        DataType::F16 => 1e-3,
        DataType::Bf16 => 8e-3,
        _ => 0.0,
    }
}

fn unsigned(d: DataType) -> bool {
    matches!(d, DataType::U8 | DataType::U32 | DataType::U64)
}

/// The input element `i` of rank `rank` for `op` (small integers; products stay tiny: only the
/// first 16 ranks contribute factors of 2, so a product is at most 16 in magnitude in any
/// world).
pub fn input(d: DataType, op: ReduceOp, rank: usize, i: usize) -> f64 {
    if op == ReduceOp::Prod {
        let factors: [f64; 4] = if rank < 16 { [1.0, 2.0, -1.0, 1.0] } else { [1.0, -1.0, 1.0, 1.0] };
        let v = factors[(rank + i) % 4];
        if unsigned(d) { v.abs() } else { v }
    } else {
        let v = ((rank * 7 + i * 13) % 11) as f64;
        if unsigned(d) { v } else { v - 3.0 }
    }
}

/// The reference reduction of `vals` in type `T`.
pub fn reference<T: Element>(op: ReduceOp, vals: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = vals.collect();
    let n = v.len() as f64;
    let exact = match op {
        ReduceOp::Sum | ReduceOp::Avg => v.iter().sum(),
        ReduceOp::Prod => v.iter().product(),
        ReduceOp::Min => v.iter().cloned().fold(f64::INFINITY, f64::min),
        ReduceOp::Max => v.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    };
    if op != ReduceOp::Avg {
        return T::from_f64(exact).to_f64();
    }
    if T::DTYPE.size() == 1 && T::DTYPE.is_float() {
        // FP8 is reduced in a wide type and rounded once: compared exactly, rounded alike.
        T::from_f64(exact / n).to_f64()
    } else if T::DTYPE.is_float() {
        exact / n
    } else {
        // Integers: the wrapped sum, divided with truncation.
        (T::from_f64(exact).to_f64() / n).trunc()
    }
}

/// Checks `got` against `want(i)` within the dtype's tolerance, naming the first bad element.
pub fn compare<T: Element>(what: &str, got: &[T], want: impl Fn(usize) -> f64) -> Result<()> {
    let tol = tolerance(T::DTYPE);
    for (i, g) in got.iter().enumerate() {
        let w = want(i);
        let g = g.to_f64();
        let ok = if tol == 0.0 { g == w } else { (g - w).abs() <= tol * w.abs().max(1.0) };
        if !ok {
            return Err(Error::protocol(format!("{what}: element {i} is {g}, expected {w}")));
        }
    }
    Ok(())
}

/// `len` inputs of `rank` for `op` (see [`input`]).
pub fn fill<T: Element>(d: DataType, op: ReduceOp, rank: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| T::from_f64(input(d, op, rank, i))).collect()
}

/// Runs one dtype's share of the matrix; returns the number of checked calls.
fn run_typed<T: Element>(comm: &Communicator, spec: &MatrixSpec) -> Result<usize> {
    let (me, n) = (comm.rank(), comm.world_size());
    let d = T::DTYPE;
    let mut cases: Vec<(usize, ReduceOp)> = Vec::new();
    for &c in &spec.counts {
        for &op in &spec.ops {
            cases.push((c, op));
        }
    }
    if let Some((big, pairs)) = &spec.large {
        for &(pd, op) in pairs {
            if pd == d {
                cases.push((*big, op));
            }
        }
    }
    let mut checked = 0;
    for (count, op) in cases {
        let tag = |c: &str| format!("{c} {} {} count {count} on {n} ranks (rank {me})", d.name(), op.name());
        let sum_all = |idx: usize| reference::<T>(op, (0..n).map(|r| input(d, op, r, idx)));

        // all_reduce, out of place and in place.
        let send = fill::<T>(d, op, me, count);
        let mut recv = vec![T::default(); count];
        comm.all_reduce(&send, &mut recv, op)?;
        compare(&tag("all_reduce"), &recv, sum_all)?;
        let mut buf = send.clone();
        comm.all_reduce_in_place(&mut buf, op)?;
        compare(&tag("all_reduce in place"), &buf, sum_all)?;

        // reduce_scatter: send holds n blocks of `count`.
        let send = fill::<T>(d, op, me, n * count);
        let mut recv = vec![T::default(); count];
        comm.reduce_scatter(&send, &mut recv, op)?;
        compare(&tag("reduce_scatter"), &recv, |i| sum_all(me * count + i))?;
        let mut buf = send.clone();
        comm.reduce_scatter_in_place(&mut buf, op)?;
        compare(&tag("reduce_scatter in place"), &buf[me * count..(me + 1) * count], |i| sum_all(me * count + i))?;

        // reduce to a root that moves with the count.
        let root = count % n;
        let send = fill::<T>(d, op, me, count);
        let mut recv = if me == root { vec![T::default(); count] } else { Vec::new() };
        comm.reduce(&send, &mut recv, op, root)?;
        if me == root {
            compare(&tag("reduce"), &recv, sum_all)?;
        }
        let mut buf = send.clone();
        comm.reduce_in_place(&mut buf, op, root)?;
        if me == root {
            compare(&tag("reduce in place"), &buf, sum_all)?;
        } else {
            compare(&tag("reduce in place (non-root untouched)"), &buf, |i| T::from_f64(input(d, op, me, i)).to_f64())?;
        }
        checked += 6;

        if op != spec.ops[0] {
            continue; // the data-movement collectives do not depend on the operator
        }
        let own = |r: usize, i: usize| T::from_f64(input(d, op, r, i)).to_f64();

        // all_gather.
        let send = fill::<T>(d, op, me, count);
        let mut recv = vec![T::default(); n * count];
        comm.all_gather(&send, &mut recv)?;
        compare(&tag("all_gather"), &recv, |j| own(j / count.max(1), j % count.max(1)))?;
        let mut buf = vec![T::default(); n * count];
        buf[me * count..(me + 1) * count].copy_from_slice(&send);
        comm.all_gather_in_place(&mut buf)?;
        compare(&tag("all_gather in place"), &buf, |j| own(j / count.max(1), j % count.max(1)))?;

        // broadcast.
        let root = (count / 2) % n;
        let send = if me == root { fill::<T>(d, op, me, count) } else { Vec::new() };
        let mut recv = vec![T::default(); count];
        comm.broadcast(&send, &mut recv, root)?;
        compare(&tag("broadcast"), &recv, |i| own(root, i))?;
        let mut buf = if me == root { fill::<T>(d, op, me, count) } else { vec![T::default(); count] };
        comm.broadcast_in_place(&mut buf, root)?;
        compare(&tag("broadcast in place"), &buf, |i| own(root, i))?;

        // all_to_all: block q of rank p's send holds input(p, q*count + i).
        let send = fill::<T>(d, op, me, n * count);
        let mut recv = vec![T::default(); n * count];
        comm.all_to_all(&send, &mut recv)?;
        let want = |j: usize| own(j / count.max(1), me * count + j % count.max(1));
        compare(&tag("all_to_all"), &recv, want)?;
        let mut buf = send.clone();
        comm.all_to_all_in_place(&mut buf)?;
        compare(&tag("all_to_all in place"), &buf, want)?;
        checked += 6;

        // all_to_allv with pseudo-random splits (some empty), the same table on every rank.
        let split = |p: usize, q: usize| -> usize {
            let h = (p * 31 + q * 17 + count * 7) % 5;
            if h == 0 { 0 } else { (count * h) / 4 + h }
        };
        let send_counts: Vec<usize> = (0..n).map(|q| split(me, q)).collect();
        let recv_counts: Vec<usize> = (0..n).map(|p| split(p, me)).collect();
        let displs = |counts: &[usize], gap: usize| -> Vec<usize> {
            let mut at = 0;
            counts
                .iter()
                .map(|c| {
                    let here = at;
                    at += c + gap;
                    here
                })
                .collect()
        };
        let send_displs = displs(&send_counts, 1);
        let recv_displs = displs(&recv_counts, 2);
        let send_len = send_displs.last().map_or(0, |d| d + send_counts[n - 1] + 1);
        let recv_len = recv_displs.last().map_or(0, |d| d + recv_counts[n - 1] + 2);
        let send = fill::<T>(d, op, me, send_len);
        let mut recv = vec![T::default(); recv_len];
        comm.all_to_allv(&send, &send_counts, &send_displs, &mut recv, &recv_counts, &recv_displs)?;
        for p in 0..n {
            let sender_displs = displs(&(0..n).map(|q| split(p, q)).collect::<Vec<_>>(), 1);
            let block = &recv[recv_displs[p]..recv_displs[p] + recv_counts[p]];
            compare(&tag(&format!("all_to_allv block from rank {p}")), block, |i| own(p, sender_displs[me] + i))?;
        }
        checked += 1;
    }
    Ok(checked)
}

/// The matrix on one element type (see [`run_typed`]).
struct TypedMatrix<'a> {
    comm: &'a Communicator,
    spec: &'a MatrixSpec,
}

impl ForEachElement for TypedMatrix<'_> {
    type Output = Result<usize>;
    fn run<T: Element>(self) -> Result<usize> {
        run_typed::<T>(self.comm, self.spec)
    }
}

/// Runs the matrix on every dtype of `spec`; returns the number of checked calls.
pub fn run_matrix(comm: &Communicator, spec: &MatrixSpec) -> Result<usize> {
    let mut total = 0;
    for &d in &spec.dtypes {
        total += d.run(TypedMatrix { comm, spec })?;
    }
    Ok(total)
}
