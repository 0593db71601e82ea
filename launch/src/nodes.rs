//! Namespace nodes that outlive one job: a [`NodeFabric`] is made once, and several jobs —
//! ranks through [`launch_on`](crate::launch_on), any program through
//! [`NodeFabric::enter_on_spawn`], and processes that other programs start through
//! [`exec_in_node`] — run on the same nodes at the same time. `cargo xtask bench --nodes`
//! runs weave's ranks and Open MPI's on one fabric this way, so both cross the same links.
//!
//! Dropping the fabric kills every process still inside its namespaces, then the holders, so
//! the namespaces end with it (see [`netns`](crate::netns)).

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};

use crate::error::{Error, Result};
use crate::netns::{Fabric, MAX_NAMESPACE_NODES, NamespaceNodes};

/// Namespace nodes shared by several jobs: made once, then [`launch_on`](crate::launch_on)
/// runs ranks on them and [`NodeFabric::enter_on_spawn`] any other program, at the same time;
/// [`exec_in_node`] puts a process that another program starts onto one. Dropping it kills
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
    /// namespaces, which [`exec_in_node`] enters. `None` for a node the fabric does not have.
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

/// Replaces this process with `program args…` inside the node whose holder is `holder_pid`
/// (see [`NodeFabric::holder_pid`]): enters its network, UTS and mount namespaces, returns to
/// the current directory, unblocks every signal, and asks for `SIGKILL` when this process's
/// parent ends. It is how a program that another program starts — an MPI daemon started
/// through an `ssh`-like agent — gets onto a node. Call it from a single-threaded process
/// (the kernel refuses to move a threaded process into a mount namespace). Returns only on
/// failure, with the step that failed.
pub fn exec_in_node(holder_pid: u32, program: &OsStr, args: &[OsString]) -> Error {
    match enter_holder_namespaces(holder_pid) {
        Ok(()) => {
            let e = Command::new(program).args(args).exec();
            Error::io(format!("run {program:?} in the node of holder {holder_pid}"), e)
        }
        Err(e) => e,
    }
}

/// Enters the namespaces of `holder_pid` and prepares this process for `exec` there.
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
    let parent = nix::unistd::getppid();
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| Error::errno("set PR_SET_PDEATHSIG", e))?;
    if nix::unistd::getppid() != parent {
        return Err(Error::invalid("the parent process ended before the node was entered"));
    }
    Ok(())
}
