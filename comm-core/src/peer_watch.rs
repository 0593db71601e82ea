//! Liveness of a peer process on this host, checked cheaply while spinning. Transports whose
//! peers live on the same host (shared memory, CUDA IPC) hand one to their connections.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

/// At most one `kill(pid, 0)` per this interval; calls in between answer from the last result.
const KILL_EVERY: Duration = Duration::from_millis(1);
/// At most one read of `/proc/<pid>/stat` (zombie and pid-reuse check) per this interval.
const STAT_EVERY: Duration = Duration::from_millis(50);

/// Watches one peer process. Once it is found gone, it stays gone.
#[derive(Debug)]
pub struct PeerWatch {
    peer: usize,
    /// What the check is reported as ("shm peer check").
    operation: &'static str,
    pid: Pid,
    /// The process's start time (field 22 of `/proc/<pid>/stat`) when the connection was made,
    /// if readable: a different value later means the pid was reused.
    start_time: Option<u64>,
    base: Instant,
    /// Nanoseconds after `base` (shifted by the interval, so the first call always checks).
    last_kill: AtomicU64,
    last_stat: AtomicU64,
    lost: OnceLock<String>,
}

/// State and start time of a process, parsed from the text of `/proc/<pid>/stat`.
fn parse_stat(text: &str) -> Option<(char, u64)> {
    // The command name (field 2) is in parentheses and may itself contain ')' and spaces.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4..=21 come between the state (field 3) and the start time (field 22).
    let start_time = fields.nth(18)?.parse().ok()?;
    Some((state, start_time))
}

fn read_stat(pid: Pid) -> Option<(char, u64)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

impl PeerWatch {
    /// Watches process `pid` (already checked to be positive), which is rank `peer`; errors
    /// name `operation` (e.g. "shm peer check").
    pub fn new(peer: usize, pid: Pid, operation: &'static str) -> Self {
        PeerWatch {
            peer,
            operation,
            pid,
            start_time: read_stat(pid).map(|(_, t)| t),
            base: Instant::now(),
            last_kill: AtomicU64::new(0),
            last_stat: AtomicU64::new(0),
            lost: OnceLock::new(),
        }
    }

    fn lost(&self, reason: String) -> Error {
        let reason = self.lost.get_or_init(|| reason);
        Error::peer_lost(self.peer, self.operation, reason.clone())
    }

    /// True when at least `every` passed since `last` (and then records now).
    fn due(&self, last: &AtomicU64, now: u64, every: Duration) -> bool {
        let every = every.as_nanos() as u64;
        let prev = last.load(Ordering::Relaxed);
        // Two threads may both pass: that costs one extra syscall, nothing else.
        if now.saturating_sub(prev) < every {
            return false;
        }
        last.store(now, Ordering::Relaxed);
        true
    }

    /// `Err(PeerLost)` once the process is gone: it no longer exists (`kill` gives `ESRCH`), it
    /// is a zombie, or its pid now belongs to another process. `EPERM` counts as alive. Costs at
    /// most one syscall per millisecond and one small `/proc` read per 50 ms.
    pub fn check(&self) -> Result<()> {
        if let Some(reason) = self.lost.get() {
            return Err(Error::peer_lost(self.peer, self.operation, reason.clone()));
        }
        // Shift by the longest interval so the very first call checks everything.
        let now = (self.base.elapsed() + STAT_EVERY).as_nanos() as u64;
        if !self.due(&self.last_kill, now, KILL_EVERY) {
            return Ok(());
        }
        // EPERM means it exists but belongs to someone else (not expected for a peer of the
        // same uid): alive. Other errors say nothing about the peer.
        if kill(self.pid, None) == Err(Errno::ESRCH) {
            return Err(self.lost(format!("process {} no longer exists", self.pid)));
        }
        if self.due(&self.last_stat, now, STAT_EVERY) {
            match read_stat(self.pid) {
                Some(('Z' | 'X', _)) => {
                    return Err(self.lost(format!("process {} exited (not yet reaped)", self.pid)));
                }
                Some((_, t)) if self.start_time.is_some_and(|s| s != t) => {
                    return Err(self.lost(format!("process {} exited and its pid was reused", self.pid)));
                }
                // Unreadable /proc: rely on kill alone.
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        let fields: String = (4..=21).map(|i| format!(" {i}")).collect();
        let text = format!("1234 (a) b (c) d) S{fields} 987654 rest of line\n");
        assert_eq!(parse_stat(&text), Some(('S', 987_654)));
        assert_eq!(parse_stat("1234 (x) Z 1 2"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
        assert_eq!(parse_stat(""), None);
        let own = read_stat(Pid::this()).unwrap();
        assert!(matches!(own.0, 'R' | 'S' | 'D'));
    }

    #[test]
    fn own_process_is_alive_repeatedly() {
        let w = PeerWatch::new(1, Pid::this(), "test peer check");
        assert!(w.start_time.is_some());
        for _ in 0..1000 {
            w.check().unwrap();
        }
        std::thread::sleep(STAT_EVERY + Duration::from_millis(5));
        w.check().unwrap();
    }

    #[test]
    fn reaped_child_is_lost_and_stays_lost() {
        let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        child.wait().unwrap();
        let w = PeerWatch::new(5, pid, "test peer check");
        let e = w.check().unwrap_err();
        assert!(matches!(e, Error::PeerLost { peer: 5, .. }), "{e}");
        // Sticky, even inside the rate-limit window.
        assert!(matches!(w.check(), Err(Error::PeerLost { peer: 5, .. })));
    }

    #[test]
    fn zombie_child_is_lost() {
        let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        let w = PeerWatch::new(2, pid, "test peer check");
        let deadline = Instant::now() + Duration::from_secs(10);
        while read_stat(pid).is_some_and(|(s, _)| s != 'Z') && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let r = w.check();
        child.wait().unwrap();
        assert!(matches!(r, Err(Error::PeerLost { peer: 2, .. })), "{r:?}");
    }

    #[test]
    fn reused_pid_is_lost() {
        let mut w = PeerWatch::new(3, Pid::this(), "test peer check");
        w.start_time = w.start_time.map(|t| t + 1);
        assert!(matches!(w.check(), Err(Error::PeerLost { peer: 3, .. })));
    }
}
