//! Namespace holders: child processes whose only job is to be inside fresh namespaces, so
//! that the namespaces exist exactly as long as a process of ours is in them.
//!
//! A holder is forked (not executed: it needs no program), puts itself in its own process
//! group (a Ctrl-C on the terminal does not reach it), asks for `SIGKILL` when its parent
//! thread dies (`PR_SET_PDEATHSIG`, so a launcher killed with `SIGKILL` takes its holders
//! along), closes every inherited descriptor (it must not keep another job's pipes open),
//! unshares the namespaces it was asked for, sets them up, reports success or the failing step
//! and its errno through a pipe, then sleeps until it is killed.
//!
//! Namespaces are never bind-mounted: when the holder and the ranks that entered its
//! namespaces have ended, the kernel frees them, and with a network namespace every interface
//! in it. Nothing needs undoing, whichever way the launcher ends.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::MsFlags;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sched::CloneFlags;
use nix::sys::signal::{self, Signal};
use nix::unistd::{ForkResult, Pid};

use crate::error::{Error, Result};

/// How long a holder may take to set up its namespaces before the launcher gives up on it.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// What a holder sets up.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HolderKind<'a> {
    /// A network namespace only (the switch holding the bridge).
    Net,
    /// A node: network, UTS (with this hostname) and mount namespaces, with all mounts made
    /// private, a fresh tmpfs on `/dev/shm` and a sysfs of its own on `/sys`.
    Node {
        /// The node's hostname.
        hostname: &'a str,
    },
}

/// The steps a holder takes, as reported through its status pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum Step {
    Ready = 0,
    ParentGone = 1,
    Unshare = 2,
    Hostname = 3,
    MountsPrivate = 4,
    MountShm = 5,
}

impl Step {
    fn describe(code: u32, kind: HolderKind<'_>) -> String {
        match code {
            c if c == Step::ParentGone as u32 => "set PR_SET_PDEATHSIG (or the launcher ended meanwhile)".into(),
            c if c == Step::Unshare as u32 => match kind {
                HolderKind::Net => "unshare(CLONE_NEWNET)".into(),
                HolderKind::Node { .. } => "unshare(CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWNS)".into(),
            },
            c if c == Step::Hostname as u32 => "sethostname".into(),
            c if c == Step::MountsPrivate as u32 => "make every mount private (mount / MS_REC|MS_PRIVATE)".into(),
            c if c == Step::MountShm as u32 => "mount a fresh tmpfs on /dev/shm".into(),
            c => format!("an unknown step {c}"),
        }
    }
}

/// A running holder process, killed and reaped on drop.
#[derive(Debug)]
pub(crate) struct Holder {
    pid: Pid,
}

impl Holder {
    /// Forks a holder of `kind` and waits (at most [`SETUP_TIMEOUT`]) until its namespaces are
    /// ready. `label` names it in errors ("node 1").
    pub(crate) fn spawn(kind: HolderKind<'_>, label: &str) -> Result<Holder> {
        // Everything the child needs is prepared here: after the fork it must not allocate.
        let hostname = match kind {
            HolderKind::Node { hostname } => Some(
                CString::new(hostname)
                    .map_err(|_| Error::invalid(format!("hostname {hostname:?} of {label} holds a NUL byte")))?,
            ),
            HolderKind::Net => None,
        };
        let flags = match kind {
            HolderKind::Net => CloneFlags::CLONE_NEWNET,
            HolderKind::Node { .. } => CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWNS,
        };
        let parent = nix::unistd::getpid();
        let (status_rd, status_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
            .map_err(|e| Error::errno(format!("create the status pipe of the namespace holder of {label}"), e))?;
        // SAFETY: the child runs only `holder_main`, which makes system calls through nix
        // wrappers that neither allocate nor take locks (every string was built before the
        // fork), and ends in `_exit` or in a `pause` loop; it never returns into Rust code that
        // could touch state another thread of the parent left locked.
        match unsafe { nix::unistd::fork() } {
            Ok(ForkResult::Child) => holder_main(parent, flags, hostname.as_deref(), status_wr),
            Ok(ForkResult::Parent { child }) => {
                drop(status_wr);
                let holder = Holder { pid: child };
                holder.wait_ready(&status_rd, kind, label)?;
                Ok(holder)
            }
            Err(e) => Err(Error::errno(format!("fork the namespace holder of {label}"), e)),
        }
    }

    /// The holder's process id.
    pub(crate) fn pid(&self) -> Pid {
        self.pid
    }

    /// Reads the holder's status report.
    fn wait_ready(&self, status: &OwnedFd, kind: HolderKind<'_>, label: &str) -> Result<()> {
        let what = format!("set up the namespaces of {label} (holder pid {})", self.pid);
        let mut fds = [PollFd::new(status.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(SETUP_TIMEOUT).unwrap_or(PollTimeout::MAX);
        loop {
            match nix::poll::poll(&mut fds, timeout) {
                Ok(0) => {
                    return Err(Error::io(
                        what,
                        std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("no report within {SETUP_TIMEOUT:?}"),
                        ),
                    ));
                }
                Ok(_) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(Error::errno(format!("{what} (poll its status pipe)"), e)),
            }
        }
        let mut report = [0u8; 8];
        let n = loop {
            match nix::unistd::read(status, &mut report) {
                Err(Errno::EINTR) => continue,
                other => break other.map_err(|e| Error::errno(format!("{what} (read its status pipe)"), e))?,
            }
        };
        if n != report.len() {
            return Err(Error::io(
                what,
                std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the holder ended without a report"),
            ));
        }
        let step = u32::from_ne_bytes([report[0], report[1], report[2], report[3]]);
        let errno = i32::from_ne_bytes([report[4], report[5], report[6], report[7]]);
        if step == Step::Ready as u32 {
            return Ok(());
        }
        let e = Errno::from_raw(errno);
        Err(Error::io(
            format!("{what}: {}", Step::describe(step, kind)),
            std::io::Error::new(
                std::io::Error::from_raw_os_error(errno).kind(),
                format!("{e:?} ({}, errno {errno})", e.desc()),
            ),
        ))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // The holder is our unreaped child until waitpid below, so its pid is still ours.
        // SIGKILL cannot be blocked, so the wait is short.
        let _ = signal::kill(self.pid, Signal::SIGKILL);
        while let Err(Errno::EINTR) = nix::sys::wait::waitpid(self.pid, None) {}
    }
}

/// The forked holder: sets up its namespaces, reports through `status`, sleeps until killed.
/// Only async-signal-safe system calls from here on.
fn holder_main(parent: Pid, flags: CloneFlags, hostname: Option<&CStr>, status: OwnedFd) -> ! {
    let report = |step: Step, errno: i32| {
        let mut msg = [0u8; 8];
        msg[..4].copy_from_slice(&(step as u32).to_ne_bytes());
        msg[4..].copy_from_slice(&errno.to_ne_bytes());
        let _ = nix::unistd::write(&status, &msg);
    };
    let fail = |step: Step, e: Errno| -> ! {
        report(step, e as i32);
        exit_now()
    };
    let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        fail(Step::ParentGone, e);
    }
    if nix::unistd::getppid() != parent {
        // The launcher died before the death signal was armed.
        exit_now();
    }
    close_inherited(status.as_raw_fd());
    if let Err(e) = nix::sched::unshare(flags) {
        fail(Step::Unshare, e);
    }
    if let Some(name) = hostname {
        if let Err(e) = nix::unistd::sethostname(std::ffi::OsStr::from_bytes(name.to_bytes())) {
            fail(Step::Hostname, e);
        }
        let none: Option<&CStr> = None;
        // Private first: nothing mounted in this namespace may propagate to the host's.
        if let Err(e) = nix::mount::mount(none, c"/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none) {
            fail(Step::MountsPrivate, e);
        }
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        if let Err(e) = nix::mount::mount(Some(c"tmpfs"), c"/dev/shm", Some(c"tmpfs"), flags, Some(c"mode=1777")) {
            fail(Step::MountShm, e);
        }
        // A sysfs of the new network namespace, so /sys/class/net lists the node's interfaces
        // (as `ip netns exec` does). Best effort: where it cannot be mounted, /sys keeps
        // showing the host's interfaces, which misleads tools but breaks nothing.
        let _ = nix::mount::mount(Some(c"sysfs"), c"/sys", Some(c"sysfs"), flags | MsFlags::MS_NOEXEC, none);
    }
    report(Step::Ready, 0);
    drop(status);
    loop {
        nix::unistd::pause();
    }
}

/// Ends the forked holder at once, without running exit handlers or destructors that belong to
/// the parent's state.
fn exit_now() -> ! {
    // SAFETY: `_exit` is async-signal-safe and ends the process; nothing runs after it.
    unsafe { libc::_exit(1) }
}

/// Closes every descriptor but `keep` (the status pipe): the holder outlives the moment it
/// was forked, and must not hold pipes or sockets the launcher (or a concurrent job in the same
/// process) opened, or their readers would wait for it.
fn close_inherited(keep: i32) {
    let keep = u32::try_from(keep).unwrap_or(0);
    // SAFETY: close_range only closes descriptors of this (single-threaded, forked) process;
    // none of them is used again except `keep`, which stays open.
    let ranges_closed = unsafe {
        (keep == 0 || libc::syscall(libc::SYS_close_range, 0u32, keep - 1, 0u32) == 0)
            && libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32) == 0
    };
    if !ranges_closed {
        // Kernels before 5.9: close them one by one up to a generous bound.
        for fd in (0..65_536).filter(|&fd| fd != keep as i32) {
            // SAFETY: as above; closing a descriptor that is not open just fails with EBADF.
            unsafe {
                libc::close(fd);
            }
        }
    }
}
