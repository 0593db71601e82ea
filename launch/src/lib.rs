//! # weave-launch
//!
//! The rank launcher: starts N copies of a program on this host as the ranks of one job,
//! watches them, and stops them all as soon as one fails.
//!
//! Every rank gets the torchrun-style variables that `comm_core::bootstrap::from_env` reads —
//! `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` — plus
//! the job secret `WEAVE_SECRET`. Rank-identity variables of other launchers (Open MPI, Slurm,
//! PMI; [`FOREIGN_RANK_VARS`]) are removed from the ranks' environment so that they cannot
//! contradict ours.
//!
//! Each rank runs in its own process group. When a rank exits non-zero or is killed by a signal,
//! or the timeout passes, the launcher sends `SIGKILL` to every remaining rank's process group
//! (which also ends what the rank started), reaps every child, and returns a [`LaunchReport`].
//! `SIGKILL` cannot be caught or ignored, so a stuck or signal-ignoring rank cannot make
//! [`launch`] wait forever.
//!
//! With [`LaunchSpec::namespace_nodes`] the ranks run as several nodes on this host, each node
//! a network, UTS and mount namespace with its own address, hostname and `/dev/shm`, its links
//! optionally shaped to a [`Rate`] (root only; see [`NamespaceNodes`] and
//! [`namespace_nodes_available`]); a [`NodeFabric`] holds such nodes for several jobs at once
//! ([`launch_on`]). [`LaunchSpec::posed_nodes`] is the fallback without root:
//! one network stack for all, the nodes told apart by `WEAVE_HOST_ID`.
//!
//! The crate needs only std, nix and libc: it starts processes and knows nothing of communicators,
//! so launcher binaries (`cargo xtask launch`) do not build the rest of weave. Its modules:
//! [`LaunchSpec`] (what to run), the environment each rank gets, the job of child processes
//! and its supervision, the output readers ([`Echo`]), cancelling ([`CancelToken`],
//! [`forward_signals_to`]), the [`LaunchReport`], namespace nodes (their holder processes, the
//! rtnetlink client that wires them, [`Rate`]), and [`parse_size`] for the byte sizes that
//! launcher and rank programs take on their command lines.
//!
//! ```no_run
//! use std::time::Duration;
//! use weave_launch::{launch, LaunchSpec};
//!
//! let spec = LaunchSpec::new(4, "target/debug/my-rank-program")
//!     .arg("--size=1M")
//!     .timeout(Duration::from_secs(60))
//!     .echo(true);
//! let report = launch(&spec)?;
//! if !report.success() {
//!     eprintln!("{}", report.summary());
//! }
//! # Ok::<(), weave_launch::Error>(())
//! ```

mod cancel;
mod error;
mod holder;
mod job;
mod netlink;
mod netns;
mod nodes;
mod output;
mod rank_env;
mod rate;
mod report;
mod seconds;
mod size;
mod spec;

use std::time::Instant;

pub use cancel::{CancelToken, forward_signals_to};
pub use error::{Error, Result};
pub use netns::{
    MAX_NAMESPACE_NODES, NAMESPACE_MASTER_PORT, NamespaceNodes, namespace_holders, namespace_nodes_available,
    node_address, node_hostname, wait_namespaces_released,
};
pub use nodes::{NodeFabric, run_in_node};
pub use output::{Echo, OUTPUT_GRACE};
pub use rank_env::FOREIGN_RANK_VARS;
pub use rate::{MIN_RATE_BYTES_PER_SEC, Rate, RateError};
pub use report::{LaunchReport, RankExit, RankReport};
pub use seconds::parse_seconds;
pub use size::parse_size;
pub use spec::{DEFAULT_CANCEL_GRACE, LaunchSpec};

/// The signal type of [`CancelToken::cancel`] and [`LaunchReport::cancelled`], re-exported so
/// callers need no `nix` dependency of their own.
pub use nix::sys::signal::Signal;

use job::Job;
use netns::Fabric;

/// Starts `spec.ranks` copies of `spec.program`, waits until all exit (or one fails, or the
/// timeout passes, or the job is cancelled), and reports how each ended.
///
/// With [`LaunchSpec::namespace_nodes`], the nodes' namespaces are made first (see
/// [`NamespaceNodes`]) and taken down once every rank has been reaped.
///
/// Returns `Err` only when the job could not be started: a bad spec
/// ([`Error::InvalidArgument`]), no free port, no randomness for the secret, namespaces that
/// could not be made, or a rank that could not be spawned ([`Error::Io`] naming the program)
/// — in which case the ranks already started are killed and reaped first. Failures of the
/// ranks themselves are in the report.
pub fn launch(spec: &LaunchSpec) -> Result<LaunchReport> {
    let start = Instant::now();
    spec.validate()?;
    let fabric = spec.namespace_nodes.as_ref().map(Fabric::build).transpose()?;
    let (mut job, outcome, master_port) = run_job(spec, fabric.as_ref(), start)?;
    let namespaces = fabric.as_ref().map(Fabric::ids).unwrap_or_default();
    // Kills what the ranks left inside the nodes, so their output pipes close too.
    drop(fabric);
    Ok(report(&mut job, outcome, master_port, namespaces, start))
}

/// Like [`launch`], on the nodes of `nodes` instead of namespaces of its own: rank `r` runs on
/// node `r / (spec.ranks / nodes)`, and the nodes stay up when the job ends, for the other
/// jobs on them. `spec.namespace_nodes` must be `None` or `nodes`' options, and
/// `spec.posed_nodes` `None`. The report's `namespaces` are the fabric's.
pub fn launch_on(spec: &LaunchSpec, nodes: &NodeFabric) -> Result<LaunchReport> {
    let start = Instant::now();
    if spec.namespace_nodes.is_some_and(|n| n != nodes.options()) {
        return Err(Error::invalid(format!(
            "LaunchSpec.namespace_nodes is {:?}, but the job runs on a fabric of {:?}; leave it None",
            spec.namespace_nodes,
            nodes.options()
        )));
    }
    let mut spec = spec.clone();
    spec.namespace_nodes = Some(nodes.options());
    spec.validate()?;
    let (mut job, outcome, master_port) = run_job(&spec, Some(nodes.fabric()), start)?;
    Ok(report(&mut job, outcome, master_port, nodes.namespaces(), start))
}

/// Starts the ranks of `spec` (on `fabric`'s nodes when given) and supervises them; returns
/// the job with every rank reaped.
fn run_job(spec: &LaunchSpec, fabric: Option<&Fabric>, start: Instant) -> Result<(Job, job::Outcome, u16)> {
    let secret = rank_env::secret_from_env()?;
    let master_addr = match fabric {
        Some(_) => node_address(0).to_string(),
        None => spec.master_addr.clone(),
    };
    let master_port = match (spec.master_port, fabric) {
        (Some(p), _) => p,
        (None, Some(_)) => NAMESPACE_MASTER_PORT,
        (None, None) => rank_env::free_port(&master_addr)?,
    };
    let per_node = spec.ranks_per_node().max(1);
    let mut job = Job::new();
    for rank in 0..spec.ranks {
        let entry = fabric.map(|f| f.entry(rank / per_node)).transpose()?;
        // On error, dropping `job` kills and reaps the ranks already started.
        job.spawn_rank(spec, rank, &secret, (&master_addr, master_port), entry)?;
    }
    let outcome = job.supervise(spec, start);
    job.kill_and_reap();
    Ok((job, outcome, master_port))
}

/// The report of a job whose ranks have all been reaped.
fn report(
    job: &mut Job,
    outcome: job::Outcome,
    master_port: u16,
    namespaces: Vec<String>,
    start: Instant,
) -> LaunchReport {
    let elapsed = start.elapsed();
    LaunchReport {
        ranks: job.reports(),
        timed_out: outcome.timed_out,
        cancelled: outcome.cancelled,
        first_failure: outcome.first_failure,
        master_port,
        namespaces,
        elapsed,
    }
}
