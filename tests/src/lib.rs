//! Shared helpers of weave's multi-process tests: deterministic data patterns, the standard
//! communicator for a rank, and the launcher glue the integration tests use.

use std::time::Duration;

use comm_core::bootstrap::Bootstrap;
use comm_core::communicator::Communicator;
use comm_core::{Error, Result};

pub mod hostile;
pub mod launcher;
pub mod matrix;
pub mod p2p_mismatch;
pub mod stall;
pub mod survive;
pub mod worker;

/// Tests that differ only in what they hand one runner, as a table: each row
/// `test_name: arg, arg, ...;` becomes `#[test] fn test_name() { runner(arg, arg, ...); }`.
///
/// ```ignore
/// weave_tests::scenario_tests! { each_world;
///     exchange_with_2_ranks: "exchange", &[2], Duration::from_secs(60);
/// }
/// ```
#[macro_export]
macro_rules! scenario_tests {
    ($runner:path; $($name:ident: $($arg:expr),+;)*) => {
        $(
            #[test]
            fn $name() {
                $runner($($arg),+);
            }
        )*
    };
}

/// A small, fast, deterministic generator (SplitMix64) so a receiver can recompute what a
/// sender wrote without sending it twice.
#[derive(Debug, Clone)]
pub struct Pattern(u64);

impl Pattern {
    /// The generator for (`sender`, `receiver`, `case`).
    pub fn new(sender: usize, receiver: usize, case: u64) -> Self {
        Pattern((sender as u64) << 48 ^ (receiver as u64) << 32 ^ case ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

/// Builds this process's communicator from the launcher's environment, over shared memory.
pub fn shm_communicator() -> Result<Communicator> {
    let bootstrap = comm_core::bootstrap::from_env()?;
    Communicator::builder(bootstrap).with_transport(transport_shm::ShmTransport).build()
}

/// Fails with a message naming what differed.
pub fn expect_eq<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> Result<()> {
    if got == want { Ok(()) } else { Err(Error::protocol(format!("{what}: got {got:?}, want {want:?}"))) }
}

/// Checks that `got` equals the pattern `sender` wrote for this rank, naming the first bad byte.
pub fn verify_pattern(got: &[u8], sender: usize, receiver: usize, case: u64) -> Result<()> {
    let want = Pattern::new(sender, receiver, case).bytes(got.len());
    match got.iter().zip(&want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(Error::protocol(format!(
            "data from rank {sender} to rank {receiver} (case {case}, {} bytes) differs at byte {i}: {:#04x} != {:#04x}",
            got.len(),
            got[i],
            want[i]
        ))),
    }
}

/// The peers of this rank, in ascending order.
pub fn peers(b: &dyn Bootstrap) -> Vec<usize> {
    (0..b.world_size()).filter(|&p| p != b.rank()).collect()
}

/// The timeout the fault scenarios expect errors within (`WEAVE_TIMEOUT`, as set by the test).
pub fn configured_timeout() -> Duration {
    comm_core::config::Config::from_env().map(|c| c.timeout).unwrap_or(comm_core::config::DEFAULT_TIMEOUT)
}
