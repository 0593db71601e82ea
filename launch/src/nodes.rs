//! Namespace nodes that outlive one job: a [`NodeFabric`] is made once, and several jobs —
//! ranks through [`launch_on`](crate::launch_on), any program through
//! [`NodeFabric::enter_on_spawn`], and processes that other programs start through
//! [`run_in_node`] — run on the same nodes at the same time. `cargo xtask bench --nodes`
//! runs weave's ranks and Open MPI's on one fabric this way, so both cross the same links.
//!
//! Dropping the fabric kills every process still inside its namespaces, then the holders, so
//! the namespaces end with it (see [`netns`](crate::netns)).

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::netns::{Fabric, MAX_NAMESPACE_NODES, NamespaceNodes};

/// Namespace nodes shared by several jobs: made once, then [`launch_on`](crate::launch_on)
/// runs ranks on them and [`NodeFabric::enter_on_spawn`] any other program, at the same time;
/// [`run_in_node`] puts a process that another program starts onto one. Dropping it kills
/// every process still inside, then the namespaces end. Needs root (or CAP_SYS_ADMIN and
/// CAP_NET_ADMIN), as [`NamespaceNodes`] do.
#[derive(Debug)]
pub struct NodeFabric {
    options: NamespaceNodes,
    fabric: Fabric,
}

impl NodeFabric {
    /// Makes `options.nodes` nodes (their links shaped to `options.rate` when given). The
    /// holders die with the calling thread, so build it on a thread that outlives its use.
    pub fn build(options: NamespaceNodes) -> Result<NodeFabric> {
        if options.nodes == 0 || options.nodes > MAX_NAMESPACE_NODES {
            return Err(Error::invalid(format!(
                "a node fabric has 1 to {MAX_NAMESPACE_NODES} nodes, not {}",
                options.nodes
            )));
        }
        Ok(NodeFabric { options, fabric: Fabric::build(&options)? })
    }

    /// The nodes and rate it was built with.
    pub fn options(&self) -> NamespaceNodes {
        self.options
    }

    /// The namespaces made, as `/proc/PID/ns/*` links name them (for
    /// [`namespace_holders`](crate::namespace_holders) once the fabric is dropped).
    pub fn namespaces(&self) -> Vec<String> {
        self.fabric.ids()
    }

    /// The process id of `node`'s holder: `/proc/PID/ns/{net,uts,mnt}` are the node's
    /// namespaces, which [`run_in_node`] enters. `None` for a node the fabric does not have.
    pub fn holder_pid(&self, node: usize) -> Option<u32> {
        self.fabric.holder_pid(node).and_then(|p| u32::try_from(p.as_raw()).ok())
    }

    /// Makes `cmd`'s child enter `node`'s namespaces before `exec`, return to this process's
    /// directory, unblock every signal (a mask blocked by
    /// [`forward_signals_to`](crate::forward_signals_to) would survive `exec`) and get
    /// `SIGKILL` when the spawning thread ends — as the ranks of a namespace job do.
    pub fn enter_on_spawn(&self, node: usize, cmd: &mut Command) -> Result<()> {
        let entry = self.fabric.entry(node)?;
        // SAFETY: the closure runs in the forked child before exec; it calls `sigprocmask` and
        // what `Entry::enter` calls (`setns`, `chdir`, `prctl`, `getppid`), async-signal-safe
        // system calls, and neither allocates nor locks (the entry was built before the fork).
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
                    .map_err(std::io::Error::from)?;
                entry.enter()
            });
        }
        Ok(())
    }

    /// The fabric the jobs run on.
    pub(crate) fn fabric(&self) -> &Fabric {
        &self.fabric
    }
}

/// How often [`run_in_node`] looks at its parent and its children.
const SUPERVISE_POLL: Duration = Duration::from_millis(50);
/// How long [`run_in_node`] goes on killing its descendants after its parent ended.
const ORPHAN_KILL_BOUND: Duration = Duration::from_secs(5);

/// Runs `program args…` inside the node whose holder is `holder_pid` (see
/// [`NodeFabric::holder_pid`]) and waits for it, as `ssh HOST CMD` does on a real node: it is
/// how a program that another program starts — an MPI daemon started through an `ssh`-like
/// agent — gets onto a node. This process enters the node's network, UTS and mount
/// namespaces (so call it from a single-threaded process: the kernel refuses to move a
/// threaded one into a mount namespace), returns to its directory, unblocks every signal, and
/// becomes a child subreaper, so that everything `program` starts stays its descendant. When
/// this process's parent ends before `program` does (the launcher was killed, even with
/// `SIGKILL`), it kills every descendant: a node's links vanish with its launcher, and a
/// daemon cut off that way would never hear that its peers are gone.
///
/// Returns `program`'s exit code (128 + the signal when a signal ended it) once it and every
/// process it left behind have ended; an error names the step that failed.
pub fn run_in_node(holder_pid: u32, program: &OsStr, args: &[OsString]) -> Result<i32> {
    let parent = nix::unistd::getppid();
    enter_holder_namespaces(holder_pid)?;
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| Error::errno("become a child subreaper", e))?;
    let child = Command::new(program)
        .args(args)
        .spawn()
        .map_err(|e| Error::io(format!("run {program:?} in the node of holder {holder_pid}"), e))?;
    let child = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let mut code = None;
    loop {
        // Reaps the child and every orphan handed to us; ECHILD: none is left.
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, c)) if pid == child => code = Some(c),
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => code = Some(128 + sig as i32),
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) | Err(Errno::EINTR) => {}
                Err(Errno::ECHILD) => return Ok(code.unwrap_or(1)),
                Err(e) => return Err(Error::errno("wait for the processes started in the node", e)),
            }
        }
        if nix::unistd::getppid() != parent {
            kill_descendants();
            return Err(Error::invalid(format!(
                "the parent of {program:?} ended first; everything it started in the node was killed"
            )));
        }
        std::thread::sleep(SUPERVISE_POLL);
    }
}

/// Kills every descendant of this process, reaping them as they end, until none is left or
/// [`ORPHAN_KILL_BOUND`] has passed.
fn kill_descendants() {
    let me = nix::unistd::getpid();
    let end = Instant::now() + ORPHAN_KILL_BOUND;
    while Instant::now() < end {
        for pid in descendants(me) {
            // A descendant reaped by its own parent since the scan could have had its pid
            // reused, but only within this subtree's lifetime of a few milliseconds; orphans
            // are ours to reap, so their pids stay theirs until we do.
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        }
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Err(Errno::ECHILD) => return,
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => return,
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every process below `root`, from the parent ids in `/proc/PID/stat`.
fn descendants(root: Pid) -> Vec<Pid> {
    let parent_of = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
    };
    let procs = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    let pairs: Vec<(i32, i32)> = procs
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|p| Some((p, parent_of(p)?)))
        .collect();
    let mut found = vec![root.as_raw()];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(pairs.iter().filter(|&&(_, pp)| pp == p).map(|&(c, _)| c));
        i += 1;
    }
    found.into_iter().skip(1).map(Pid::from_raw).collect()
}

/// Enters the namespaces of `holder_pid`, returns to the current directory there, and
/// unblocks every signal.
fn enter_holder_namespaces(holder_pid: u32) -> Result<()> {
    let cwd = std::env::current_dir().map_err(|e| Error::io("read the current directory", e))?;
    for (kind, flag) in
        [("net", CloneFlags::CLONE_NEWNET), ("uts", CloneFlags::CLONE_NEWUTS), ("mnt", CloneFlags::CLONE_NEWNS)]
    {
        let path = format!("/proc/{holder_pid}/ns/{kind}");
        let file = std::fs::File::open(&path)
            .map_err(|e| Error::io(format!("open {path} (is {holder_pid} the holder of a running node fabric?)"), e))?;
        nix::sched::setns(&file, flag)
            .map_err(|e| Error::errno(format!("enter {path} (needs root, and a single-threaded caller for mnt)"), e))?;
    }
    std::env::set_current_dir(&cwd)
        .map_err(|e| Error::io(format!("return to {} inside the node", cwd.display()), e))?;
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(|e| Error::errno("unblock signals", e))?;
    Ok(())
}
