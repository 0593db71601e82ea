//! Settings of the TCP transport, read from the environment here and nowhere else.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `WEAVE_TCP_SOCKETS` | sockets per connection; large writes are striped over them (1–16) | 2 |
//! | `WEAVE_SOCKET_IFNAME` | network interface whose IPv4 address peers connect to (`eth0`) | the interface that routes to `MASTER_ADDR`, else loopback |

use comm_core::config::var;
use comm_core::{Error, Result};

/// Default sockets per connection.
pub const DEFAULT_SOCKETS: usize = 2;
/// Most sockets per connection.
pub const MAX_SOCKETS: usize = 16;

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
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig { sockets: DEFAULT_SOCKETS, interface: None, master_addr: None }
    }
}

impl TcpConfig {
    /// Reads `WEAVE_TCP_SOCKETS` and `WEAVE_SOCKET_IFNAME`; a malformed value is
    /// [`Error::InvalidArgument`] naming the variable.
    pub fn from_env() -> Result<Self> {
        let mut c = TcpConfig::default();
        if let Some(v) = var("WEAVE_TCP_SOCKETS") {
            c.sockets = parse_sockets(&v)?;
        }
        c.interface = var("WEAVE_SOCKET_IFNAME").map(|v| v.trim().to_string());
        c.master_addr = var("MASTER_ADDR").map(|v| v.trim().to_string());
        Ok(c)
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
}
