//! What a rank tells every peer through the bootstrap, once per communicator: its port's
//! address and, for each peer, the number of the queue pair it created for that peer.
//!
//! Queue pairs are made when the transport opens, one per peer, so that no further handshake
//! is needed: a connection to rank `p` joins this rank's queue pair for `p` to `p`'s queue pair
//! for this rank, both read from the endpoints.

use comm_core::wire::{Decoder, Encoder};
use comm_core::{Error, Result};

use crate::verbs::{PortAddress, QueuePairAddress};

const MAGIC: [u8; 4] = *b"WVIB";
const VERSION: u16 = 1;

/// One rank's endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) port: PortAddress,
    /// (queue pair number, first packet sequence number) of the queue pair for each rank; zeros
    /// in this rank's own slot.
    pub(crate) queue_pairs: Vec<(u32, u32)>,
}

impl Endpoint {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new(MAGIC, VERSION);
        e.u16(self.port.lid).raw(&self.port.gid).u8(u8::from(self.port.roce)).u8(self.port.mtu);
        e.usize(self.queue_pairs.len());
        for &(qpn, psn) in &self.queue_pairs {
            e.u32(qpn).u32(psn);
        }
        e.finish()
    }

    pub(crate) fn decode(bytes: &[u8], world_size: usize) -> Result<Self> {
        let mut d = Decoder::new(bytes, MAGIC, VERSION, "ib endpoint")?;
        let (lid, gid, link, mtu) = (d.u16()?, d.raw::<16>()?, d.u8()?, d.u8()?);
        let roce = match link {
            0 => false,
            1 => true,
            x => return Err(Error::protocol(format!("ib endpoint: link layer flag {x}"))),
        };
        let n = d.usize()?;
        if n != world_size {
            return Err(Error::protocol(format!(
                "an ib endpoint lists queue pairs for {n} ranks in a {world_size}-rank communicator"
            )));
        }
        let mut queue_pairs = Vec::with_capacity(n);
        for _ in 0..n {
            queue_pairs.push((d.u32()?, d.u32()?));
        }
        d.finish()?;
        Ok(Endpoint { port: PortAddress { lid, gid, roce, mtu }, queue_pairs })
    }

    /// The address of this rank's queue pair for `peer`.
    pub(crate) fn queue_pair_for(&self, peer: usize) -> Result<QueuePairAddress> {
        let &(qpn, psn) = self
            .queue_pairs
            .get(peer)
            .ok_or_else(|| Error::protocol(format!("an ib endpoint has no queue pair for rank {peer}")))?;
        Ok(QueuePairAddress { port: self.port, qpn, psn })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip_and_lies_are_caught() {
        let ep = Endpoint {
            port: PortAddress { lid: 7, gid: [3; 16], roce: true, mtu: 3 },
            queue_pairs: vec![(0, 0), (0x11, 0x22), (0x33, 0x44)],
        };
        let bytes = ep.encode();
        assert_eq!(Endpoint::decode(&bytes, 3).unwrap(), ep);
        assert_eq!(ep.queue_pair_for(2).unwrap().qpn, 0x33);
        assert!(ep.queue_pair_for(3).is_err());
        assert!(Endpoint::decode(&bytes, 4).is_err(), "a world size that differs");
        assert!(Endpoint::decode(&bytes[..bytes.len() - 1], 3).is_err(), "a truncated endpoint");
        // The link-layer flag is 0 or 1: anything else would decode to an endpoint that
        // encodes to other bytes (magic 4, version 2, LID 2, GID 16: the flag is byte 24).
        let mut odd = bytes.clone();
        odd[24] = 2;
        assert!(Endpoint::decode(&odd, 3).is_err(), "a link-layer flag of 2");
    }
}
