//! How crowded this host is: how many ranks share its cores, set once a communicator knows
//! its local ranks ([`set_local_ranks`]). Waits ([`crate::spin::Backoff`]) decide from it how
//! soon they sleep, doorbells ([`crate::doorbell`]) whether they fence before they ring, and
//! transports whether a helper thread of their own may stay awake beside each rank.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Ranks per core from which a host is crowded. Below it (a few ranks per core), a yield
/// mostly hands the core to the peer a waiter waits for, and a futex sleep and wake costs a
/// small call more than yielding does: waiters there yield for a millisecond first ([`crate::spin::Backoff`]).
const CROWDED_RANKS_PER_CORE: usize = 4;

/// Set when this host runs more ranks than it has cores: spinning and yielding then only delay
/// the rank that holds the core we wait for, so waiters sleep almost at once.
static OVERSUBSCRIBED: AtomicBool = AtomicBool::new(false);

/// Set when this host runs more than [`CROWDED_RANKS_PER_CORE`] ranks per core.
static CROWDED: AtomicBool = AtomicBool::new(false);
/// This host's CPUs per rank on it, rounded down (0 until [`set_local_ranks`] runs).
static CPUS_PER_RANK: AtomicUsize = AtomicUsize::new(0);

/// Tells every wait in this process whether ranks outnumber cores on this host.
pub fn set_oversubscribed(oversubscribed: bool) {
    OVERSUBSCRIBED.store(oversubscribed, Ordering::Relaxed);
}

/// Whether ranks outnumber cores on this host (as last set): it decides how soon waits sleep
/// and whether doorbells fence before they ring.
#[inline]
pub fn oversubscribed() -> bool {
    OVERSUBSCRIBED.load(Ordering::Relaxed)
}

/// Whether this host is crowded (as last set): more than four ranks per core. Waits then
/// sleep after two yields, and doorbells fence before they ring.
///
/// Under loom it always holds: the models check the doorbell with its fence, untimed, where a
/// lost wake would hang the sleeper for good.
#[inline]
pub fn crowded() -> bool {
    cfg!(loom) || CROWDED.load(Ordering::Relaxed)
}

/// Tells every wait in this process how many ranks run on this host: they outnumber its cores
/// when there are more of them than [`host_cpus`], and crowd it beyond four per core.
pub fn set_local_ranks(local_ranks: usize) {
    let cpus = host_cpus();
    set_oversubscribed(local_ranks > cpus);
    CROWDED.store(local_ranks > CROWDED_RANKS_PER_CORE * cpus, Ordering::Relaxed);
    CPUS_PER_RANK.store(cpus / local_ranks.max(1), Ordering::Relaxed);
}

/// This host's CPUs per rank on it, rounded down, as [`set_local_ranks`] last saw them; 0
/// before it ran. Helpers that would keep a thread of their own awake beside each waiting
/// rank (a transport's readers napping instead of sleeping) ask it whether cores are spare.
#[inline]
pub fn cpus_per_local_rank() -> usize {
    CPUS_PER_RANK.load(Ordering::Relaxed)
}

/// CPUs online on this host (`/sys/devices/system/cpu/online`), not this thread's affinity
/// mask: a rank pinned to one CPU still shares the host with peers pinned to the others, and
/// they do not outnumber the cores. Falls back to the affinity mask where sysfs is unreadable.
pub fn host_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| count_cpu_list(s.trim()))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The number of CPUs in a kernel CPU list such as `0-3,8,10-11`; `None` if malformed.
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in list.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        n = n.checked_add(b.checked_sub(a)?.checked_add(1)?)?;
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_count() {
        assert_eq!(count_cpu_list("0-1"), Some(2));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("0"), Some(1));
        for bad in ["", "3-1", "a", "0-"] {
            assert_eq!(count_cpu_list(bad), None, "{bad:?}");
        }
        assert!(host_cpus() >= 1);
    }
}
