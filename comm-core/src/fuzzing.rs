//! Entry points for the fuzz targets of `fuzz/` (feature `fuzzing`; `cargo xtask fuzz`): the
//! crate's private decoders, each run on arbitrary bytes as a message from a peer or a stranger
//! meets them. Each returns whatever the bytes; it panics only on a finding — a decoder that
//! panics, or a message it accepts that does not encode back to the same bytes.

/// The TCP bootstrap's messages (root hello, root acknowledgement, group table, rank table, peer
/// hello): the first byte picks one, the next two give the job's world size and root count,
/// the rest is the message. Returns whether the decoder accepted it.
pub fn tcp_bootstrap_message(data: &[u8]) -> bool {
    crate::bootstrap::tcp::fuzzing::message(data)
}

/// A rank's endpoint table (host identity and transports, exchanged when a communicator is
/// built), as rank 0 sent it.
pub fn endpoint_table(data: &[u8]) {
    if let Ok((host, table)) = crate::endpoints::decode(data, 0) {
        let again = crate::endpoints::encode(0, &host, &table).expect("a decoded table re-encodes");
        assert_eq!(crate::endpoints::decode(&again, 0).expect("a re-encoded table decodes"), (host, table));
    }
}

/// A registration handshake's status from a peer (whether it mapped this rank's memory): an
/// accepted "mapped" status is the one encoding of it.
pub fn registration_status(data: &[u8]) {
    if let Ok(None) = crate::registration::decode_status(data, 0) {
        assert_eq!(crate::registration::encode_status(None), data);
    }
}

/// The variables of `data`: lines of `NAME=VALUE` (bytes that are not UTF-8 replaced).
fn variables(data: &[u8]) -> std::collections::HashMap<String, String> {
    String::from_utf8_lossy(data)
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

/// The communicator's settings (`WEAVE_TIMEOUT`, `WEAVE_TRANSPORTS`, `WEAVE_HOST_ID`,
/// `WEAVE_ALGO`, `WEAVE_HOST_SCRATCH`) from lines of `NAME=VALUE`: an error or a config, never a
/// panic. Returns whether they were accepted.
pub fn config_variables(data: &[u8]) -> bool {
    let vars = variables(data);
    crate::config::Config::from_vars(|name| vars.get(name).cloned()).is_ok()
}

/// A launcher's rendezvous (torchrun, Open MPI, Slurm variables, `WEAVE_SECRET`) from lines of
/// `NAME=VALUE`: an error or a rendezvous, never a panic. Returns whether they were accepted.
pub fn rendezvous_variables(data: &[u8]) -> bool {
    let vars = variables(data);
    crate::bootstrap::EnvRendezvous::from_vars(|name| vars.get(name).cloned()).is_ok()
}

/// Valid inputs of the entry points, by target name: seeds for their corpora.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut seeds: Vec<(&str, Vec<u8>)> =
        crate::bootstrap::tcp::fuzzing::seeds().into_iter().map(|s| ("tcp_bootstrap", s)).collect();
    let config = "WEAVE_TIMEOUT=2.5s\nWEAVE_TRANSPORTS=shm,tcp\nWEAVE_HOST_ID=node-3\nWEAVE_ALGO=all_reduce=ring\n\
                  WEAVE_HOST_SCRATCH=4M\n";
    seeds.push(("config_variables", config.as_bytes().to_vec()));
    let torchrun = "RANK=3\nWORLD_SIZE=8\nLOCAL_RANK=1\nMASTER_ADDR=[fe80::1]\nMASTER_PORT=29500\n\
                    WEAVE_SECRET=00112233445566778899aabbccddeeff\nTORCHELASTIC_RUN_ID=job-7\n";
    let slurm = "SLURM_PROCID=5\nSLURM_NTASKS=16\nSLURM_LOCALID=1\nSLURM_JOB_NODELIST=gpu[01-04]\nMASTER_PORT=29500\n\
                 SLURM_JOB_ID=991\n";
    seeds.push(("rendezvous_variables", torchrun.as_bytes().to_vec()));
    seeds.push(("rendezvous_variables", slurm.as_bytes().to_vec()));
    seeds
}

/// The entry point of fuzz target `target` run on `data` (whether it accepted it), or `None`
/// for a target whose seeds this crate does not keep.
pub fn run(target: &str, data: &[u8]) -> Option<bool> {
    Some(match target {
        "tcp_bootstrap" => tcp_bootstrap_message(data),
        "config_variables" => config_variables(data),
        "rendezvous_variables" => rendezvous_variables(data),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    /// Each seed is accepted by what it is for, and lies in `fuzz/seeds/` as made now
    /// (`WEAVE_BLESS=1` writes them).
    #[test]
    fn the_fuzz_seeds_are_accepted_and_current() {
        crate::testing::check_fuzz_seeds(env!("CARGO_MANIFEST_DIR"), &super::seeds(), super::run).unwrap();
    }
}
