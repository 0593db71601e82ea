//! Two TCP backends in one process, talking over loopback sockets: data integrity at sizes that
//! broke other transports, frame and chunk edges, and every kind of bad input.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::Error;
use comm_core::connection::Connection;
use comm_core::memory::MemoryKind;
use comm_core::testing::{patterned_source, remote_region, same_bytes};
use comm_core::transport::TransportBackend;

use crate::endpoint::Endpoint;
use crate::wire::{FrameHeader, FrameKind, Handshake, MAX_FRAME_BYTES};
use crate::{TcpBackend, TcpConfig};

fn backend(rank: usize, timeout: Duration) -> TcpBackend {
    let ctx = comm_core::testing::context(rank, "tcptest", timeout);
    let config = TcpConfig { sockets: 3, interface: Some("lo".into()), master_addr: None };
    TcpBackend::open(&ctx, config).unwrap()
}

fn pair() -> (TcpBackend, TcpBackend, Arc<dyn Connection>) {
    let (a, b) = (backend(0, Duration::from_secs(20)), backend(1, Duration::from_secs(20)));
    let conn = a.connect(1, &b.local_endpoint().unwrap()).unwrap();
    (a, b, conn)
}

#[test]
fn large_writes_arrive_intact_and_the_flag_lands_after_them() {
    let (a, b, conn) = pair();
    for len in [(256 << 20) - 16, (256 << 20) + 16, (1 << 30) + 3] {
        let src = patterned_source(&a, len, len as u8).unwrap();
        let (theirs, remote) = remote_region(&b, &a, len + 64).unwrap();
        let flag_at = len.next_multiple_of(8);
        conn.write(&remote, 0, &src, 0, len).unwrap();
        conn.update_and_sync(&remote, flag_at, 7).unwrap();
        let started = Instant::now();
        while theirs.load_u64(flag_at).unwrap() != 7 {
            assert!(started.elapsed() < Duration::from_secs(60), "flag of {len} B never came");
            std::thread::yield_now();
        }
        assert!(same_bytes(&theirs, 0, &src, 0, len).unwrap(), "{len} bytes differ");
        conn.flush().unwrap();
    }
}

#[test]
fn frame_edges_and_offsets_are_exact() {
    let (a, b, conn) = pair();
    let total = 4 * MAX_FRAME_BYTES + 64;
    let src = patterned_source(&a, total, 9).unwrap();
    let (theirs, remote) = remote_region(&b, &a, total).unwrap();
    for (len, dst) in [(MAX_FRAME_BYTES - 1, 1), (MAX_FRAME_BYTES, 7), (MAX_FRAME_BYTES + 1, 3), (1, total - 1), (0, 0)]
    {
        conn.write(&remote, dst, &src, 5, len).unwrap();
        conn.flush().unwrap();
        assert!(same_bytes(&theirs, dst, &src, 5, len).unwrap(), "{len} bytes at {dst}");
    }
    // Ranges are checked before anything is sent.
    assert!(matches!(conn.write(&remote, total - 1, &src, 0, 2), Err(Error::InvalidArgument(_))));
    assert!(matches!(conn.update_and_sync(&remote, total - 4, 1), Err(Error::InvalidArgument(_))));
    assert!(matches!(conn.update_and_sync(&remote, 4, 1), Err(Error::InvalidArgument(_))));
    conn.flush().unwrap();
}

/// Opens a raw socket to `b` presenting `token`, as stripe 0 of 1.
fn raw(b: &TcpBackend, token: [u8; 16]) -> TcpStream {
    let ep = Endpoint::decode(&b.local_endpoint().unwrap()).unwrap();
    let mut s = TcpStream::connect(ep.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&Handshake { token, rank: 0, stripe: 0, stripes: 1 }.encode()).unwrap();
    s
}

fn wait_lost(b: &TcpBackend) -> String {
    let started = Instant::now();
    loop {
        if let Some(why) = b.listener.inbound().lost(0) {
            return why;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "the bad peer was never marked lost");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_wrong_token_is_refused_and_writes_nothing() {
    let b = backend(1, Duration::from_secs(2));
    let mut s = raw(&b, [0xee; 16]);
    let mut answer = [0u8; 1];
    assert!(std::io::Read::read(&mut s, &mut answer).map_or(true, |n| n == 0), "a stranger got an answer");
    assert!(b.listener.inbound().lost(0).is_none());
}

#[test]
fn garbage_truncated_oversized_and_out_of_range_frames_mark_the_peer_lost() {
    let token_of = |b: &TcpBackend| Endpoint::decode(&b.local_endpoint().unwrap()).unwrap().token;
    let frames: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", vec![0xff; 64]),
        (
            "oversized",
            FrameHeader { kind: FrameKind::Data, region: 1, offset: 0, value: MAX_FRAME_BYTES as u64 + 1, sequence: 0 }
                .encode()
                .to_vec(),
        ),
        (
            "out of range",
            FrameHeader { kind: FrameKind::Data, region: 1, offset: 60, value: 8, sequence: 0 }.encode().to_vec(),
        ),
        (
            "unknown region",
            FrameHeader { kind: FrameKind::Data, region: 99, offset: 0, value: 8, sequence: 0 }.encode().to_vec(),
        ),
        (
            "truncated",
            FrameHeader { kind: FrameKind::Data, region: 1, offset: 0, value: 32, sequence: 0 }.encode()[..20].to_vec(),
        ),
    ];
    for (what, frame) in frames {
        let b = backend(1, Duration::from_secs(2));
        let region = b.allocate(64, MemoryKind::Host).unwrap();
        let mut s = raw(&b, token_of(&b));
        let mut ok = [0u8; 1];
        std::io::Read::read_exact(&mut s, &mut ok).unwrap();
        s.write_all(&frame).unwrap();
        let _ = s.write_all(&[0u8; 8]);
        drop(s);
        let why = wait_lost(&b);
        // SAFETY: the region holds 64 bytes.
        let untouched = unsafe { std::slice::from_raw_parts(region.as_ptr(), 64) }.iter().all(|&v| v == 0);
        assert!(untouched, "{what}: the region was written");
        eprintln!("{what}: {why}");
    }
}

#[test]
fn a_peer_that_dies_mid_transfer_is_peer_lost_not_a_hang() {
    let (a, b, conn) = pair();
    let len = 256 << 20;
    let src = patterned_source(&a, len, 1).unwrap();
    let (_theirs, remote) = remote_region(&b, &a, len).unwrap();
    conn.write(&remote, 0, &src, 0, len).unwrap();
    drop(b); // its listener and sockets go away while the data is in flight
    let started = Instant::now();
    let r = (0..50).try_for_each(|_| conn.write(&remote, 0, &src, 0, 1 << 20).and_then(|_| conn.flush()));
    assert!(matches!(r, Err(Error::PeerLost { peer: 1, .. } | Error::Timeout { .. })), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(25), "took {:?}", started.elapsed());
}
