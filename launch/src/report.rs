//! How a job ended: one [`RankReport`] per rank (its exit, whether the launcher stopped it, its
//! captured output) in a [`LaunchReport`] that can explain a failure in a few lines.

use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;

/// How one rank ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankExit {
    /// It exited with this code.
    Code(i32),
    /// It was ended by this signal number.
    Signal(i32),
    /// Its status could not be read: something else in this process reaped it, or it had not
    /// ended 10 s after `SIGKILL` (the kill was refused, or it sleeps in the kernel).
    Unknown,
}

impl RankExit {
    /// True for exit code 0.
    pub fn success(self) -> bool {
        self == RankExit::Code(0)
    }

    /// The exit of a process as `wait` reported it.
    pub(crate) fn from_status(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => RankExit::Code(code),
            (None, Some(sig)) => RankExit::Signal(sig),
            (None, None) => RankExit::Unknown,
        }
    }
}

impl fmt::Display for RankExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RankExit::Code(c) => write!(f, "exited with code {c}"),
            RankExit::Signal(s) => match Signal::try_from(s) {
                Ok(sig) => write!(f, "was killed by signal {s} ({})", sig.as_str()),
                Err(_) => write!(f, "was killed by signal {s}"),
            },
            RankExit::Unknown => {
                f.write_str("ended with an unknown status (reaped elsewhere, or not ended 10 s after SIGKILL)")
            }
        }
    }
}

/// The outcome of one rank.
#[derive(Debug, Clone)]
pub struct RankReport {
    /// The rank.
    pub rank: usize,
    /// Its process id (also its process group id).
    pub pid: u32,
    /// How it ended.
    pub exit: RankExit,
    /// The launcher signalled it (after another rank failed, on timeout, or on cancel) while it
    /// was running, and it did not exit 0.
    pub killed_by_launcher: bool,
    /// Its stdout lines, without line ends (empty unless
    /// [`LaunchSpec::capture`](crate::LaunchSpec::capture)).
    pub stdout: Vec<String>,
    /// Its stderr lines, without line ends (empty unless
    /// [`LaunchSpec::capture`](crate::LaunchSpec::capture)).
    pub stderr: Vec<String>,
    /// False when its output pipes were still open [`OUTPUT_GRACE`](crate::OUTPUT_GRACE) after
    /// it ended (a process it started escaped its process group and outlived it); later output
    /// was dropped.
    pub output_complete: bool,
}

/// The outcome of a whole [`launch`](crate::launch).
#[derive(Debug, Clone)]
pub struct LaunchReport {
    /// One entry per rank, indexed by rank.
    pub ranks: Vec<RankReport>,
    /// The timeout passed and the launcher killed the ranks still running.
    pub timed_out: bool,
    /// A [`CancelToken`](crate::CancelToken) stopped the job; the first signal requested.
    pub cancelled: Option<Signal>,
    /// The rank whose own failure (non-zero exit, or a signal the launcher did not send) was
    /// seen first.
    pub first_failure: Option<usize>,
    /// The `MASTER_PORT` the ranks were given.
    pub master_port: u16,
    /// The namespaces made for [`LaunchSpec::namespace_nodes`](crate::LaunchSpec::namespace_nodes),
    /// as `/proc/PID/ns/*` links name them (`net:[4026532283]`): the switch's network
    /// namespace, then each node's network, UTS and mount namespaces. Empty for other jobs.
    /// [`namespace_holders`](crate::namespace_holders) tells whether anything still holds them.
    pub namespaces: Vec<String>,
    /// Time from the start of [`launch`](crate::launch) until every rank was reaped.
    pub elapsed: Duration,
}

impl LaunchReport {
    /// True only when every rank exited with code 0.
    pub fn success(&self) -> bool {
        self.ranks.iter().all(|r| r.exit.success())
    }

    /// A human-readable account: which rank failed first and how, what else failed, which ranks
    /// the launcher killed and why.
    pub fn summary(&self) -> String {
        let n = self.ranks.len();
        if self.success() {
            return format!("all {n} ranks exited 0 in {:.1?}", self.elapsed);
        }
        let mut lines = Vec::new();
        if let Some(first) = self.first_failure.and_then(|r| self.ranks.get(r)) {
            let mut line = format!("rank {} failed first: it {}", first.rank, first.exit);
            if let Some(last) = first.stderr.last() {
                line.push_str(&format!("; its last stderr line: {last:?}"));
            }
            lines.push(line);
        }
        if self.timed_out {
            lines.push(format!("the job timed out after {:.1?}", self.elapsed));
        }
        if let Some(sig) = self.cancelled {
            lines.push(format!("the job was cancelled with {}", sig.as_str()));
        }
        for r in &self.ranks {
            if !r.exit.success() && !r.killed_by_launcher && Some(r.rank) != self.first_failure {
                lines.push(format!("rank {} also failed: it {}", r.rank, r.exit));
            }
        }
        let killed: Vec<String> =
            self.ranks.iter().filter(|r| r.killed_by_launcher).map(|r| r.rank.to_string()).collect();
        if !killed.is_empty() {
            lines.push(format!("the launcher stopped rank(s) {} of {n}", killed.join(", ")));
        }
        for r in self.ranks.iter().filter(|r| !r.output_complete) {
            lines.push(format!(
                "output of rank {} may be incomplete: a process it started kept its output open",
                r.rank
            ));
        }
        lines.join("\n")
    }
}
