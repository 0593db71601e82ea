//! Why a job could not be started.
//!
//! The launcher has its own small error type instead of `comm_core::Error`: it starts
//! processes and knows nothing of communicators, so depending on comm-core would pull the whole
//! core (and its error kinds it never produces) into every launcher binary. It is not a bare
//! `std::io::Error` either: callers tell a bad [`LaunchSpec`](crate::LaunchSpec) apart from a
//! failed system call by matching, and every error names the operation that failed. The
//! messages read as comm-core's do (`invalid argument: …`, `… failed: …`).

use std::fmt;

/// A job that could not be started. Failures of the ranks themselves are not errors; they are
/// in the [`LaunchReport`](crate::LaunchReport).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The [`LaunchSpec`](crate::LaunchSpec), or the caller's `WEAVE_SECRET`, cannot be used.
    InvalidArgument(String),
    /// An operating-system call failed: starting a rank or a thread, picking a port, reading
    /// randomness, blocking signals.
    Io {
        /// The call and its object, e.g. "start rank 0 of 4 as \"/bin/prog\"".
        operation: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The result type of this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument(message.into())
    }

    /// Shorthand for [`Error::Io`].
    pub(crate) fn io(operation: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { operation: operation.into(), source }
    }

    /// Wraps a `nix` errno as [`Error::Io`].
    pub(crate) fn errno(operation: impl Into<String>, errno: nix::errno::Errno) -> Self {
        Error::io(operation, std::io::Error::from(errno))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(message) => write!(f, "invalid argument: {message}"),
            Error::Io { operation, source } => write!(f, "{operation} failed: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::InvalidArgument(_) => None,
            Error::Io { source, .. } => Some(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_operation_and_keep_the_source() {
        let e = Error::errno("block SIGINT", nix::errno::Errno::EINVAL);
        assert!(e.to_string().starts_with("block SIGINT failed: "), "{e}");
        assert!(std::error::Error::source(&e).is_some());
        let e = Error::invalid("ranks is 0");
        assert_eq!(e.to_string(), "invalid argument: ranks is 0");
        assert!(std::error::Error::source(&e).is_none());
    }
}
