//! Checks of the arguments of host calls: buffer lengths that must match or split evenly, and
//! the blocks of an all-to-all-v. Every failure is an `InvalidArgument` that names the call.

use comm_core::{Error, Result};

/// `Err` naming both buffers unless `la == lb`.
#[inline(always)]
pub(crate) fn same_len(what: &str, a: &str, la: usize, b: &str, lb: usize) -> Result<()> {
    if la != lb {
        return Err(lengths_differ(what, (a, la), (b, lb)));
    }
    Ok(())
}

/// The error of [`same_len`], kept off the path of every call.
#[cold]
#[inline(never)]
fn lengths_differ(what: &str, (a, la): (&str, usize), (b, lb): (&str, usize)) -> Error {
    Error::invalid(format!("{what}: {a} has {la} elements but {b} has {lb}; they must be equal"))
}

/// `Err` unless a buffer of `len` elements splits into `n` equal blocks.
pub(crate) fn divisible(what: &str, len: usize, n: usize) -> Result<()> {
    if !len.is_multiple_of(n) {
        return Err(Error::invalid(format!("{what}: buffer of {len} elements does not split into {n} equal blocks")));
    }
    Ok(())
}

/// Checks one side of an all-to-all-v: one count and displacement per rank, every block inside
/// the `len`-element buffer, and (`disjoint`: the receive side) no two blocks overlapping.
pub(crate) fn check_v(
    what: &str,
    len: usize,
    counts: &[usize],
    displs: &[usize],
    n: usize,
    disjoint: bool,
) -> Result<()> {
    if counts.len() != n || displs.len() != n {
        return Err(Error::invalid(format!(
            "all_to_allv: {what} counts ({}) and displacements ({}) must have one entry per rank ({n})",
            counts.len(),
            displs.len()
        )));
    }
    let mut blocks = Vec::with_capacity(n);
    for q in 0..n {
        let end = displs[q].checked_add(counts[q]).filter(|&e| e <= len).ok_or_else(|| {
            Error::invalid(format!(
                "all_to_allv: {what} block for rank {q} ({} elements at {}) runs past the {len}-element buffer",
                counts[q], displs[q]
            ))
        })?;
        if counts[q] > 0 {
            blocks.push((displs[q], end, q));
        }
    }
    if disjoint {
        blocks.sort();
        if let Some(w) = blocks.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(Error::invalid(format!(
                "all_to_allv: receive blocks of ranks {} and {} overlap",
                w[0].2, w[1].2
            )));
        }
    }
    Ok(())
}
