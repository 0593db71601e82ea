//! Copies between the user's buffers, workspaces and message slots, which every executor
//! makes: [`copy`] of elements and [`copy_bytes`], which copies small ranges without a call;
//! and [`share`], the part of a buffer that one of `n` ranks owns.

use crate::dtype::Element;

/// Copies `len` elements (ranges may overlap).
///
/// # Safety
/// Both pointers valid for `len` elements; no concurrent writer to either range.
#[inline(always)]
pub(crate) unsafe fn copy<T: Element>(src: *const T, dst: *mut T, len: usize) {
    if len > 0 && !std::ptr::eq(src, dst) {
        // SAFETY: forwarded from the caller (len elements are len * size_of::<T>() bytes).
        unsafe { copy_bytes(src.cast(), dst.cast(), len * std::mem::size_of::<T>()) };
    }
}

/// Copies `len` bytes (ranges may overlap). Up to 32 bytes without a call: two possibly
/// overlapping loads of the widest word that fits, then two stores — a library `memmove`
/// costs small calls more than the copy itself.
///
/// # Safety
/// Both pointers valid for `len` bytes; no concurrent writer to either range.
#[inline(always)]
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    /// Loads the first and last `W`-sized words of the range, then stores them (`W ≤ len ≤
    /// 2W`): every byte is loaded before any is stored, so overlapping ranges are copied right.
    #[inline(always)]
    unsafe fn two_words<W: Copy>(src: *const u8, dst: *mut u8, len: usize) {
        let w = std::mem::size_of::<W>();
        // SAFETY: w <= len (caller), so both words lie inside the ranges.
        unsafe {
            let (head, tail) = (src.cast::<W>().read_unaligned(), src.add(len - w).cast::<W>().read_unaligned());
            dst.cast::<W>().write_unaligned(head);
            dst.add(len - w).cast::<W>().write_unaligned(tail);
        }
    }
    // SAFETY: (every arm) forwarded from the caller; each arm's word size fits len.
    unsafe {
        match len {
            4..=7 => two_words::<u32>(src, dst, len),
            8..=15 => two_words::<u64>(src, dst, len),
            16..=32 => two_words::<u128>(src, dst, len),
            _ => std::ptr::copy(src, dst, len),
        }
    }
}

/// `[a, b)`: the share of `k` elements that `part` of `n` owns.
pub(crate) fn share(k: usize, n: usize, part: usize) -> (usize, usize) {
    (k * part / n, k * (part + 1) / n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_bytes_copies_every_length_disjoint_and_overlapping() {
        let pattern: Vec<u8> = (0..96u8).map(|b| b.wrapping_mul(37).wrapping_add(11)).collect();
        for len in 0..=40 {
            let mut dst = [0u8; 48];
            // SAFETY: both ranges hold len bytes and do not overlap.
            unsafe { copy_bytes(pattern.as_ptr().add(3), dst.as_mut_ptr().add(5), len) };
            assert_eq!(&dst[5..5 + len], &pattern[3..3 + len], "disjoint, {len} bytes");
            assert!(dst[..5].iter().chain(&dst[5 + len..]).all(|&b| b == 0), "wrote outside, {len} bytes");
            for shift in [1usize, 7] {
                let mut buf = pattern.clone();
                // SAFETY: both ranges lie inside buf (len + shift <= 47 < 96); they overlap.
                unsafe { copy_bytes(buf.as_ptr().add(10), buf.as_mut_ptr().add(10 + shift), len) };
                assert_eq!(&buf[10 + shift..10 + shift + len], &pattern[10..10 + len], "forward {shift}, {len} bytes");
                let mut buf = pattern.clone();
                // SAFETY: as above, copying backwards.
                unsafe { copy_bytes(buf.as_ptr().add(10 + shift), buf.as_mut_ptr().add(10), len) };
                assert_eq!(&buf[10..10 + len], &pattern[10 + shift..10 + shift + len], "back {shift}, {len} bytes");
            }
        }
    }

    #[test]
    fn shares_cover_everything() {
        for n in 1..9 {
            for k in [0, 1, 7, 100] {
                let mut next = 0;
                for p in 0..n {
                    let (a, b) = share(k, n, p);
                    assert_eq!(a, next);
                    next = b;
                }
                assert_eq!(next, k);
            }
        }
    }
}
