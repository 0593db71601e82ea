//! The started ranks of one job: each rank a child process leading its own process group,
//! supervised until all have ended, one fails, the timeout passes or a cancel request's grace
//! time runs out; then every rank still running is killed with `SIGKILL` and reaped.
//!
//! A rank is signalled through its process group (which also reaches what it started) and
//! directly (in case it moved to another group), and only while it is an unreaped child of
//! ours, so its pid cannot have been reused. Dropping a [`Job`] kills and reaps every rank
//! still running, so no path out of [`launch`](crate::launch) (error or panic) leaves ranks
//! behind.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use nix::sched::CpuSet;
use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::netns::Entry;
use crate::output::{Readers, Stream};
use crate::rank_env::set_rank_env;
use crate::report::{RankExit, RankReport};
use crate::spec::LaunchSpec;

/// First pause between two looks at the ranks; it doubles up to [`POLL_MAX`] while nothing
/// happens and starts over after a cancel request.
const POLL_MIN: Duration = Duration::from_millis(1);
/// Longest pause between two looks at the ranks: how late a rank's end is noticed at most.
const POLL_MAX: Duration = Duration::from_millis(20);
/// How long [`Job::kill_and_reap`] waits for killed ranks to end.
const KILL_GRACE: Duration = Duration::from_secs(10);

/// One started rank.
struct RankProc {
    rank: usize,
    pid: u32,
    child: Child,
    /// Set once reaped; a rank with `exit == None` is still our unreaped child, so its pid (and
    /// process group id) cannot have been reused.
    exit: Option<RankExit>,
    /// The launcher sent it a signal while it was running.
    signalled: bool,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl RankProc {
    /// Sends `sig` to the rank's process group and to the rank itself (in case it moved to
    /// another group). Only called while the rank is unreaped.
    fn signal(&mut self, sig: Signal) {
        if let Ok(pid) = i32::try_from(self.pid) {
            // Errors mean the group or process is already gone (ESRCH), or one of its members
            // changed credentials (EPERM); there is nothing more to do for either.
            let _ = signal::killpg(Pid::from_raw(pid), sig);
            let _ = signal::kill(Pid::from_raw(pid), sig);
        }
        self.signalled = true;
    }
}

/// How supervision ended.
pub(crate) struct Outcome {
    /// The timeout passed.
    pub(crate) timed_out: bool,
    /// The first signal a cancel request asked for.
    pub(crate) cancelled: Option<Signal>,
    /// The rank whose own failure was seen first.
    pub(crate) first_failure: Option<usize>,
}

/// The started ranks and their output readers. Dropping it kills and reaps every rank still
/// running.
pub(crate) struct Job {
    procs: Vec<RankProc>,
    readers: Readers,
}

impl Job {
    /// A job with no rank started yet.
    pub(crate) fn new() -> Self {
        Job { procs: Vec::new(), readers: Readers::new() }
    }

    /// Starts `rank` of `spec` with its environment, in its own process group, and the reader
    /// threads of its output pipes.
    /// `master` is the job's `MASTER_ADDR` and `MASTER_PORT`; `node`, for a namespace node,
    /// how the rank enters it.
    pub(crate) fn spawn_rank(
        &mut self,
        spec: &LaunchSpec,
        rank: usize,
        secret: &str,
        master: (&str, u16),
        node: Option<Entry>,
    ) -> Result<()> {
        let n = spec.ranks;
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        set_rank_env(&mut cmd, spec, rank, secret, master, node.is_some());
        // The calling thread may block signals (see `forward_signals_to`), and a blocked mask
        // survives fork and exec: reset it so the ranks can be stopped by the signals we forward.
        let pin = if spec.bind_cores { cpu_for_rank(rank) } else { None };
        let in_node = node.is_some();
        // SAFETY: the closure runs in the forked child before exec; it only calls `sigemptyset`,
        // `sigprocmask`, `sched_setaffinity` and what `Entry::enter` calls (`setns`, `chdir`,
        // `prctl`, `getppid`), which are async-signal-safe system calls, and it neither
        // allocates nor locks (the CPU set and the entry were built before the fork).
        unsafe {
            cmd.pre_exec(move || {
                signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
                    .map_err(std::io::Error::from)?;
                if let Some(set) = &pin {
                    nix::sched::sched_setaffinity(Pid::from_raw(0), set).map_err(std::io::Error::from)?;
                }
                if let Some(entry) = &node {
                    entry.enter()?;
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| {
            let node = if in_node {
                format!(" in namespace node {} (entering it needs root)", rank / spec.ranks_per_node().max(1))
            } else {
                String::new()
            };
            Error::io(
                format!(
                    "start rank {rank} of {n} as {:?}{node} (check the program path, that it is executable, and PATH)",
                    spec.program
                ),
                e,
            )
        })?;
        let pipes = (child.stdout.take(), child.stderr.take());
        let index = self.procs.len();
        let (stdout, stderr) = (Arc::default(), Arc::default());
        self.procs.push(RankProc {
            rank,
            pid: child.id(),
            child,
            exit: None,
            signalled: false,
            stdout: Arc::clone(&stdout),
            stderr: Arc::clone(&stderr),
        });
        if let Some(pipe) = pipes.0 {
            let lines = spec.capture.then_some(stdout);
            self.readers.spawn(index, rank, Stream::Stdout, pipe, spec.echo.clone(), lines)?;
        }
        if let Some(pipe) = pipes.1 {
            let lines = spec.capture.then_some(stderr);
            self.readers.spawn(index, rank, Stream::Stderr, pipe, spec.echo.clone(), lines)?;
        }
        Ok(())
    }

    /// Reaps ranks that have ended; records the first own failure. Returns how many still run.
    fn reap_finished(&mut self, first_failure: &mut Option<usize>) -> usize {
        let mut running = 0;
        for p in self.procs.iter_mut().filter(|p| p.exit.is_none()) {
            let exit = match p.child.try_wait() {
                Ok(Some(status)) => RankExit::from_status(status),
                Ok(None) => {
                    running += 1;
                    continue;
                }
                Err(_) => RankExit::Unknown,
            };
            p.exit = Some(exit);
            if !exit.success() && !p.signalled && first_failure.is_none() {
                *first_failure = Some(p.rank);
            }
        }
        running
    }

    fn signal_running(&mut self, sig: Signal) {
        for p in self.procs.iter_mut().filter(|p| p.exit.is_none()) {
            p.signal(sig);
        }
    }

    /// Waits until every rank has ended, one fails, the timeout passes, or a cancel request's
    /// grace time runs out.
    pub(crate) fn supervise(&mut self, spec: &LaunchSpec, start: Instant) -> Outcome {
        let deadline = spec.timeout.and_then(|t| start.checked_add(t));
        let mut out = Outcome { timed_out: false, cancelled: None, first_failure: None };
        let mut forwarded: Option<Signal> = None;
        let mut cancel_deadline: Option<Instant> = None;
        let mut pause = POLL_MIN;
        loop {
            let running = self.reap_finished(&mut out.first_failure);
            if running == 0 || (out.first_failure.is_some() && !spec.keep_going) {
                return out;
            }
            let now = Instant::now();
            if let Some(sig) = spec.cancel.as_ref().and_then(CancelToken::requested)
                && forwarded != Some(sig)
            {
                out.cancelled.get_or_insert(sig);
                forwarded = Some(sig);
                self.signal_running(sig);
                cancel_deadline.get_or_insert_with(|| now.checked_add(spec.cancel_grace).unwrap_or(now));
                pause = POLL_MIN;
            }
            if cancel_deadline.is_some_and(|d| now >= d) {
                return out;
            }
            if deadline.is_some_and(|d| now >= d) {
                out.timed_out = true;
                return out;
            }
            let mut sleep = pause;
            for d in [deadline, cancel_deadline].into_iter().flatten() {
                sleep = sleep.min(d.saturating_duration_since(now));
            }
            thread::sleep(sleep);
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    /// Sends `SIGKILL` to every rank still running and reaps every rank. Prompt: a process
    /// cannot ignore `SIGKILL`, and the rank itself is killed even if it left its group. A
    /// rank that still has not ended after [`KILL_GRACE`] (the kill was refused: it became
    /// another user's; or it sleeps in a driver call that cannot be interrupted) is reported
    /// [`RankExit::Unknown`] rather than waited for.
    pub(crate) fn kill_and_reap(&mut self) {
        self.signal_running(Signal::SIGKILL);
        let give_up = Instant::now() + KILL_GRACE;
        let mut pause = POLL_MIN;
        loop {
            let mut running = false;
            for p in self.procs.iter_mut().filter(|p| p.exit.is_none()) {
                match p.child.try_wait() {
                    Ok(Some(status)) => p.exit = Some(RankExit::from_status(status)),
                    Ok(None) => running = true,
                    Err(_) => p.exit = Some(RankExit::Unknown),
                }
            }
            if !running {
                return;
            }
            if Instant::now() >= give_up {
                for p in self.procs.iter_mut().filter(|p| p.exit.is_none()) {
                    p.exit = Some(RankExit::Unknown);
                }
                return;
            }
            thread::sleep(pause);
            pause = (pause * 2).min(POLL_MAX);
        }
    }

    /// Collects the ranks' output (waiting for the pipes at most
    /// [`OUTPUT_GRACE`](crate::OUTPUT_GRACE)) and reports how each rank ended. Call it after
    /// [`Job::kill_and_reap`].
    pub(crate) fn reports(&mut self) -> Vec<RankReport> {
        let output_complete = self.readers.finish(self.procs.len());
        self.procs
            .iter()
            .zip(output_complete)
            .map(|(p, output_complete)| {
                let exit = p.exit.unwrap_or(RankExit::Unknown);
                RankReport {
                    rank: p.rank,
                    pid: p.pid,
                    exit,
                    killed_by_launcher: p.signalled && !exit.success(),
                    stdout: std::mem::take(&mut *p.stdout.lock().unwrap_or_else(PoisonError::into_inner)),
                    stderr: std::mem::take(&mut *p.stderr.lock().unwrap_or_else(PoisonError::into_inner)),
                    output_complete,
                }
            })
            .collect()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

/// The CPU set holding only the `rank`-th CPU this process may run on (modulo their number);
/// `None` when the allowed set cannot be read.
fn cpu_for_rank(rank: usize) -> Option<CpuSet> {
    let allowed = nix::sched::sched_getaffinity(Pid::from_raw(0)).ok()?;
    let cpus: Vec<usize> = (0..CpuSet::count()).filter(|&c| allowed.is_set(c).unwrap_or(false)).collect();
    let cpu = *cpus.get(rank % cpus.len().max(1))?;
    let mut set = CpuSet::new();
    set.set(cpu).ok()?;
    Some(set)
}
