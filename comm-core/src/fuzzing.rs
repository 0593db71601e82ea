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
    if let Ok((host, table)) = crate::communicator::decode_endpoints(data, 0) {
        let again = crate::communicator::encode_endpoints(0, &host, &table).expect("a decoded table re-encodes");
        assert_eq!(
            crate::communicator::decode_endpoints(&again, 0).expect("a re-encoded table decodes"),
            (host, table)
        );
    }
}

/// A registration handshake's status from a peer (whether it mapped this rank's memory): an
/// accepted "mapped" status is the one encoding of it.
pub fn registration_status(data: &[u8]) {
    if let Ok(None) = crate::registration::decode_status(data, 0) {
        assert_eq!(crate::registration::encode_status(None), data);
    }
}

/// Valid inputs of [`tcp_bootstrap_message`], one per message kind: seeds for its corpus.
pub fn tcp_bootstrap_seeds() -> Vec<Vec<u8>> {
    crate::bootstrap::tcp::fuzzing::seeds()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// The seeds of the TCP bootstrap's target lie in `fuzz/seeds/` as `seed-N`, as
    /// [`super::tcp_bootstrap_seeds`] makes them now (`WEAVE_BLESS=1` writes them), and each
    /// is accepted by the decoder it is for.
    #[test]
    fn the_tcp_bootstrap_seeds_in_the_corpus_are_current() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/tcp_bootstrap");
        for (i, seed) in super::tcp_bootstrap_seeds().into_iter().enumerate() {
            assert!(super::tcp_bootstrap_message(&seed), "seed {i} is not accepted");
            let path = dir.join(format!("seed-{i}"));
            if std::env::var_os("WEAVE_BLESS").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &seed).unwrap();
            }
            let kept =
                std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; write it with WEAVE_BLESS=1", path.display()));
            assert_eq!(kept, seed, "{} is stale; rewrite it with WEAVE_BLESS=1", path.display());
        }
    }
}
