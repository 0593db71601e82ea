//! Growing a communicator: its members admit new ranks — a replacement after a shrink, or more
//! workers — and get a communicator with the old ranks first, the joiners after them.
//!
//! ```text
//! // every member                                   // each joiner, with the id handed to it
//! let growing = comm.grow(2)?;                       let comm = Communicator::join(&id, index)?;
//! hand_to_joiners(growing.id().to_string());
//! let comm = growing.complete()?;
//! ```
//!
//! Rank 0 of the members makes a fresh [`UniqueId`] (its own address, a new secret) and the
//! members learn it over their communicator; the [`GrowId`] adds the member count and the new
//! size. Members and joiners then meet at that id as the ranks of a new job bootstrap (members
//! keep their ranks, joiner `i` becomes rank `members + i`) and build the communicator on it.
//! Every member must be alive: after a failure, shrink first. The id is good for one grow.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use comm_core::bootstrap::{TcpBootstrap, UniqueId};
use comm_core::config::Config;
use comm_core::wire::{Decoder, Encoder};
use comm_core::{Error, Result};

use crate::api::builder::Builder;
use crate::api::communicator::Communicator;

/// Magic of a grow id's bytes.
const MAGIC: [u8; 4] = *b"WVGR";
/// Version of a grow id's bytes.
const VERSION: u16 = 1;
/// Largest number of joiners one grow admits.
pub const MAX_JOINERS: usize = 1 << 16;

/// What joiners need to join a growing communicator: where its rank 0 waits, the secret, the
/// number of members and the new size. Passed out of band, as text ([`fmt::Display`] and
/// [`FromStr`]: hex) or bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct GrowId {
    unique: UniqueId,
    members: usize,
    size: usize,
}

impl GrowId {
    /// The id of `members` ranks growing to `size`, meeting at `unique`.
    pub(crate) fn new(unique: UniqueId, members: usize, size: usize) -> Self {
        GrowId { unique, members, size }
    }

    /// Ranks of the communicator before it grows.
    pub fn members(&self) -> usize {
        self.members
    }

    /// Ranks after it grows.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The explicit little-endian wire form: magic `WVGR`, version, the unique id's bytes, the
    /// member count and the new size.
    pub fn to_bytes(&self) -> Vec<u8> {
        Encoder::new(MAGIC, VERSION)
            .bytes(&self.unique.to_bytes())
            .u32(self.members as u32)
            .u32(self.size as u32)
            .finish()
    }

    /// Parses [`GrowId::to_bytes`]; anything else is an [`Error::Protocol`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, MAGIC, VERSION, "grow id")?;
        let unique = UniqueId::from_bytes(d.bytes()?)?;
        let members = d.u32()? as usize;
        let size = d.u32()? as usize;
        d.finish()?;
        if members == 0 || size <= members || size - members > MAX_JOINERS {
            return Err(Error::protocol(format!("grow id: {members} members growing to {size} ranks is not a grow")));
        }
        Ok(GrowId { unique, members, size })
    }
}

impl fmt::Display for GrowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&comm_core::wire::hex(&self.to_bytes()))
    }
}

impl fmt::Debug for GrowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrowId")
            .field("unique", &self.unique)
            .field("members", &self.members)
            .field("size", &self.size)
            .finish()
    }
}

impl FromStr for GrowId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid("a grow id is an even number of hex digits (GrowId's Display)"));
        }
        let bytes: Vec<u8> =
            (0..s.len()).step_by(2).filter_map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect();
        GrowId::from_bytes(&bytes)
    }
}

/// A grow in progress on a member: hand [`id`](Self::id) to the joiners, then
/// [`complete`](Self::complete).
#[derive(Debug)]
pub struct Growing<'a> {
    parent: &'a Communicator,
    id: GrowId,
}

impl Growing<'_> {
    /// The id the joiners pass to [`Communicator::join`].
    pub fn id(&self) -> &GrowId {
        &self.id
    }

    /// Collective over the members and the joiners: the grown communicator, in which this member
    /// keeps its rank. Waits for the joiners up to the timeout (`WEAVE_TIMEOUT`).
    pub fn complete(self) -> Result<Communicator> {
        let p = self.parent;
        let timeout = p.config.timeout;
        let bootstrap = TcpBootstrap::new(&self.id.unique, p.rank(), self.id.size, timeout)?;
        let grown = Builder::for_child(p, Arc::new(bootstrap)).build()?;
        tracing::info!(
            target: comm_core::diagnostics::INIT,
            rank = p.rank(),
            "grew a {}-rank communicator to {} ranks",
            self.id.members,
            self.id.size
        );
        Ok(grown)
    }
}

impl Communicator {
    /// Collective over this communicator's ranks, all of which must be alive: starts admitting
    /// `joiners` new ranks. Hand [`Growing::id`] to the joiners (they call
    /// [`Communicator::join`]), then call [`Growing::complete`] for the grown communicator.
    /// Rank 0 waits for them on its host's address: `WEAVE_GROW_ADDR` if set, else
    /// `MASTER_ADDR`, else 127.0.0.1.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no joiners or more than [`MAX_JOINERS`].
    pub fn grow(&self, joiners: usize) -> Result<Growing<'_>> {
        self.grow_at(joiners, None)
    }

    /// [`grow`](Self::grow) at a unique id rank 0 made beforehand (`rank0_id`, given on rank 0
    /// only; `None` there makes a fresh one): how NCCL's `ncclCommGetUniqueId` then
    /// `ncclCommGrow` map onto weave, the id going to the joiners before the members grow.
    pub fn grow_at(&self, joiners: usize, rank0_id: Option<UniqueId>) -> Result<Growing<'_>> {
        if joiners == 0 || joiners > MAX_JOINERS {
            return Err(Error::invalid(format!("grow: {joiners} joiners (1 to {MAX_JOINERS})")));
        }
        let n = self.world_size();
        let mine = if self.rank() == 0 {
            let id = match rank0_id {
                Some(id) => id,
                None => UniqueId::on_free_port(grow_ip()?)?,
            };
            GrowId::new(id, n, n + joiners).to_bytes()
        } else {
            Vec::new()
        };
        let bytes = self.core().bootstrap().broadcast(0, &mine)?;
        let id = GrowId::from_bytes(&bytes)?;
        if id.size != n + joiners {
            return Err(Error::invalid(format!(
                "grow: rank 0 admits {} joiners, this rank {joiners}; every member must pass the same count",
                id.size - n
            )));
        }
        Ok(Growing { parent: self, id })
    }

    /// Joins a growing communicator as joiner `index` (0 for the first): the grown
    /// communicator, in which this process is rank `id.members() + index`. Collective with the
    /// members' [`Growing::complete`] and the other joiners; waits up to the timeout. Uses the
    /// default transports and the `WEAVE_*` settings.
    pub fn join(id: &GrowId, index: usize) -> Result<Communicator> {
        if index >= id.size - id.members {
            return Err(Error::invalid(format!(
                "join: index {index}, but the grow admits {} joiners",
                id.size - id.members
            )));
        }
        let config = Config::from_env()?;
        let bootstrap = TcpBootstrap::new(&id.unique, id.members + index, id.size, config.timeout)?;
        Communicator::builder(bootstrap).with_config(config).build()
    }
}

/// The address rank 0 waits for joiners on: `WEAVE_GROW_ADDR`, else `MASTER_ADDR`, else
/// 127.0.0.1.
pub fn grow_ip() -> Result<IpAddr> {
    let value = std::env::var("WEAVE_GROW_ADDR").or_else(|_| std::env::var("MASTER_ADDR"));
    match value {
        Ok(v) => Ok(comm_core::bootstrap::resolve(&v, 0, "WEAVE_GROW_ADDR or MASTER_ADDR")?.ip()),
        Err(_) => Ok(IpAddr::from([127, 0, 0, 1])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grow_ids_round_trip_as_text_and_refuse_garbage() {
        let unique = UniqueId::with_secret("127.0.0.1:4000".parse().unwrap(), [7; 16]);
        let id = GrowId { unique, members: 62, size: 64 };
        let text = id.to_string();
        assert_eq!(text.parse::<GrowId>().unwrap(), id);
        assert!("xyz".parse::<GrowId>().is_err());
        assert!(text[..text.len() - 2].parse::<GrowId>().is_err(), "truncated");
        let shrink = GrowId { size: 62, ..id.clone() }.to_bytes();
        assert!(GrowId::from_bytes(&shrink).is_err(), "not a grow");
        for damaged in comm_core::wire::damaged_messages(&id.to_bytes()) {
            let _ = GrowId::from_bytes(&damaged);
        }
    }
}
