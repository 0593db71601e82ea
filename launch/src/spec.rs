//! What to launch and how: the [`LaunchSpec`] and its builder methods.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::netns::{MAX_NAMESPACE_NODES, NamespaceNodes};
use crate::output::Echo;
use crate::rate::Rate;

/// Default time a rank gets to exit after a cancel request forwarded its signal, before the
/// launcher sends `SIGKILL`.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(3);

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
    /// Keep every output line in the report
    /// ([`RankReport::stdout`](crate::RankReport::stdout) and
    /// [`RankReport::stderr`](crate::RankReport::stderr)).
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
    /// Split the ranks into this many posed nodes of equal size on this host: consecutive
    /// ranks share a node, and each rank gets its node's `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
    /// `GROUP_RANK` and a `WEAVE_HOST_ID` of its own node, so shared memory and CUDA IPC stay
    /// inside a node and a network transport carries the rest. `None`: one node.
    pub posed_nodes: Option<usize>,
    /// Run the ranks as nodes that are Linux namespaces on this host, each with its own network
    /// stack, hostname and `/dev/shm` (see [`NamespaceNodes`]), optionally with shaped links:
    /// consecutive ranks share a node, each rank gets its node's `LOCAL_RANK`,
    /// `LOCAL_WORLD_SIZE` and `GROUP_RANK`, `MASTER_ADDR` is node 0's address
    /// ([`node_address`](crate::node_address)), and `master_addr` is not used. Needs root
    /// (see [`namespace_nodes_available`](crate::namespace_nodes_available)). Excludes
    /// `posed_nodes`. `None`: the ranks run in this process's namespaces.
    pub namespace_nodes: Option<NamespaceNodes>,
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
            posed_nodes: None,
            namespace_nodes: None,
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

    /// Splits the ranks into `nodes` posed nodes (see [`LaunchSpec::posed_nodes`]).
    pub fn posed_nodes(mut self, nodes: usize) -> Self {
        self.posed_nodes = Some(nodes);
        self
    }

    /// Splits the ranks into `nodes` namespace nodes, their links shaped to `rate` when given
    /// (see [`LaunchSpec::namespace_nodes`]).
    pub fn namespace_nodes(mut self, nodes: usize, rate: Option<Rate>) -> Self {
        self.namespace_nodes = Some(NamespaceNodes { nodes, rate });
        self
    }

    /// Number of nodes: posed or namespace nodes, else 1.
    pub fn nodes(&self) -> usize {
        match (self.posed_nodes, self.namespace_nodes) {
            (Some(nodes), _) | (None, Some(NamespaceNodes { nodes, .. })) => nodes,
            (None, None) => 1,
        }
    }

    /// Ranks per node: all of them, or the posed or namespace nodes' share.
    pub fn ranks_per_node(&self) -> usize {
        match self.nodes() {
            0 => self.ranks,
            nodes => self.ranks / nodes,
        }
    }

    /// Rejects a spec no job can start from: no ranks, no program, no master address, posed
    /// nodes that do not split the ranks evenly.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.ranks == 0 {
            return Err(Error::invalid("LaunchSpec.ranks is 0; launch at least one rank"));
        }
        if let Some(nodes) = self.posed_nodes
            && (nodes == 0 || !self.ranks.is_multiple_of(nodes))
        {
            return Err(Error::invalid(format!(
                "{} ranks do not split into {nodes} posed nodes of equal size",
                self.ranks
            )));
        }
        if let Some(NamespaceNodes { nodes, .. }) = self.namespace_nodes {
            if self.posed_nodes.is_some() {
                return Err(Error::invalid("LaunchSpec sets both posed_nodes and namespace_nodes; choose one"));
            }
            if nodes == 0 || nodes > MAX_NAMESPACE_NODES || !self.ranks.is_multiple_of(nodes) {
                return Err(Error::invalid(format!(
                    "{} ranks do not split into {nodes} namespace nodes of equal size (1 to {MAX_NAMESPACE_NODES} \
                     nodes)",
                    self.ranks
                )));
            }
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
