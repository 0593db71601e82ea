//! The endpoint table every rank contributes when a communicator is built — its rank, host
//! identity and, per transport it opened, its endpoint — and which transports reach each peer
//! from those tables ([`reachable`]).

use std::sync::Arc;

use crate::communicator::WIRE_VERSION;
use crate::error::{Error, Result};
use crate::transport::{Transport, TransportBackend};
use crate::wire::{Decoder, Encoder};

/// Magic of the endpoint table every rank contributes at build time.
///
/// Wire format (little-endian): magic `WVEP`, version, rank `u32`, host identity (`u32` length +
/// UTF-8), number of transports `u8`, then per transport its name (`u32` length + bytes, see
/// [`Transport::encode`]) and its endpoint (`u32` length + bytes).
const ENDPOINTS_MAGIC: [u8; 4] = *b"WVEP";

/// A rank's host identity and its (transport, endpoint) list.
pub(crate) type EndpointTable = (String, Vec<(Transport, Vec<u8>)>);

/// This rank's table: its rank, host identity and (transport, endpoint) list.
pub(crate) fn encode(rank: usize, host: &str, table: &[(Transport, Vec<u8>)]) -> Result<Vec<u8>> {
    let n = u8::try_from(table.len()).map_err(|_| {
        Error::invalid(format!("{} transports opened; at most 255 fit the endpoint table", table.len()))
    })?;
    let mut e = Encoder::new(ENDPOINTS_MAGIC, WIRE_VERSION);
    e.u32(rank as u32).str(host).u8(n);
    for (t, endpoint) in table {
        t.encode(&mut e);
        e.bytes(endpoint);
    }
    Ok(e.finish())
}

/// Reads rank `from`'s table. Transports this process never registered are left out (this rank
/// has none of them, so they reach nothing from here); a transport named twice is garbage.
pub(crate) fn decode(bytes: &[u8], from: usize) -> Result<EndpointTable> {
    let mut d = Decoder::new(bytes, ENDPOINTS_MAGIC, WIRE_VERSION, "endpoint table")?;
    let r = d.u32()? as usize;
    if r != from {
        return Err(Error::protocol(format!("endpoint table from rank {from} claims to be rank {r}")));
    }
    let host = d.str()?;
    if host.len() > crate::host::MAX_HOST_ID_LEN {
        return Err(Error::protocol(format!("endpoint table from rank {from}: host identity of {} bytes", host.len())));
    }
    let host = host.to_string();
    let out = Transport::decode_entries(&mut d, "endpoint table", |t| {
        format!("endpoint table from rank {from} names transport {t} twice")
    })?;
    d.finish()?;
    Ok((host, out))
}

/// The transports that reach between `me` and `peer`, best first: those both ranks offer and
/// whose `can_reach` holds, in the lower rank's preference order. Both ranks compute the same
/// list.
pub(crate) fn reachable(
    backends: &[Arc<dyn TransportBackend>],
    endpoints: &[Vec<(Transport, Vec<u8>)>],
    me: usize,
    peer: usize,
) -> Result<Vec<usize>> {
    let lower = me.min(peer);
    let mut out = Vec::new();
    for (t, _) in &endpoints[lower] {
        let Some(idx) = backends.iter().position(|b| b.transport() == *t) else { continue };
        let mine = endpoints[me].iter().find(|(x, _)| x == t);
        let theirs = endpoints[peer].iter().find(|(x, _)| x == t);
        if let (Some((_, a)), Some((_, b))) = (mine, theirs)
            && backends[idx].can_reach(a, b)?
        {
            out.push(idx);
        }
    }
    if out.is_empty() {
        return Err(Error::Unsupported(format!(
            "no transport reaches rank {peer} from rank {me}: this rank offers {}, rank {peer} offers {}",
            endpoints[me].iter().map(|(t, _)| t.name()).collect::<Vec<_>>().join(","),
            endpoints[peer].iter().map(|(t, _)| t.name()).collect::<Vec<_>>().join(",")
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_tables_round_trip_and_skip_unknown_transports() {
        let (a, b) = (Transport::named("ep-test-a").unwrap(), Transport::named("ep-test-b").unwrap());
        let table = vec![(a, vec![1, 2, 3]), (b, vec![])];
        let bytes = encode(4, "host/boot", &table).unwrap();
        assert_eq!(decode(&bytes, 4).unwrap(), ("host/boot".to_string(), table.clone()));
        assert!(matches!(decode(&bytes, 3), Err(Error::Protocol(_))));
        for cut in 0..bytes.len() {
            assert!(matches!(decode(&bytes[..cut], 4), Err(Error::Protocol(_))), "truncated at {cut}");
        }

        // A transport this process never registered is skipped, and stays unregistered.
        let mut e = Encoder::new(ENDPOINTS_MAGIC, WIRE_VERSION);
        e.u32(0).str("h").u8(3).str("ep-test-unknown").bytes(&[9; 5]).str("ep-test-b").bytes(&[7]);
        e.str("ep-test-unknown2").bytes(&[]);
        assert_eq!(decode(&e.finish(), 0).unwrap(), ("h".to_string(), vec![(b, vec![7])]));
        assert_eq!(Transport::lookup("ep-test-unknown"), None);
    }

    #[test]
    fn endpoint_tables_with_bad_names_are_protocol_errors() {
        let table = |names: &[&[u8]]| {
            let mut e = Encoder::new(ENDPOINTS_MAGIC, WIRE_VERSION);
            e.u32(0).str("h").u8(names.len() as u8);
            for name in names {
                e.bytes(name).bytes(&[1]);
            }
            e.finish()
        };
        let long = [b'a'; 33];
        for bad in [&b""[..], b"EP", b"a/b", b"\xc3\x28", &long] {
            assert!(matches!(decode(&table(&[bad]), 0), Err(Error::Protocol(_))), "{bad:?} decoded");
        }
        Transport::named("ep-test-twice").unwrap();
        assert!(matches!(decode(&table(&[b"ep-test-twice", b"ep-test-twice"]), 0), Err(Error::Protocol(_))));
        // A count larger than the entries present (after magic, version, rank and host "h").
        let mut short = table(&[b"ep-test-twice"]);
        short[6 + 4 + (4 + 1)] = 2;
        assert!(matches!(decode(&short, 0), Err(Error::Protocol(_))));
    }
}
