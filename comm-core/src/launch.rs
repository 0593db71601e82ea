//! The rank launcher: starts N copies of a program on this host as the ranks of one job,
//! watches them, and stops them all as soon as one fails.
//!
//! Every rank gets the torchrun-style variables that
//! [`Bootstrap::from_env`](crate::bootstrap) reads — `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` — plus the job secret `WEAVE_SECRET`.
//! Rank-identity variables of other launchers (Open MPI, Slurm, PMI) are removed from the
//! ranks' environment so that they cannot contradict ours.
//!
//! Each rank runs in its own process group. When a rank exits non-zero or is killed by a signal,
//! or the timeout passes, the launcher sends `SIGKILL` to every remaining rank's process group
//! (which also ends what the rank started), reaps every child, and returns a [`LaunchReport`].
//! `SIGKILL` cannot be caught or ignored, so a stuck or signal-ignoring rank cannot make
//! [`launch`] wait forever.
//!
//! ```no_run
//! use std::time::Duration;
//! use comm_core::launch::{launch, LaunchSpec};
//!
//! let spec = LaunchSpec::new(4, "target/debug/my-rank-program")
//!     .arg("--size=1M")
//!     .timeout(Duration::from_secs(60))
//!     .echo(true);
//! let report = launch(&spec)?;
//! if !report.success() {
//!     eprintln!("{}", report.summary());
//! }
//! # Ok::<(), comm_core::Error>(())
//! ```

use std::ffi::OsString;
use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;

use crate::config;
use crate::error::{Error, Result};

/// Default time a rank gets to exit after a cancel request forwarded its signal, before the
/// launcher sends `SIGKILL`.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(3);

/// How long [`launch`] waits, after every rank has been reaped, for the ranks' output pipes to
/// close. A pipe stays open only when a rank started a process that left its process group and
/// outlived it; that output is then dropped and [`RankReport::output_complete`] is false.
pub const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// Variables that other launchers use to tell a process its rank; they are removed from every
/// rank's environment so they cannot disagree with the variables the launcher sets.
pub const FOREIGN_RANK_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "PMI_RANK",
    "PMI_SIZE",
];

const POLL_MIN: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(20);

/// Where the ranks' output lines are echoed as they arrive, each prefixed `[rank R] `.
#[derive(Clone, Default)]
pub enum Echo {
    /// Not echoed (still read, so a rank never blocks on a full pipe).
    #[default]
    Off,
    /// A rank's stdout to our stdout, its stderr to our stderr.
    Stdio,
    /// Both streams of every rank into one writer, one whole line per write.
    To(Arc<Mutex<dyn Write + Send>>),
}

impl fmt::Debug for Echo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Echo::Off => f.write_str("Off"),
            Echo::Stdio => f.write_str("Stdio"),
            Echo::To(_) => f.write_str("To(..)"),
        }
    }
}

/// Which output stream of a rank a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

impl Echo {
    fn line(&self, rank: usize, stream: Stream, line: &str) {
        if matches!(self, Echo::Off) {
            return;
        }
        let msg = format!("[rank {rank}] {line}\n");
        // Echo failures (a closed terminal, a full disk) must not stop the pump that keeps the
        // rank's pipe drained, so they are ignored.
        let _ = match self {
            Echo::Off => Ok(()),
            Echo::Stdio if stream == Stream::Stdout => std::io::stdout().lock().write_all(msg.as_bytes()),
            Echo::Stdio => std::io::stderr().lock().write_all(msg.as_bytes()),
            Echo::To(w) => w.lock().unwrap_or_else(PoisonError::into_inner).write_all(msg.as_bytes()),
        };
    }
}

/// A request to stop a running [`launch`] from outside it (another thread, a signal handler
/// thread such as [`forward_signals_to`]).
///
/// `cancel(sig)` makes the launcher send `sig` to every running rank's process group, wait up to
/// [`LaunchSpec::cancel_grace`], then `SIGKILL` what is left. A later `cancel` with a different
/// signal is forwarded too (so `cancel(SIGKILL)` after `cancel(SIGINT)` stops everything at once).
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicI32>);

impl CancelToken {
    /// A token that has not been cancelled.
    pub fn new() -> Self {
        CancelToken::default()
    }

    /// Asks the launcher to forward `signal` to every rank and stop the job.
    pub fn cancel(&self, signal: Signal) {
        self.0.store(signal as i32, Ordering::SeqCst);
    }

    /// The signal of the latest cancel request, if any.
    pub fn requested(&self) -> Option<Signal> {
        Signal::try_from(self.0.load(Ordering::SeqCst)).ok()
    }
}

/// Blocks `SIGINT`, `SIGTERM` and `SIGHUP` in the calling thread and starts a thread that turns
/// them into cancel requests on `token`: the first signal is forwarded to the ranks as is, any
/// further one becomes `SIGKILL`.
///
/// Meant for launcher binaries (`cargo xtask launch`): the ranks run in their own process
/// groups, so a Ctrl-C on the terminal reaches only the launcher, which must pass it on. Call it
/// from `main` before any other thread starts — threads inherit the blocked set, and a thread
/// that started earlier would still take the signal's default action (ending the launcher and
/// orphaning the ranks). Ranks started through [`launch`] get an empty signal mask again;
/// signals ignored by the launcher (`nohup`, a background job of a shell without job control
/// ignores `SIGINT`) stay ignored in the ranks, so forwarding one of those ends them only after
/// the grace time.
pub fn forward_signals_to(token: &CancelToken) -> Result<()> {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set.thread_block().map_err(|e| Error::errno("block SIGINT/SIGTERM/SIGHUP with pthread_sigmask", e))?;
    let token = token.clone();
    thread::Builder::new()
        .name("weave-launch-signals".into())
        .spawn(move || {
            let mut seen = false;
            while let Ok(sig) = set.wait() {
                token.cancel(if seen { Signal::SIGKILL } else { sig });
                seen = true;
            }
        })
        .map_err(|e| Error::io("start the launcher's signal-forwarding thread", e))?;
    Ok(())
}

/// What to launch and how. Build it with [`LaunchSpec::new`] and the builder methods, or fill
/// the public fields directly.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// Number of ranks (processes) to start; at least 1.
    pub ranks: usize,
    /// The program every rank runs (looked up in `PATH` when it has no slash).
    pub program: PathBuf,
    /// Arguments passed to every rank.
    pub args: Vec<OsString>,
    /// Bound on the whole job; when it passes, every rank still running is killed. `None` waits
    /// as long as the ranks run.
    pub timeout: Option<Duration>,
    /// Extra environment variables for every rank. The launcher's own variables (`RANK`, …,
    /// `WEAVE_SECRET`) are set after these and win.
    pub env: Vec<(OsString, OsString)>,
    /// `MASTER_ADDR` given to the ranks; also the address the free port is picked on.
    pub master_addr: String,
    /// `MASTER_PORT` given to the ranks; `None` picks a free port on `master_addr`.
    pub master_port: Option<u16>,
    /// Where output lines are echoed as they arrive.
    pub echo: Echo,
    /// Keep every output line in the report ([`RankReport::stdout`] and
    /// [`RankReport::stderr`]).
    pub capture: bool,
    /// Lets another thread stop the job; see [`CancelToken`].
    pub cancel: Option<CancelToken>,
    /// How long ranks get to exit after a cancel request forwarded its signal.
    pub cancel_grace: Duration,
    /// Let the other ranks run on after one fails (they still end at the timeout). Fault tests
    /// use it to watch how the survivors handle a dead peer. Off by default.
    pub keep_going: bool,
    /// Pin rank r to the r-th CPU this process may use (modulo their number), as `mpirun`
    /// binds ranks to cores. Keeps two ranks from sharing a core while another sits idle, which
    /// makes latency measurements repeatable. Off by default.
    pub bind_cores: bool,
}

impl LaunchSpec {
    /// `ranks` copies of `program` with no arguments, no timeout, master address `127.0.0.1`,
    /// no echo and no capture.
    pub fn new(ranks: usize, program: impl Into<PathBuf>) -> Self {
        LaunchSpec {
            ranks,
            program: program.into(),
            args: Vec::new(),
            timeout: None,
            env: Vec::new(),
            master_addr: "127.0.0.1".into(),
            master_port: None,
            echo: Echo::Off,
            capture: false,
            cancel: None,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            keep_going: false,
            bind_cores: false,
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Bounds the whole job.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Adds one environment variable for every rank.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets `MASTER_ADDR` (default `127.0.0.1`).
    pub fn master_addr(mut self, addr: impl Into<String>) -> Self {
        self.master_addr = addr.into();
        self
    }

    /// Sets `MASTER_PORT` instead of picking a free one.
    pub fn master_port(mut self, port: u16) -> Self {
        self.master_port = Some(port);
        self
    }

    /// Echoes output lines to our stdout/stderr (`true`) or not at all (`false`).
    pub fn echo(mut self, on: bool) -> Self {
        self.echo = if on { Echo::Stdio } else { Echo::Off };
        self
    }

    /// Echoes both output streams of every rank into `sink`.
    pub fn echo_to(mut self, sink: Arc<Mutex<dyn Write + Send>>) -> Self {
        self.echo = Echo::To(sink);
        self
    }

    /// Keeps every output line in the report.
    pub fn capture(mut self, on: bool) -> Self {
        self.capture = on;
        self
    }

    /// Lets `token` stop the job.
    pub fn cancel_token(mut self, token: CancelToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Sets how long ranks get to exit after a cancel request.
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
        self
    }

    /// Pins each rank to its own CPU (see [`LaunchSpec::bind_cores`]).
    pub fn bind_cores(mut self, bind: bool) -> Self {
        self.bind_cores = bind;
        self
    }

    /// Keeps the other ranks running after one fails (see [`LaunchSpec::keep_going`]).
    pub fn keep_going(mut self, keep_going: bool) -> Self {
        self.keep_going = keep_going;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.ranks == 0 {
            return Err(Error::invalid("LaunchSpec.ranks is 0; launch at least one rank"));
        }
        if self.program.as_os_str().is_empty() {
            return Err(Error::invalid("LaunchSpec.program is empty; name the program every rank runs"));
        }
        if self.master_addr.trim().is_empty() {
            return Err(Error::invalid("LaunchSpec.master_addr is empty; use 127.0.0.1 for a single host"));
        }
        Ok(())
    }
}

/// How one rank ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankExit {
    /// It exited with this code.
    Code(i32),
    /// It was ended by this signal number.
    Signal(i32),
    /// Its status could not be read (something else in this process reaped it).
    Unknown,
}

impl RankExit {
    /// True for exit code 0.
    pub fn success(self) -> bool {
        self == RankExit::Code(0)
    }

    fn from_status(status: ExitStatus) -> Self {
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
            RankExit::Unknown => f.write_str("ended with an unknown status (it was reaped elsewhere)"),
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
    /// Its stdout lines, without line ends (empty unless [`LaunchSpec::capture`]).
    pub stdout: Vec<String>,
    /// Its stderr lines, without line ends (empty unless [`LaunchSpec::capture`]).
    pub stderr: Vec<String>,
    /// False when its output pipes were still open [`OUTPUT_GRACE`] after it ended (a process
    /// it started escaped its process group and outlived it); later output was dropped.
    pub output_complete: bool,
}

/// The outcome of a whole [`launch`].
#[derive(Debug, Clone)]
pub struct LaunchReport {
    /// One entry per rank, indexed by rank.
    pub ranks: Vec<RankReport>,
    /// The timeout passed and the launcher killed the ranks still running.
    pub timed_out: bool,
    /// A [`CancelToken`] stopped the job; the first signal requested.
    pub cancelled: Option<Signal>,
    /// The rank whose own failure (non-zero exit, or a signal the launcher did not send) was
    /// seen first.
    pub first_failure: Option<usize>,
    /// The `MASTER_PORT` the ranks were given.
    pub master_port: u16,
    /// Time from the start of [`launch`] until every rank was reaped.
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

/// Starts `spec.ranks` copies of `spec.program`, waits until all exit (or one fails, or the
/// timeout passes, or the job is cancelled), and reports how each ended.
///
/// Returns `Err` only when the job could not be started: a bad spec
/// ([`Error::InvalidArgument`]), no free port, no randomness for the secret, or a rank that
/// could not be spawned ([`Error::Io`] naming the program) — in which case the ranks already
/// started are killed and reaped first. Failures of the ranks themselves are in the report.
pub fn launch(spec: &LaunchSpec) -> Result<LaunchReport> {
    let start = Instant::now();
    spec.validate()?;
    let secret = job_secret(config::var("WEAVE_SECRET"))?;
    let master_port = match spec.master_port {
        Some(p) => p,
        None => free_port(&spec.master_addr)?,
    };
    let mut job = Job::new();
    for rank in 0..spec.ranks {
        // On error, dropping `job` kills and reaps the ranks already started.
        job.spawn_rank(spec, rank, &secret, master_port)?;
    }
    let outcome = job.supervise(spec, start);
    job.kill_and_reap();
    let elapsed = start.elapsed();
    let output_complete = job.finish_output();
    let ranks = job
        .procs
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
        .collect();
    Ok(LaunchReport {
        ranks,
        timed_out: outcome.timed_out,
        cancelled: outcome.cancelled,
        first_failure: outcome.first_failure,
        master_port,
        elapsed,
    })
}

/// The job secret: `existing` (the caller's `WEAVE_SECRET`) when set, else 16 random bytes.
fn job_secret(existing: Option<String>) -> Result<String> {
    if let Some(s) = existing {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(format!(
                "WEAVE_SECRET={s:?} is not 32 hex digits; fix it or unset it to let the launcher pick one"
            )));
        }
        return Ok(s);
    }
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).map_err(|e| {
        Error::io("read 16 random bytes from /dev/urandom for WEAVE_SECRET (or set WEAVE_SECRET to 32 hex digits)", e)
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Binds port 0 on `addr`, reads the port the OS picked, and closes the socket again.
fn free_port(addr: &str) -> Result<u16> {
    let what = || format!("pick a free TCP port on master address {addr:?} (use an address of this host)");
    let listener = TcpListener::bind((addr, 0)).map_err(|e| Error::io(what(), e))?;
    Ok(listener.local_addr().map_err(|e| Error::io(what(), e))?.port())
}

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

/// One output-pump thread.
struct Reader {
    proc_index: usize,
    handle: JoinHandle<()>,
    done: bool,
}

/// Tells the launcher that a reader thread has finished, even if it panicked.
struct DoneGuard {
    tx: mpsc::Sender<usize>,
    id: usize,
}

impl Drop for DoneGuard {
    fn drop(&mut self) {
        let _ = self.tx.send(self.id);
    }
}

/// How supervision ended.
struct Outcome {
    timed_out: bool,
    cancelled: Option<Signal>,
    first_failure: Option<usize>,
}

/// The started ranks and their reader threads. Dropping it kills and reaps every rank still
/// running, so no path out of [`launch`] (error or panic) leaves ranks behind.
struct Job {
    procs: Vec<RankProc>,
    readers: Vec<Reader>,
    done_tx: mpsc::Sender<usize>,
    done_rx: mpsc::Receiver<usize>,
}

impl Job {
    fn new() -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        Job { procs: Vec::new(), readers: Vec::new(), done_tx, done_rx }
    }

    fn spawn_rank(&mut self, spec: &LaunchSpec, rank: usize, secret: &str, master_port: u16) -> Result<()> {
        let n = spec.ranks;
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        for var in FOREIGN_RANK_VARS {
            cmd.env_remove(var);
        }
        cmd.envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", &spec.master_addr)
            .env("MASTER_PORT", master_port.to_string())
            .env("WEAVE_SECRET", secret);
        // The calling thread may block signals (see `forward_signals_to`), and a blocked mask
        // survives fork and exec: reset it so the ranks can be stopped by the signals we forward.
        let pin = if spec.bind_cores { cpu_for_rank(rank) } else { None };
        // SAFETY: the closure runs in the forked child before exec; it only calls `sigemptyset`,
        // `sigprocmask` and `sched_setaffinity`, which are async-signal-safe system calls, and
        // it neither allocates nor locks (the CPU set was built before the fork).
        unsafe {
            cmd.pre_exec(move || {
                signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
                    .map_err(std::io::Error::from)?;
                if let Some(set) = &pin {
                    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), set).map_err(std::io::Error::from)?;
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| {
            Error::io(
                format!(
                    "start rank {rank} of {n} as {:?} (check the program path, that it is executable, and PATH)",
                    spec.program
                ),
                e,
            )
        })?;
        let pipes = (child.stdout.take(), child.stderr.take());
        let index = self.procs.len();
        self.procs.push(RankProc {
            rank,
            pid: child.id(),
            child,
            exit: None,
            signalled: false,
            stdout: Arc::default(),
            stderr: Arc::default(),
        });
        if let Some(pipe) = pipes.0 {
            let lines = spec.capture.then(|| Arc::clone(&self.procs[index].stdout));
            self.spawn_reader(index, Stream::Stdout, pipe, spec.echo.clone(), lines)?;
        }
        if let Some(pipe) = pipes.1 {
            let lines = spec.capture.then(|| Arc::clone(&self.procs[index].stderr));
            self.spawn_reader(index, Stream::Stderr, pipe, spec.echo.clone(), lines)?;
        }
        Ok(())
    }

    fn spawn_reader(
        &mut self,
        proc_index: usize,
        stream: Stream,
        pipe: impl Read + Send + 'static,
        echo: Echo,
        lines: Option<Arc<Mutex<Vec<String>>>>,
    ) -> Result<()> {
        let rank = self.procs[proc_index].rank;
        let guard = DoneGuard { tx: self.done_tx.clone(), id: self.readers.len() };
        let name = format!("weave-launch-r{rank}-{}", if stream == Stream::Stdout { "out" } else { "err" });
        let handle = thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _guard = guard;
                pump(rank, stream, pipe, &echo, lines.as_deref());
            })
            .map_err(|e| Error::io(format!("start the output reader thread of rank {rank}"), e))?;
        self.readers.push(Reader { proc_index, handle, done: false });
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
    fn supervise(&mut self, spec: &LaunchSpec, start: Instant) -> Outcome {
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
    /// cannot ignore `SIGKILL`, and the rank itself is killed even if it left its group.
    fn kill_and_reap(&mut self) {
        self.signal_running(Signal::SIGKILL);
        for p in self.procs.iter_mut().filter(|p| p.exit.is_none()) {
            p.exit = Some(match p.child.wait() {
                Ok(status) => RankExit::from_status(status),
                Err(_) => RankExit::Unknown,
            });
        }
    }

    /// Joins the reader threads that finish within [`OUTPUT_GRACE`] and detaches the rest.
    /// Returns, per rank, whether all of its output was read.
    fn finish_output(&mut self) -> Vec<bool> {
        let end = Instant::now() + OUTPUT_GRACE;
        let mut pending = self.readers.iter().filter(|r| !r.done).count();
        while pending > 0 {
            match self.done_rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
                Ok(id) => {
                    if let Some(r) = self.readers.get_mut(id).filter(|r| !r.done) {
                        r.done = true;
                        pending -= 1;
                    }
                }
                Err(_) => break,
            }
        }
        let mut complete = vec![true; self.procs.len()];
        for r in self.readers.drain(..) {
            if r.done {
                // The thread has sent its last message and is returning; a panic in it only
                // means lost echo lines, which `complete` cannot express better than this.
                let _ = r.handle.join();
            } else {
                // Detached: it ends when the last holder of the pipe closes it.
                complete[r.proc_index] = false;
            }
        }
        complete
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.kill_and_reap();
    }
}

/// Reads `pipe` line by line until it closes, echoing and capturing each line.
fn pump(rank: usize, stream: Stream, pipe: impl Read, echo: &Echo, lines: Option<&Mutex<Vec<String>>>) {
    let mut reader = BufReader::new(pipe);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        let text = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let line = String::from_utf8_lossy(text);
        echo.line(rank, stream, &line);
        if let Some(lines) = lines {
            lines.lock().unwrap_or_else(PoisonError::into_inner).push(line.into_owned());
        }
    }
}

/// The CPU set holding only the `rank`-th CPU this process may run on (modulo their number);
/// `None` when the allowed set cannot be read.
fn cpu_for_rank(rank: usize) -> Option<nix::sched::CpuSet> {
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok()?;
    let cpus: Vec<usize> = (0..nix::sched::CpuSet::count()).filter(|&c| allowed.is_set(c).unwrap_or(false)).collect();
    let cpu = *cpus.get(rank % cpus.len().max(1))?;
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).ok()?;
    Some(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(ranks: usize, script: &str) -> LaunchSpec {
        LaunchSpec::new(ranks, "/bin/sh").arg("-c").arg(script).capture(true).timeout(Duration::from_secs(20))
    }

    #[test]
    fn all_ranks_succeed_with_consistent_environment() {
        let spec = sh(
            4,
            r#"echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $WEAVE_SECRET $EXTRA""#,
        )
        .env("EXTRA", "x")
        .env("RANK", "99");
        let report = launch(&spec).unwrap();
        assert!(report.success(), "{}", report.summary());
        assert_eq!(report.first_failure, None);
        assert!(!report.timed_out);
        assert!(report.summary().starts_with("all 4 ranks exited 0"));
        let mut secrets = Vec::new();
        for (i, r) in report.ranks.iter().enumerate() {
            assert_eq!(r.rank, i);
            assert_eq!(r.exit, RankExit::Code(0));
            assert!(!r.killed_by_launcher && r.output_complete);
            assert_eq!(r.stdout.len(), 1, "{:?}", r.stdout);
            let f: Vec<&str> = r.stdout[0].split(' ').collect();
            assert_eq!(f.len(), 8, "{f:?}");
            assert_eq!(f[0], i.to_string(), "RANK (the launcher's value wins over LaunchSpec.env)");
            assert_eq!((f[1], f[2], f[3]), ("4", f[0], "4"));
            assert_eq!(f[4], "127.0.0.1");
            assert_eq!(f[5], report.master_port.to_string());
            assert!(f[6].len() == 32 && f[6].bytes().all(|b| b.is_ascii_hexdigit()), "{}", f[6]);
            assert_eq!(f[7], "x");
            secrets.push(f[6].to_string());
        }
        assert!(secrets.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(report.master_port, 0);
    }

    #[test]
    fn echoed_and_captured_lines_carry_their_rank() {
        let sink = Arc::new(Mutex::new(Vec::<u8>::new()));
        let spec = sh(3, r#"echo "out $RANK"; echo "err $RANK" >&2; printf 'tail %s' "$RANK""#).echo_to(sink.clone());
        let report = launch(&spec).unwrap();
        assert!(report.success(), "{}", report.summary());
        for r in &report.ranks {
            assert_eq!(r.stdout, [format!("out {}", r.rank), format!("tail {}", r.rank)]);
            assert_eq!(r.stderr, [format!("err {}", r.rank)]);
        }
        let echoed = String::from_utf8(sink.lock().unwrap().clone()).unwrap();
        let mut lines: Vec<&str> = echoed.lines().collect();
        lines.sort();
        let mut want: Vec<String> = (0..3)
            .flat_map(|r| {
                [format!("[rank {r}] out {r}"), format!("[rank {r}] err {r}"), format!("[rank {r}] tail {r}")]
            })
            .collect();
        want.sort();
        assert_eq!(lines, want);
    }

    #[test]
    fn failing_rank_stops_the_others() {
        // Every rank ignores the catchable signals: SIGKILL must stop them anyway.
        let spec =
            sh(4, r#"trap '' INT TERM HUP; if [ "$RANK" = 2 ]; then echo "rank 2 gives up" >&2; exit 3; fi; sleep 60"#);
        let t = Instant::now();
        let report = launch(&spec).unwrap();
        assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
        assert!(!report.success() && !report.timed_out);
        assert_eq!(report.first_failure, Some(2));
        assert_eq!(report.ranks[2].exit, RankExit::Code(3));
        assert!(!report.ranks[2].killed_by_launcher);
        for r in [0, 1, 3] {
            assert!(report.ranks[r].killed_by_launcher, "rank {r}");
            assert_eq!(report.ranks[r].exit, RankExit::Signal(Signal::SIGKILL as i32));
        }
        let summary = report.summary();
        assert!(summary.contains("rank 2 failed first: it exited with code 3"), "{summary}");
        assert!(summary.contains("rank 2 gives up"), "{summary}");
        assert!(summary.contains("stopped rank(s) 0, 1, 3 of 4"), "{summary}");
    }

    #[test]
    fn timeout_kills_every_rank() {
        let spec = sh(3, "sleep 60").timeout(Duration::from_millis(300));
        let t = Instant::now();
        let report = launch(&spec).unwrap();
        assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
        assert!(report.timed_out && !report.success());
        assert_eq!(report.first_failure, None);
        assert!(report.ranks.iter().all(|r| r.killed_by_launcher));
        assert!(report.summary().contains("timed out"), "{}", report.summary());
    }

    #[test]
    fn rank_killed_by_a_signal_is_a_failure() {
        let spec = sh(2, r#"if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 60"#);
        let t = Instant::now();
        let report = launch(&spec).unwrap();
        assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
        assert_eq!(report.first_failure, Some(1));
        assert_eq!(report.ranks[1].exit, RankExit::Signal(9));
        assert!(!report.ranks[1].killed_by_launcher);
        assert!(report.ranks[0].killed_by_launcher);
        assert!(report.summary().contains("rank 1 failed first: it was killed by signal 9 (SIGKILL)"));
    }

    #[test]
    fn missing_program_is_an_io_error() {
        let spec = LaunchSpec::new(2, "/nonexistent/weave-rank-program");
        match launch(&spec) {
            Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("/nonexistent/weave-rank-program"), "{e}"),
            other => panic!("expected Error::Io, got {other:?}"),
        }
        assert!(matches!(launch(&LaunchSpec::new(0, "/bin/true")), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn cancel_forwards_the_signal_then_kills() {
        let token = CancelToken::new();
        // Rank 0 ends on SIGTERM; rank 1 ignores it and is killed after the grace time.
        let spec = sh(2, r#"if [ "$RANK" = 1 ]; then trap '' TERM; fi; sleep 60"#)
            .cancel_token(token.clone())
            .cancel_grace(Duration::from_millis(300));
        let canceller = {
            let token = token.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(200));
                token.cancel(Signal::SIGTERM);
            })
        };
        let t = Instant::now();
        let report = launch(&spec).unwrap();
        canceller.join().unwrap();
        assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
        assert_eq!(report.cancelled, Some(Signal::SIGTERM));
        assert_eq!(report.first_failure, None);
        assert!(report.ranks.iter().all(|r| r.killed_by_launcher));
        assert_eq!(report.ranks[1].exit, RankExit::Signal(Signal::SIGKILL as i32));
    }

    #[test]
    fn escaped_grandchild_cannot_hold_the_launcher() {
        // The grandchild leaves the process group and keeps stdout open past OUTPUT_GRACE.
        let spec = sh(1, "setsid sleep 4 & echo started");
        let t = Instant::now();
        let report = launch(&spec).unwrap();
        assert!(t.elapsed() < OUTPUT_GRACE + Duration::from_secs(1), "took {:?}", t.elapsed());
        assert!(report.success(), "{}", report.summary());
        assert_eq!(report.ranks[0].stdout, ["started"]);
        assert!(!report.ranks[0].output_complete);
    }

    #[test]
    fn ranks_start_with_no_blocked_signals() {
        let mut set = SigSet::empty();
        set.add(Signal::SIGHUP);
        set.thread_block().unwrap();
        let report = launch(&sh(1, "grep SigBlk /proc/self/status"));
        set.thread_unblock().unwrap();
        let report = report.unwrap();
        assert!(report.success(), "{}", report.summary());
        assert_eq!(report.ranks[0].stdout, ["SigBlk:\t0000000000000000"]);
    }

    #[test]
    fn secret_is_kept_or_generated() {
        let s = "0123456789abcdefABCDEF0123456789".to_string();
        assert_eq!(job_secret(Some(s.clone())).unwrap(), s);
        assert!(matches!(job_secret(Some("xyz".into())), Err(Error::InvalidArgument(_))));
        let a = job_secret(None).unwrap();
        assert!(a.len() == 32 && a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, job_secret(None).unwrap());
    }
}
