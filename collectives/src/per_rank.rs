//! [`PerRank`]: one value per rank of a call, on the stack for the worlds most calls run in.

/// Ranks whose values live on the stack; larger worlds allocate.
const ON_STACK: usize = 64;

/// One `T` per rank of an `n`-rank world, without allocating for up to `STACK` ranks (64 by
/// default: the hot path of small collectives cannot afford an allocation per call). A path
/// that mostly runs in small worlds names a smaller `STACK`, so that clearing and moving the
/// array costs it less.
pub(crate) struct PerRank<T: Copy, const STACK: usize = ON_STACK> {
    few: [T; STACK],
    many: Vec<T>,
    n: usize,
}

impl<T: Copy> PerRank<T> {
    /// `n` copies of `fill`, on the stack for up to 64 ranks.
    #[inline]
    pub(crate) fn new(n: usize, fill: T) -> Self {
        Self::filled(n, fill)
    }
}

impl<T: Copy, const STACK: usize> PerRank<T, STACK> {
    /// `n` copies of `fill`, on the stack for up to `STACK` ranks.
    #[inline]
    pub(crate) fn filled(n: usize, fill: T) -> Self {
        let many = if n > STACK { vec![fill; n] } else { Vec::new() };
        PerRank { few: [fill; STACK], many, n }
    }

    /// The values, indexed by rank.
    #[inline]
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        if self.n > STACK { &mut self.many } else { &mut self.few[..self.n] }
    }
}

#[cfg(test)]
mod tests {
    use super::PerRank;

    #[test]
    fn holds_one_value_per_rank_on_either_side_of_the_stack_limit() {
        for n in [0, 1, 64, 65, 200] {
            let mut v: PerRank<u32> = PerRank::new(n, 7u32);
            let s = v.as_mut_slice();
            assert_eq!(s.len(), n);
            assert!(s.iter().all(|&x| x == 7));
            if let Some(last) = s.last_mut() {
                *last = 9;
            }
            assert_eq!(v.as_mut_slice().iter().filter(|&&x| x == 9).count(), usize::from(n > 0));
        }
        for n in [0, 8, 9, 30] {
            let mut v = PerRank::<u8, 8>::filled(n, 3);
            assert_eq!(v.as_mut_slice(), vec![3u8; n].as_slice());
        }
    }
}
