//! Transport names and their ids.
//!
//! A transport is known by its name: 1 to [`MAX_TRANSPORT_NAME_LEN`] characters of
//! `[a-z0-9_-]`. The crate that implements it registers the name once per process with
//! [`Transport::named`] and gets a [`Transport`], a small `Copy` id that compares, hashes and
//! prints as the name. A process registers at most [`MAX_TRANSPORTS`] names; ids are never
//! freed, and the same name always gives the same id.
//!
//! Ids are numbered in registration order, so they differ between processes: wire formats carry
//! names ([`Transport::encode`], [`Transport::decode`]). Decoding only looks a name up — it
//! never registers one — so a name this process does not know means this rank has no such
//! transport, and a peer cannot fill the registry.

use std::fmt;
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};
use crate::wire::{Decoder, Encoder};

/// Most transport names one process may register.
pub const MAX_TRANSPORTS: usize = 64;

/// Longest transport name, in bytes.
pub const MAX_TRANSPORT_NAME_LEN: usize = 32;

/// A transport's id in this process: a handle on a name registered with
/// [`Transport::named`]. Two ids are equal exactly when their names are.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Transport(u8);

impl Transport {
    /// The id of transport `name`, registering the name on first use.
    ///
    /// Fails with [`Error::InvalidArgument`] when `name` is not 1 to
    /// [`MAX_TRANSPORT_NAME_LEN`] characters of `[a-z0-9_-]`, or when the process already
    /// registered [`MAX_TRANSPORTS`] other names.
    pub fn named(name: &str) -> Result<Transport> {
        Transport::check_name(name)?;
        REGISTRY.register(name).map(Transport::from_index)
    }

    /// The id of `name` if this process registered it; never registers.
    pub fn lookup(name: &str) -> Option<Transport> {
        REGISTRY.find(name).map(Transport::from_index)
    }

    /// The registered name.
    pub fn name(self) -> &'static str {
        REGISTRY.name(usize::from(self.0))
    }

    /// Checks that `name` is a valid transport name (1 to [`MAX_TRANSPORT_NAME_LEN`]
    /// characters of `[a-z0-9_-]`), without registering it; [`Error::InvalidArgument`] if not.
    pub fn check_name(name: &str) -> Result<()> {
        if is_valid_name(name.as_bytes()) {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "transport name {name:?}: expected 1 to {MAX_TRANSPORT_NAME_LEN} characters of [a-z0-9_-]"
            )))
        }
    }

    /// Writes this transport's name: a `u32` length and the bytes.
    pub fn encode(self, e: &mut Encoder) {
        e.str(self.name());
    }

    /// Reads a name written by [`encode`](Self::encode). A malformed name (empty, too long,
    /// outside `[a-z0-9_-]`) is [`Error::Protocol`]; a valid name this process never registered
    /// is `Ok(None)`: this rank has no such transport. `what` names the message in errors.
    pub fn decode(d: &mut Decoder<'_>, what: &str) -> Result<Option<Transport>> {
        let bytes = d.bytes()?;
        if !is_valid_name(bytes) {
            let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_TRANSPORT_NAME_LEN + 1)]);
            return Err(Error::protocol(format!("{what}: malformed transport name {shown:?} ({} bytes)", bytes.len())));
        }
        // Valid names are ASCII.
        Ok(std::str::from_utf8(bytes).ok().and_then(Transport::lookup))
    }

    /// Reads a `u8` count, then that many entries of a transport name (see
    /// [`encode`](Self::encode)) and a byte string, as a memory descriptor's exports or a rank's
    /// endpoint table hold them. Entries of transports this process never registered are left
    /// out; a transport named twice is [`Error::Protocol`] with the message `named_twice(t)`.
    /// `what` names the message in errors.
    pub(crate) fn decode_entries(
        d: &mut Decoder<'_>,
        what: &str,
        named_twice: impl Fn(Transport) -> String,
    ) -> Result<Vec<(Transport, Vec<u8>)>> {
        let n = d.u8()?;
        let mut entries: Vec<(Transport, Vec<u8>)> = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let t = Transport::decode(d, what)?;
            let bytes = d.bytes()?;
            let Some(t) = t else { continue };
            if entries.iter().any(|(x, _)| *x == t) {
                return Err(Error::protocol(named_twice(t)));
            }
            entries.push((t, bytes.to_vec()));
        }
        Ok(entries)
    }

    fn from_index(index: usize) -> Transport {
        // The registry holds at most MAX_TRANSPORTS (64) names, so every index fits a u8.
        const _: () = assert!(MAX_TRANSPORTS <= 256);
        Transport(index as u8)
    }
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Transport").field(&self.name()).finish()
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn is_valid_name(name: &[u8]) -> bool {
    (1..=MAX_TRANSPORT_NAME_LEN).contains(&name.len())
        && name.iter().all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
}

/// The names of this process's transports, by id.
static REGISTRY: Registry<MAX_TRANSPORTS> = Registry::new();

/// An append-only table of at most `N` names. Lookups read the slots without locking;
/// registrations are serialized by `count`, and fill slot `i` before any id `i` exists, so the
/// set slots always form a prefix and never change.
struct Registry<const N: usize> {
    slots: [OnceLock<&'static str>; N],
    /// Number of names registered; held while registering.
    count: Mutex<usize>,
}

impl<const N: usize> Registry<N> {
    const fn new() -> Self {
        Registry { slots: [const { OnceLock::new() }; N], count: Mutex::new(0) }
    }

    fn find(&self, name: &str) -> Option<usize> {
        self.slots.iter().map_while(OnceLock::get).position(|n| *n == name)
    }

    /// The index of `name` (already checked), adding it if new.
    fn register(&self, name: &str) -> Result<usize> {
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = self.find(name) {
            return Ok(i);
        }
        let Some(slot) = self.slots.get(*count) else {
            return Err(Error::invalid(format!(
                "cannot register transport {name:?}: this process already registered {N} transport names, the most it may"
            )));
        };
        // At most N names of at most MAX_TRANSPORT_NAME_LEN bytes are ever leaked.
        let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
        if slot.set(name).is_err() {
            // Unreachable: slots are only set here, under the lock, at index `count`.
            return Err(Error::invalid(format!("transport registry slot {} was already taken", *count)));
        }
        *count += 1;
        Ok(*count - 1)
    }

    fn name(&self, index: usize) -> &'static str {
        // Every id was made after its slot was set, so the fallback is never used.
        self.slots.get(index).and_then(OnceLock::get).copied().unwrap_or("?")
    }
}

/// Defines `pub fn transport() -> Transport` for a transport crate: the id of the name `$name`
/// (the crate's `NAME`), registered on first use and the same on every later call.
///
/// ```
/// pub const NAME: &str = "example";
/// comm_core::transport_id!(NAME);
/// assert_eq!(transport().name(), "example");
/// ```
#[macro_export]
macro_rules! transport_id {
    ($name:expr) => {
        /// This transport's id, registered on first use.
        ///
        /// # Panics
        ///
        /// If the process registered [`MAX_TRANSPORTS`]($crate::transport::MAX_TRANSPORTS) other
        /// transport names before this one.
        pub fn transport() -> $crate::transport::Transport {
            static ID: ::std::sync::OnceLock<$crate::transport::Transport> = ::std::sync::OnceLock::new();
            *ID.get_or_init(|| $crate::transport::Transport::named($name).unwrap_or_else(|e| panic!("{e}")))
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_registers_once_and_prints_as_itself() {
        let a = Transport::named("names-test_a1").unwrap();
        assert_eq!(Transport::named("names-test_a1").unwrap(), a);
        assert_eq!(Transport::lookup("names-test_a1"), Some(a));
        assert_eq!(a.name(), "names-test_a1");
        assert_eq!(format!("{a:?} {a}"), "Transport(\"names-test_a1\") names-test_a1");
        let b = Transport::named("names-test-b").unwrap();
        assert_ne!(a, b);
        let set: std::collections::HashSet<Transport> = [a, b, a].into_iter().collect();
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn lookup_never_registers() {
        assert_eq!(Transport::lookup("names-test-never"), None);
        assert_eq!(Transport::lookup("names-test-never"), None);
    }

    #[test]
    fn malformed_names_are_invalid_arguments() {
        let long = "x".repeat(MAX_TRANSPORT_NAME_LEN + 1);
        for bad in ["", "Upper", "a b", "a,b", "dot.ted", "tab\t", "é", long.as_str()] {
            assert!(matches!(Transport::named(bad), Err(Error::InvalidArgument(_))), "{bad:?} was accepted");
            assert!(Transport::check_name(bad).is_err());
            assert_eq!(Transport::lookup(bad), None);
        }
        Transport::check_name(&"y".repeat(MAX_TRANSPORT_NAME_LEN)).unwrap();
        Transport::check_name("0_-z").unwrap();
    }

    #[test]
    fn a_full_registry_refuses_new_names_but_finds_old_ones() {
        let r = Registry::<2>::new();
        assert_eq!(r.register("one").unwrap(), 0);
        assert_eq!(r.register("two").unwrap(), 1);
        assert_eq!(r.register("one").unwrap(), 0);
        let e = r.register("three").unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("three") && m.contains('2')), "{e}");
        assert_eq!((r.find("two"), r.find("three")), (Some(1), None));
        assert_eq!((r.name(1), r.name(2)), ("two", "?"));
    }

    fn decode_one(bytes: &[u8]) -> Result<Option<Transport>> {
        let mut d = Decoder::new(bytes, *b"TEST", 1, "test")?;
        let t = Transport::decode(&mut d, "test")?;
        d.finish()?;
        Ok(t)
    }

    fn with_name(name: &[u8]) -> Vec<u8> {
        Encoder::new(*b"TEST", 1).bytes(name).finish()
    }

    #[test]
    fn names_round_trip_and_unknown_names_decode_to_none() {
        let t = Transport::named("names-test-wire").unwrap();
        let mut e = Encoder::new(*b"TEST", 1);
        t.encode(&mut e);
        let bytes = e.finish();
        assert_eq!(decode_one(&bytes).unwrap(), Some(t));
        for cut in 0..bytes.len() {
            assert!(matches!(decode_one(&bytes[..cut]), Err(Error::Protocol(_))), "truncated at {cut} decoded");
        }
        assert_eq!(decode_one(&with_name(b"names-test-unknown")).unwrap(), None);
        assert_eq!(Transport::lookup("names-test-unknown"), None, "decoding registered a name");
    }

    #[test]
    fn garbage_names_are_protocol_errors() {
        let long = vec![b'a'; MAX_TRANSPORT_NAME_LEN + 1];
        for bad in [&b""[..], b"UP", b"a\0b", b"\xff\xfe", b"a b", &long] {
            assert!(matches!(decode_one(&with_name(bad)), Err(Error::Protocol(_))), "{bad:?} decoded");
        }
        // A length prefix far past the message.
        let mut huge = Encoder::new(*b"TEST", 1).u32(u32::MAX).finish();
        huge.extend_from_slice(b"abc");
        assert!(matches!(decode_one(&huge), Err(Error::Protocol(_))));
    }
}
