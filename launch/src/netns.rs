//! Namespace nodes: each node of a job is a set of Linux namespaces on this host — its own
//! network stack, hostname and `/dev/shm` — so shared memory and CUDA IPC stay inside a node
//! and only the network carries the rest, as on separate machines.
//!
//! ```text
//!   switch namespace (network only)               node i: network + UTS + mount namespaces
//!   ┌──────────────────────────────┐              ┌───────────────────────────────────────┐
//!   │ bridge br0 ── node0 ─────────┼── veth ──────┼── eth0 10.57.0.1/24    hostname       │
//!   │           ── node1 ─────────┼── veth ──┐   │   lo                   weave-node0     │
//!   │           …                  │          │   │   /dev/shm: its own tmpfs              │
//!   └──────────────────────────────┘          └── node 1: eth0 10.57.0.2/24, weave-node1 …
//! ```
//!
//! Every namespace is held by a process ([`holder`](crate::holder)), never by a bind mount:
//! one holder for the switch, one per node; the ranks of node *i* enter node *i*'s namespaces
//! with `setns` in the forked child before `exec`, and die with the launcher
//! (`PR_SET_PDEATHSIG`) as the holders do. Once holders and ranks have ended, the kernel frees
//! the namespaces and every interface in them, so nothing is left behind on success, failure,
//! Ctrl-C, a killed rank or a killed launcher — and the host's own namespaces never get a
//! link, an address or a mount. Links are made over rtnetlink ([`netlink`](crate::netlink)).
//!
//! With a [`Rate`], each node's `eth0` (its sending direction) and its port on the bridge (its
//! receiving direction) get a `tbf` qdisc of that rate, so a node sends and receives at most
//! that much.

use std::ffi::CString;
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use nix::sched::CloneFlags;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::holder::{Holder, HolderKind};
use crate::netlink::{RouteSocket, Tbf};
use crate::rate::Rate;

/// Most nodes a namespace job can have (one /24 subnet).
pub const MAX_NAMESPACE_NODES: usize = 250;
/// `MASTER_PORT` of a namespace job unless the spec names one: torchrun's default. Node 0's
/// network namespace is fresh, so the port is always free there.
pub const NAMESPACE_MASTER_PORT: u16 = 29500;
/// The bridge in the switch namespace.
const BRIDGE: &str = "br0";
/// The interface of a node, as on a real host.
const NODE_IF: &str = "eth0";
/// Prefix length of the nodes' subnet.
const PREFIX: u8 = 24;

/// Namespace nodes for a job (see [`LaunchSpec::namespace_nodes`](crate::LaunchSpec::namespace_nodes)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceNodes {
    /// Number of nodes, 1 to [`MAX_NAMESPACE_NODES`].
    pub nodes: usize,
    /// Shape each node's link to this rate in each direction; `None`: as fast as the host goes.
    pub rate: Option<Rate>,
}

/// The address of node `node` on the bridge: `10.57.0.(node + 1)`. Node 0's is the job's
/// `MASTER_ADDR`.
pub fn node_address(node: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 57, 0, u8::try_from(node + 1).unwrap_or(u8::MAX))
}

/// The hostname of node `node`: `weave-node{node}`.
pub fn node_hostname(node: usize) -> String {
    format!("weave-node{node}")
}

/// The namespaces of one node, open, for its ranks to enter.
#[derive(Debug)]
struct NodeNamespaces {
    net: OwnedFd,
    uts: OwnedFd,
    mnt: OwnedFd,
}

/// The namespaces of a job and the processes holding them. Dropping it kills the holders;
/// the namespaces end when the last rank in them has ended too.
#[derive(Debug)]
pub(crate) struct Fabric {
    nodes: Vec<NodeNamespaces>,
    ids: Vec<String>,
    /// Declared last: dropped (killed) after the descriptors above are closed.
    holders: Vec<Holder>,
}

/// Opens `/proc/PID/ns/KIND` and reads its identity (`net:[4026532283]`).
fn open_ns(pid: Pid, kind: &str, label: &str) -> Result<(OwnedFd, String)> {
    let path = format!("/proc/{pid}/ns/{kind}");
    let what = || format!("open the {kind} namespace of {label} ({path})");
    let file = File::open(&path).map_err(|e| Error::io(what(), e))?;
    let id = std::fs::read_link(&path).map_err(|e| Error::io(what(), e))?;
    Ok((OwnedFd::from(file), id.to_string_lossy().into_owned()))
}

impl Fabric {
    /// Makes the switch and `opts.nodes` nodes and wires them; see the module documentation.
    /// On error, what was made so far is undone by dropping it (killing its holders).
    pub(crate) fn build(opts: &NamespaceNodes) -> Result<Fabric> {
        let mut fabric = Fabric { nodes: Vec::new(), ids: Vec::new(), holders: Vec::new() };
        fabric.holders.push(Holder::spawn(HolderKind::Net, "the switch")?);
        let (switch_net, id) = open_ns(fabric.holders[0].pid(), "net", "the switch")?;
        fabric.ids.push(id);
        for i in 0..opts.nodes {
            let label = format!("node {i}");
            let hostname = node_hostname(i);
            let holder = Holder::spawn(HolderKind::Node { hostname: &hostname }, &label)?;
            let pid = holder.pid();
            fabric.holders.push(holder);
            let mut open = |kind| {
                open_ns(pid, kind, &label).map(|(fd, id)| {
                    fabric.ids.push(id);
                    fd
                })
            };
            let (net, uts, mnt) = (open("net")?, open("uts")?, open("mnt")?);
            fabric.nodes.push(NodeNamespaces { net, uts, mnt });
        }
        fabric.wire(switch_net.as_fd(), opts.rate)?;
        Ok(fabric)
    }

    /// Creates the bridge, one veth pair per node, addresses, and the shaping.
    fn wire(&self, switch_net: BorrowedFd<'_>, rate: Option<Rate>) -> Result<()> {
        let mut sw = RouteSocket::open_in(switch_net, "the switch namespace")?;
        sw.create_bridge(BRIDGE)?;
        let bridge = sw.link_index(BRIDGE)?;
        sw.set_up(bridge, BRIDGE)?;
        let tbf = rate.map(|r| Tbf::for_rate(r.bytes_per_sec()));
        for (i, node) in self.nodes.iter().enumerate() {
            let place = format!("the namespace of node {i}");
            let port = format!("node{i}");
            sw.create_veth(&port, NODE_IF, node.net.as_fd(), &place)?;
            let index = sw.link_index(&port)?;
            sw.set_master(index, &port, bridge)?;
            if let Some(tbf) = &tbf {
                sw.add_tbf(index, &port, tbf)?;
            }
            sw.set_up(index, &port)?;
            let mut ns = RouteSocket::open_in(node.net.as_fd(), &place)?;
            let lo = ns.link_index("lo")?;
            ns.set_up(lo, "lo")?;
            let eth = ns.link_index(NODE_IF)?;
            ns.add_ipv4(eth, NODE_IF, node_address(i), PREFIX)?;
            if let Some(tbf) = &tbf {
                ns.add_tbf(eth, NODE_IF, tbf)?;
            }
            ns.set_up(eth, NODE_IF)?;
        }
        Ok(())
    }

    /// The namespaces made, as `/proc/PID/ns/*` links name them: the switch's network
    /// namespace, then each node's network, UTS and mount namespaces.
    pub(crate) fn ids(&self) -> Vec<String> {
        self.ids.clone()
    }

    /// The process id of `node`'s holder, whose `/proc/PID/ns/*` links are the node's
    /// namespaces; `None` for a node this fabric does not have.
    pub(crate) fn holder_pid(&self, node: usize) -> Option<Pid> {
        // holders[0] holds the switch.
        self.holders.get(node + 1).map(Holder::pid)
    }

    /// What a rank of `node` needs to enter it; an error for a node this fabric does not have.
    pub(crate) fn entry(&self, node: usize) -> Result<Entry> {
        let ns = self.nodes.get(node).ok_or_else(|| Error::invalid(format!("no namespace node {node}")))?;
        let cwd = std::env::current_dir()
            .map_err(|e| Error::io("read the current directory (ranks of namespace nodes start in it)", e))?;
        let cwd = CString::new(cwd.as_os_str().as_bytes())
            .map_err(|_| Error::invalid(format!("the current directory {cwd:?} holds a NUL byte")))?;
        Ok(Entry {
            net: ns.net.as_raw_fd(),
            uts: ns.uts.as_raw_fd(),
            mnt: ns.mnt.as_raw_fd(),
            cwd,
            launcher: nix::unistd::getpid(),
        })
    }
}

impl Drop for Fabric {
    /// Kills every process still inside the fabric's namespaces before the holders go: what a
    /// rank started outside its process group, or what another program placed in a node (an
    /// MPI daemon started through [`run_in_node`](crate::run_in_node)), would otherwise keep
    /// a namespace alive after the job.
    fn drop(&mut self) {
        let holders: Vec<Pid> = self.holders.iter().map(Holder::pid).collect();
        kill_processes_in(&self.ids, &holders);
    }
}

/// How a rank's forked child enters its node before `exec`: the node's namespace descriptors
/// (open in the launcher for as long as the [`Fabric`] lives, so in the child too), the
/// directory to return to (entering a mount namespace moves to its root), the launcher's pid.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    net: RawFd,
    uts: RawFd,
    mnt: RawFd,
    cwd: CString,
    launcher: Pid,
}

impl Entry {
    /// Enters the node's network, UTS and mount namespaces, returns to the launcher's
    /// directory, and arms `SIGKILL` for when the launcher dies. Runs in the forked child
    /// (single-threaded, which entering a mount namespace requires); it neither allocates nor
    /// locks.
    pub(crate) fn enter(&self) -> std::io::Result<()> {
        for (fd, ns) in [
            (self.net, CloneFlags::CLONE_NEWNET),
            (self.uts, CloneFlags::CLONE_NEWUTS),
            (self.mnt, CloneFlags::CLONE_NEWNS),
        ] {
            // SAFETY: `fd` is open: the fabric holding it outlives every spawn, and the child
            // has a copy of every descriptor of the launcher until exec.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            nix::sched::setns(fd, ns)?;
        }
        nix::unistd::chdir(self.cwd.as_c_str())?;
        nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
        if nix::unistd::getppid() != self.launcher {
            // The launcher died before the death signal was armed.
            return Err(std::io::Error::from(nix::errno::Errno::ESRCH));
        }
        Ok(())
    }
}

/// Checks that namespace nodes can be made here (root, or the needed capabilities; a kernel
/// with network, UTS and mount namespaces, veth, bridges and — with `rate` — `tbf`) by making
/// a one-node fabric and taking it down again. The error says what failed, e.g.
/// `unshare(CLONE_NEWNET | …)` with `EPERM` when not root.
pub fn namespace_nodes_available(rate: Option<Rate>) -> Result<()> {
    Fabric::build(&NamespaceNodes { nodes: 1, rate }).map(drop)
}

/// Every process in one of `namespaces`, as `/proc` shows them. A process that has exited (a
/// zombie) is in none.
fn processes_in(namespaces: &[String]) -> Vec<Pid> {
    let procs = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    let pids = procs.filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()).map(Pid::from_raw);
    pids.filter(|&p| is_inside(p, namespaces)).collect()
}

/// Whether process `pid` is in one of `namespaces` (network, UTS or mount).
fn is_inside(pid: Pid, namespaces: &[String]) -> bool {
    ["net", "uts", "mnt"].iter().any(|kind| {
        std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
            .is_ok_and(|t| namespaces.iter().any(|id| t.as_os_str() == id.as_str()))
    })
}

/// Passes over `/proc` at most this many times to kill what is inside a fabric's namespaces
/// (a process may fork while the previous pass kills its parent).
const SWEEP_PASSES: usize = 50;
/// Pause between two passes.
const SWEEP_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// Sends `SIGKILL` to every process in `namespaces` but `spare`, pass after pass until none is
/// left or [`SWEEP_PASSES`] passes are done (bounded: it never waits for a process that will
/// not die). Each process is signalled through a pidfd opened while it is seen in one of our
/// namespaces, so a pid reused meanwhile by another process is never signalled.
fn kill_processes_in(namespaces: &[String], spare: &[Pid]) {
    for _ in 0..SWEEP_PASSES {
        let inside: Vec<Pid> = processes_in(namespaces).into_iter().filter(|p| !spare.contains(p)).collect();
        if inside.is_empty() {
            return;
        }
        for pid in inside {
            kill_if_inside(pid, namespaces);
        }
        std::thread::sleep(SWEEP_PAUSE);
    }
}

/// Kills `pid` if, once a pidfd pins it, it is still in one of `namespaces`.
fn kill_if_inside(pid: Pid, namespaces: &[String]) {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; no memory
    // is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    let Ok(fd) = RawFd::try_from(fd) else { return };
    if fd < 0 {
        return; // Gone already (ESRCH), or a kernel before 5.3: nothing safe to do.
    }
    // SAFETY: `fd` was just returned by pidfd_open and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if is_inside(pid, namespaces) {
        // SAFETY: pidfd_send_signal takes the pidfd, a signal number, a null siginfo and flags 0.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
    }
}

/// What still holds any of `namespaces` (as [`LaunchReport::namespaces`](crate::LaunchReport::namespaces)
/// names them): processes in them, descriptors open on them, mounts of them. Empty once they
/// are gone — a namespace that nothing holds is freed by the kernel. For tests and checks
/// after a job; it reads `/proc`, so it sees what this process may see.
pub fn namespace_holders(namespaces: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    if namespaces.is_empty() {
        return found;
    }
    let held = |link: &std::path::Path| {
        std::fs::read_link(link).ok().map(|t| t.to_string_lossy().into_owned()).filter(|t| namespaces.contains(t))
    };
    let procs = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    for entry in procs.filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit())) {
        let dir = entry.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let who = format!("process {} ({})", entry.file_name().to_string_lossy(), comm.trim());
        for kind in ["net", "uts", "mnt"] {
            if let Some(id) = held(&dir.join("ns").join(kind)) {
                found.push(format!("{who} is in {id}"));
            }
        }
        for fd in std::fs::read_dir(dir.join("fd")).into_iter().flatten().flatten() {
            if let Some(id) = held(&fd.path()) {
                found.push(format!("{who} has {id} open as fd {}", fd.file_name().to_string_lossy()));
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mounts.lines().filter(|l| namespaces.iter().any(|id| l.contains(id.as_str()))) {
        found.push(format!("mounted: {line}"));
    }
    found
}

/// Waits, checking every 50 ms for up to `within`, until nothing holds any of `namespaces`
/// ([`namespace_holders`]): the kernel frees a job's namespaces only as the job's last
/// processes finish exiting, a moment after the job has ended. `Err` with what still holds
/// them at the deadline.
pub fn wait_namespaces_released(
    namespaces: &[String],
    within: std::time::Duration,
) -> std::result::Result<(), Vec<String>> {
    let now = std::time::Instant::now();
    // A `within` too long for the clock waits as long as it can, never panics.
    let end = now.checked_add(within).unwrap_or(now + std::time::Duration::from_secs(1 << 30));
    loop {
        let held = namespace_holders(namespaces);
        if held.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() >= end {
            return Err(held);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_have_addresses_and_hostnames_of_their_own() {
        assert_eq!(node_address(0), Ipv4Addr::new(10, 57, 0, 1));
        assert_eq!(node_address(MAX_NAMESPACE_NODES - 1), Ipv4Addr::new(10, 57, 0, 250));
        assert_eq!(node_hostname(3), "weave-node3");
        assert!(namespace_holders(&[]).is_empty());
        assert!(namespace_holders(&["net:[1]".into()]).is_empty());
    }
}
