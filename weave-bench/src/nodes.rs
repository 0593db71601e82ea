//! `weave-bench --nodes N`: weave and Open MPI on the same simulated nodes.
//!
//! One [`NodeFabric`] of N namespace nodes (see `weave_launch`'s netns module) carries both
//! jobs. weave's ranks run on it through [`weave_launch::launch_on`], as `cargo xtask
//! multinode` runs them. Open MPI's `mpirun` runs inside node 0 with a hostfile of the node
//! addresses (`10.57.0.1 slots=R`, …), TCP between nodes on `eth0` (`--mca btl
//! self,vader,tcp`, `btl_tcp_if_include eth0`, `oob_tcp_if_include eth0`), and an `ssh`-like
//! agent written here (`--mca plm_rsh_agent`): mpirun calls it as `agent [options] HOST CMD…`
//! to start its daemon on another node, and the agent runs `weave-bench node-exec` ([`crate::node_exec`]), which
//! enters the namespaces of HOST's node from Rust ([`weave_launch::run_in_node`]) and runs
//! `sh -c CMD` there, killing what it started if mpirun ends first (even when weave-bench is killed
//! with `SIGKILL`, which takes the nodes' links along before any peer could notice). With a rate, every node's link is shaped for both jobs alike.
//!
//! Nothing is left behind: dropping [`BenchNodes`] deletes the hostfile and the agent and
//! drops the fabric, which kills whatever is still inside the nodes (mpirun's daemons
//! included) before the namespaces go; [`BenchNodes::finish`] then checks that nothing holds
//! them any more.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use weave_launch::{NamespaceNodes, NodeFabric, Rate, namespace_holders, node_address, node_hostname};

/// The namespace nodes of one `bench --nodes` run and the files Open MPI needs to use them.
pub(crate) struct BenchNodes {
    fabric: NodeFabric,
    per_node: usize,
    hostfile: PathBuf,
    agent: PathBuf,
}

impl BenchNodes {
    /// Makes `nodes` namespace nodes (links shaped to `rate`) for `per_node` ranks each, and
    /// writes mpirun's hostfile and agent under `dir`. Call it on the main thread: the nodes
    /// end with the thread that made them.
    pub(crate) fn make(nodes: usize, per_node: usize, rate: Option<Rate>, dir: &Path) -> Result<BenchNodes, String> {
        let fabric = NodeFabric::build(NamespaceNodes { nodes, rate }).map_err(|e| {
            format!(
                "bench --nodes runs weave and Open MPI on network-namespace nodes, and none can be made here \
                 ({e}).\nRun it as root (or with CAP_SYS_ADMIN and CAP_NET_ADMIN). It does not fall back to posed \
                 nodes: Open MPI would see one host and use shared memory between all ranks, so the two libraries \
                 would not cross the same links; for weave alone on posed nodes use `cargo xtask multinode --posed`."
            )
        })?;
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        remove_stale_files(dir);
        let me = std::process::id();
        let n = BenchNodes {
            fabric,
            per_node,
            hostfile: dir.join(format!("mpi-hosts-{me}")),
            agent: dir.join(format!("mpi-node-agent-{me}.sh")),
        };
        let hosts: String = (0..nodes).map(|i| format!("{} slots={per_node}\n", node_address(i))).collect();
        std::fs::write(&n.hostfile, hosts).map_err(|e| format!("cannot write {}: {e}", n.hostfile.display()))?;
        let weave_bench = std::env::current_exe()
            .map_err(|e| format!("cannot find the weave-bench binary for mpirun's agent: {e}"))?;
        let pids = (0..nodes).map(|i| n.fabric.holder_pid(i).ok_or_else(|| format!("node {i} has no holder")));
        let pids = pids.collect::<Result<Vec<u32>, String>>()?;
        let script = agent_script(&weave_bench, &pids);
        write_executable(&n.agent, &script)?;
        Ok(n)
    }

    /// The fabric weave's ranks run on.
    pub(crate) fn fabric(&self) -> &NodeFabric {
        &self.fabric
    }

    /// How many nodes this run has.
    pub(crate) fn count(&self) -> usize {
        self.fabric.options().nodes
    }

    /// "2 nodes x 2 ranks (network namespaces …)", for the table's title.
    pub(crate) fn describe(&self) -> String {
        let o = self.fabric.options();
        let last = o.nodes - 1;
        let shaped = o.rate.map_or_else(|| "links not shaped".to_string(), |r| format!("links shaped to {r} each way"));
        format!(
            "{} node(s) x {} rank(s) (network namespaces {}..{}, {}..{}, {shaped}; shared memory in a node, TCP across)",
            o.nodes,
            self.per_node,
            node_hostname(0),
            node_hostname(last),
            node_address(0),
            node_address(last),
        )
    }

    /// `mpirun` with the options that place Open MPI `major` on the nodes, as a command that
    /// starts inside node 0 (and dies with the calling thread). `oversubscribed`: the ranks of
    /// all nodes outnumber this host's CPUs (see [`mpirun_node_args`]).
    pub(crate) fn mpirun(&self, mpirun: &Path, major: u32, oversubscribed: bool) -> Result<Command, String> {
        let mut cmd = Command::new(mpirun);
        cmd.args(mpirun_node_args(major, self.per_node, &self.hostfile, &self.agent, oversubscribed));
        self.fabric.enter_on_spawn(0, &mut cmd).map_err(|e| format!("cannot place mpirun on node 0: {e}"))?;
        Ok(cmd)
    }

    /// Takes the nodes down (killing whatever is still in them) and checks that nothing holds
    /// their namespaces any more.
    pub(crate) fn finish(self) -> Result<(), String> {
        let namespaces = self.fabric.namespaces();
        drop(self);
        let left = namespace_holders(&namespaces);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("the bench nodes' namespaces are still held:\n  {}", left.join("\n  ")))
        }
    }
}

impl Drop for BenchNodes {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.hostfile);
        let _ = std::fs::remove_file(&self.agent);
    }
}

/// Deletes the per-run files (`mpi-hosts-PID`, `mpi-node-agent-PID.sh`, `turns-PID.sock`) that
/// runs killed with `SIGKILL` left in `dir`: those whose process is gone.
fn remove_stale_files(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = ["mpi-hosts-", "mpi-node-agent-", "turns-"]
            .iter()
            .find_map(|prefix| name.strip_prefix(prefix))
            .map(|rest| rest.trim_end_matches(".sh").trim_end_matches(".sock"))
            .and_then(|pid| pid.parse::<u32>().ok());
        if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// mpirun's options for Open MPI `major` across namespace nodes: root, more ranks than
/// cores, no binding (each node's daemon would bind as if it had the host to itself),
/// `per_node` ranks on each node, filled node by node as weave's are (`ppr`: the hostfile's
/// slots alone let Open MPI 4.1.6 pack a 2 x 1 job onto node 0), shared memory in a node and TCP on `eth0` across, and
/// daemons started through `agent` (in a tree, the default: with `plm_rsh_no_tree_spawn`
/// mpirun would add `--daemonize`, and a daemon that left its agent survives a killed
/// xtask, its ranks spinning on). `oversubscribed` (the ranks of all
/// nodes outnumber the host's CPUs) adds `--mca mpi_yield_when_idle 1`, which mpirun sets by
/// itself on one host with more ranks than cores but cannot see here, as each node's slots
/// hold its ranks: without it the waiting ranks spin and starve the ones with work (8 B
/// all-reduce on 2 x 2 ranks on 2 cores: 8-26 ms instead of 55 us).
pub(crate) fn mpirun_node_args(
    major: u32,
    per_node: usize,
    hostfile: &Path,
    agent: &Path,
    oversubscribed: bool,
) -> Vec<OsString> {
    let btl = if major >= 5 { "self,sm,tcp" } else { "self,vader,tcp" };
    let mut v: Vec<OsString> = [
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "--map-by",
        &format!("ppr:{per_node}:node"),
        "--mca",
        "pml",
        "ob1",
        "--mca",
        "btl",
        btl,
        "--mca",
        "btl_tcp_if_include",
        "eth0",
        "--mca",
        "oob_tcp_if_include",
        "eth0",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    if oversubscribed {
        v.extend(["--mca", "mpi_yield_when_idle", "1"].map(OsString::from));
    }
    // `plm rsh` by name: an environment that sets OMPI_MCA_plm=isolated (the GPU hosts do) would
    // otherwise keep every rank on node 0.
    v.extend(["--mca", "plm", "rsh"].map(OsString::from));
    v.extend(["--mca".into(), "plm_rsh_agent".into(), agent.into(), "--hostfile".into(), hostfile.into()]);
    v
}

/// The agent script: `exec WEAVE_BENCH node-exec --node ADDR=PID --node HOSTNAME=PID … -- "$@"`.
fn agent_script(weave_bench: &Path, holder_pids: &[u32]) -> String {
    let quoted = format!("'{}'", weave_bench.to_string_lossy().replace('\'', r"'\''"));
    let mut nodes = String::new();
    for (i, pid) in holder_pids.iter().enumerate() {
        nodes.push_str(&format!(" --node {}={pid} --node {}={pid}", node_address(i), node_hostname(i)));
    }
    format!(
        "#!/bin/sh\n\
         # mpirun's rsh agent for one run of `weave-bench --nodes` (deleted after it): mpirun calls\n\
         # it as `agent [ssh options] HOST CMD...`; it runs CMD inside the namespaces of HOST's node.\n\
         exec {quoted} node-exec{nodes} -- \"$@\"\n"
    )
}

/// Writes `text` to `path` with mode 0755.
fn write_executable(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("cannot make {} executable: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpirun_runs_tcp_across_nodes_through_the_agent() {
        let args: Vec<String> = mpirun_node_args(4, 2, Path::new("/t/hosts"), Path::new("/t/agent.sh"), false)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let joined = args.join(" ");
        assert!(joined.contains("--mca btl self,vader,tcp --mca btl_tcp_if_include eth0"), "{joined}");
        assert!(joined.contains("--mca oob_tcp_if_include eth0"), "{joined}");
        assert!(joined.ends_with("--mca plm rsh --mca plm_rsh_agent /t/agent.sh --hostfile /t/hosts"), "{joined}");
        assert!(joined.contains("--map-by ppr:2:node"), "{joined}");
        assert!(joined.contains("--bind-to none") && !joined.contains("yield") && !joined.contains("tree_spawn"));
        let five = mpirun_node_args(5, 1, Path::new("h"), Path::new("a"), true);
        assert!(five.iter().any(|a| a == "self,sm,tcp") && five.iter().any(|a| a == "mpi_yield_when_idle"));
        let script = agent_script(Path::new("/x/it's/weave-bench"), &[7, 9]);
        assert!(script.contains(r"exec '/x/it'\''s/weave-bench' node-exec --node 10.57.0.1=7 --node weave-node0=7"));
        assert!(script.contains("--node 10.57.0.2=9 --node weave-node1=9 -- \"$@\""), "{script}");
    }
}
