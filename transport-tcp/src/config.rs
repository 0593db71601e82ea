//! Settings of the TCP transport, read from the environment here and nowhere else.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `WEAVE_TCP_SOCKETS` | sockets per connection; large writes are striped over them (1–16) | 2 |
//! | `WEAVE_SOCKET_IFNAME` | network interface whose IPv4 address peers connect to (`eth0`) | the interface that routes to `MASTER_ADDR`, else loopback |
//! | `WEAVE_TCP_TEND` | whether waiting ranks tend their peers' sockets while the reader threads nap (`auto`, `on`, `off`; see [`Tending`]) | `auto` |

use comm_core::config::var;
use comm_core::{Error, Result};

/// Default sockets per connection.
pub const DEFAULT_SOCKETS: usize = 2;
/// Most sockets per connection.
pub const MAX_SOCKETS: usize = 16;

/// Whether a rank waiting for a peer's message keeps that peer's stripe-0 socket out of the
/// reader thread's `poll(2)` while it drains the peer's sockets itself (`WEAVE_TCP_TEND`). A reader asleep in
/// `poll(2)` is woken by every segment that lands, and the sender's system call pays for the
/// wake-up; a tended peer's stripe-0 reader naps on a timer instead, which costs a core now and then.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Tending {
    /// Tend where this host has four CPUs or more per rank on it (`auto`).
    #[default]
    Auto,
    /// Always tend (`on`).
    On,
    /// Never tend: readers always wait in `poll(2)` (`off`).
    Off,
}

impl Tending {
    /// Whether waiters tend their peers now.
    pub fn tends(self) -> bool {
        match self {
            Tending::Auto => comm_core::crowding::cpus_per_local_rank() >= TENDING_CPUS_PER_RANK,
            Tending::On => true,
            Tending::Off => false,
        }
    }
}

/// CPUs per rank on this host from which [`Tending::Auto`] tends: below it, readers waking
/// from their naps take cores from the ranks.
pub const TENDING_CPUS_PER_RANK: usize = 4;

/// The TCP transport's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// Sockets per connection (`WEAVE_TCP_SOCKETS`).
    pub sockets: usize,
    /// Interface to listen on (`WEAVE_SOCKET_IFNAME`); `None` picks one (see the module doc).
    pub interface: Option<String>,
    /// The job's rendezvous host (`MASTER_ADDR`, as launchers set it): the listener takes the
    /// local address of the route to it.
    pub master_addr: Option<String>,
    /// Whether waiters tend their peers' sockets (`WEAVE_TCP_TEND`).
    pub tending: Tending,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig { sockets: DEFAULT_SOCKETS, interface: None, master_addr: None, tending: Tending::Auto }
    }
}

impl TcpConfig {
    /// Reads `WEAVE_TCP_SOCKETS`, `WEAVE_SOCKET_IFNAME` and `WEAVE_TCP_TEND`; a malformed
    /// value is [`Error::InvalidArgument`] naming the variable.
    pub fn from_env() -> Result<Self> {
        let mut c = TcpConfig::default();
        if let Some(v) = var("WEAVE_TCP_SOCKETS") {
            c.sockets = parse_sockets(&v)?;
        }
        c.interface = var("WEAVE_SOCKET_IFNAME").map(|v| v.trim().to_string());
        c.master_addr = var("MASTER_ADDR").map(|v| v.trim().to_string());
        if let Some(v) = var("WEAVE_TCP_TEND") {
            c.tending = parse_tending(&v)?;
        }
        Ok(c)
    }
}

fn parse_tending(v: &str) -> Result<Tending> {
    match v.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(Tending::Auto),
        "on" | "1" => Ok(Tending::On),
        "off" | "0" => Ok(Tending::Off),
        _ => Err(Error::invalid(format!("WEAVE_TCP_TEND={v:?}: expected auto, on or off"))),
    }
}

fn parse_sockets(v: &str) -> Result<usize> {
    match v.trim().parse::<usize>() {
        Ok(n @ 1..=MAX_SOCKETS) => Ok(n),
        _ => Err(Error::invalid(format!("WEAVE_TCP_SOCKETS={v:?}: expected 1 to {MAX_SOCKETS} sockets"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_counts_are_checked() {
        assert_eq!(parse_sockets(" 4 ").unwrap(), 4);
        for bad in ["0", "17", "two", "-1", ""] {
            assert!(matches!(parse_sockets(bad), Err(Error::InvalidArgument(_))), "{bad}");
        }
    }

    #[test]
    fn tending_is_read_by_name() {
        assert_eq!(parse_tending(" On ").unwrap(), Tending::On);
        assert_eq!(parse_tending("off").unwrap(), Tending::Off);
        assert_eq!(parse_tending("auto").unwrap(), Tending::Auto);
        assert!(matches!(parse_tending("sometimes"), Err(Error::InvalidArgument(_))));
        assert!(Tending::On.tends() && !Tending::Off.tends());
    }
}
