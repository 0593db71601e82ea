//! Two TCP backends in one process, talking over loopback sockets: data integrity at sizes that
//! broke other transports, frame and chunk edges, and every kind of bad input.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use comm_core::Error;
use comm_core::connection::Connection;
use comm_core::memory::{MemoryKind, MemoryRegion, RegisteredMemory};
use comm_core::testing::{patterned_source, region_of, remote_region, same_bytes};
use comm_core::transport::TransportBackend;

use crate::endpoint::Endpoint;
use crate::listener::Inbound;
use crate::wire::{FrameHeader, FrameKind, HANDSHAKE_OK, Handshake, MAX_FRAME_BYTES};
use crate::{TcpBackend, TcpConfig, Tending};

fn backend(rank: usize, timeout: Duration) -> TcpBackend {
    let ctx = comm_core::testing::context(rank, "tcptest", timeout);
    let config = TcpConfig { sockets: 3, interface: Some("lo".into()), ..TcpConfig::default() };
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

/// Opens a raw socket to `b` with `b`'s own token, as rank 0's stripe 0 of 1, and reads the
/// listener's answer, which must be [`HANDSHAKE_OK`]: from here on `b` reads frames from it.
fn accepted_raw(b: &TcpBackend) -> TcpStream {
    let mut s = raw(b, Endpoint::decode(&b.local_endpoint().unwrap()).unwrap().token);
    let mut ok = [0u8; 1];
    std::io::Read::read_exact(&mut s, &mut ok).unwrap();
    assert_eq!(ok[0], HANDSHAKE_OK);
    s
}

/// Rank 1 (`b`) waiting on rank 0 (`a`) with its reader threads paused, so that only the
/// waiter's `progress` reads what rank 0 sends, and a raw socket (`stream`) that stands for rank
/// 0's only stripe.
struct PausedWaiter {
    a: TcpBackend,
    b: TcpBackend,
    waiter: Arc<dyn Connection>,
    /// `region_len` bytes on `b`, its first region: the one raw frames name as region 1.
    region: Arc<dyn MemoryRegion>,
    inbound: Arc<Inbound>,
    stream: TcpStream,
}

impl PausedWaiter {
    fn new(region_len: usize) -> Self {
        let (a, b) = (backend(0, Duration::from_secs(5)), backend(1, Duration::from_secs(5)));
        let waiter = b.connect(0, &a.local_endpoint().unwrap()).unwrap();
        let region = b.allocate(region_len, MemoryKind::Host).unwrap();
        let inbound = b.listener.inbound().clone();
        inbound.readers_paused.store(true, Ordering::Release);
        let stream = accepted_raw(&b);
        PausedWaiter { a, b, waiter, region, inbound, stream }
    }
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
fn strangers_that_trickle_or_say_nothing_hold_up_no_rank_and_no_drop() {
    let b = backend(1, Duration::from_secs(5));
    let ep = Endpoint::decode(&b.local_endpoint().unwrap()).unwrap();
    // Two that say nothing and one that sends a byte a second: each used to hold the accept
    // thread for a timeout (or, trickling, a timeout per byte).
    let mut strangers: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(ep.addr).unwrap()).collect();
    strangers[2].write_all(&[0]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let _s = accepted_raw(&b);
    assert!(started.elapsed() < Duration::from_secs(1), "a rank's handshake waited {:?}", started.elapsed());
    let dropping = Instant::now();
    drop(b);
    assert!(dropping.elapsed() < Duration::from_secs(2), "the drop waited {:?} for strangers", dropping.elapsed());
    for mut stranger in strangers {
        let mut byte = [0u8; 1];
        stranger.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert_eq!(std::io::Read::read(&mut stranger, &mut byte).unwrap_or(0), 0, "a stranger got an answer");
    }
}

#[test]
fn garbage_truncated_oversized_and_out_of_range_frames_mark_the_peer_lost() {
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
        let mut s = accepted_raw(&b);
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

/// A data frame of `payload` at `offset` of region 1, then a flag storing `value` at offset 0
/// of the same region, as stripe 0 of 1 sends them.
fn data_and_flag(payload: &[u8], offset: u64, value: u64) -> Vec<u8> {
    let data = FrameHeader { kind: FrameKind::Data, region: 1, offset, value: payload.len() as u64, sequence: 0 };
    let flag = FrameHeader { kind: FrameKind::Flag, region: 1, offset: 0, value, sequence: 0 };
    let mut bytes = data.encode().to_vec();
    bytes.extend_from_slice(payload);
    bytes.extend_from_slice(&flag.encode());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes
}

#[test]
fn a_frame_split_across_hand_overs_is_applied_once_whole() {
    let PausedWaiter { a: _a, b: _b, waiter, region, inbound, stream: mut s } = PausedWaiter::new(256);
    // SAFETY: the region holds 256 bytes; frames write it only while this test waits.
    let bytes = |at: usize, n: usize| unsafe { std::slice::from_raw_parts(region.as_ptr().add(at), n) }.to_vec();
    let flag = || bytes(0, 8);
    let payload: Vec<u8> = (0..100).map(|i| i as u8 ^ 0x5a).collect();
    // Two messages, cut inside headers, payloads and counts; the pieces are taken in turn by
    // the waiter (`progress`) and by the reader thread.
    let mut stream = data_and_flag(&payload, 64, 1);
    stream.extend(data_and_flag(&payload[..50], 8, 2));
    let cuts = [0, 17, 40, 41, 90, 140, 150, 181, 190, 230, 262, stream.len()];
    for (i, w) in cuts.windows(2).enumerate() {
        s.write_all(&stream[w[0]..w[1]]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        if i % 2 == 0 {
            waiter.progress().unwrap();
        } else {
            inbound.readers_paused.store(false, Ordering::Release);
            std::thread::sleep(Duration::from_millis(20));
            inbound.readers_paused.store(true, Ordering::Release);
        }
        // A flag never lands before its whole message.
        let f = u64::from_le_bytes(flag().try_into().unwrap());
        if f >= 1 {
            assert_eq!(bytes(64, 100), payload, "piece {i}");
        }
        if f >= 2 {
            assert_eq!(bytes(8, 50), payload[..50], "piece {i}");
        }
    }
    let started = Instant::now();
    while u64::from_le_bytes(flag().try_into().unwrap()) != 2 {
        assert!(started.elapsed() < Duration::from_secs(5), "the second flag never landed");
        waiter.progress().unwrap();
    }
    assert_eq!(bytes(64, 100), payload);
    assert_eq!(bytes(8, 50), payload[..50]);
    assert!(inbound.lost(0).is_none(), "{:?}", inbound.lost(0));
    inbound.readers_paused.store(false, Ordering::Release);
}

#[test]
fn a_waiter_that_reads_garbage_gets_peer_lost_and_marks_the_peer() {
    let PausedWaiter { a: _a, b: _b, waiter, region: _region, inbound, stream: mut s } = PausedWaiter::new(64);
    s.write_all(&[0xff; 64]).unwrap();
    let started = Instant::now();
    let r = loop {
        match waiter.progress() {
            Ok(()) => assert!(started.elapsed() < Duration::from_secs(5), "the garbage was never read"),
            Err(e) => break e,
        }
    };
    assert!(matches!(r, Error::PeerLost { peer: 0, .. }), "{r:?}");
    assert!(inbound.lost(0).is_some());
    assert!(matches!(waiter.check_peer(), Err(Error::PeerLost { peer: 0, .. })));
    inbound.readers_paused.store(false, Ordering::Release);
}

/// A transfer from `a` (rank 0) to `b` (rank 1) of six frames over three stripes, more than
/// the socket buffers hold: its length, `a`'s source (patterned by `seed`), `b`'s region and
/// `a`'s view of it, and the offset of a flag behind the bytes.
fn striped_transfer(
    a: &TcpBackend,
    b: &TcpBackend,
    seed: u8,
) -> (usize, RegisteredMemory, RegisteredMemory, RegisteredMemory, usize) {
    let len = 5 * MAX_FRAME_BYTES + 123;
    let src = patterned_source(a, len, seed).unwrap();
    let (theirs, remote) = remote_region(b, a, len + 64).unwrap();
    (len, src, theirs, remote, len.next_multiple_of(8))
}

#[test]
fn a_waiter_applies_striped_data_flags_and_flushes_while_the_readers_stall() {
    let (a, b) = (backend(0, Duration::from_secs(20)), backend(1, Duration::from_secs(20)));
    let conn = a.connect(1, &b.local_endpoint().unwrap()).unwrap();
    let waiter = b.connect(0, &a.local_endpoint().unwrap()).unwrap();
    b.listener.inbound().readers_paused.store(true, Ordering::Release);
    let (len, src, theirs, remote, flag_at) = striped_transfer(&a, &b, 3);
    let sender = std::thread::spawn(move || {
        conn.write(&remote, 0, &src, 0, len).unwrap();
        conn.update_and_sync(&remote, flag_at, 9).unwrap();
        conn.flush().unwrap(); // answered by the waiter: no reader thread runs
        conn.write(&remote, 0, &src, 0, 8).unwrap();
        conn.flush().unwrap();
        (src, conn)
    });
    let started = Instant::now();
    while !sender.is_finished() {
        assert!(started.elapsed() < Duration::from_secs(30), "the waiter made no progress");
        waiter.progress().unwrap();
    }
    let (src, _conn) = sender.join().unwrap();
    assert_eq!(theirs.load_u64(flag_at).unwrap(), 9);
    assert!(same_bytes(&theirs, 0, &src, 0, len).unwrap(), "the striped bytes differ");
    b.listener.inbound().readers_paused.store(false, Ordering::Release);
}

#[test]
fn a_tended_peer_is_drained_by_its_waiter_and_its_readers_take_over_when_it_stops() {
    let tending = |t: Tending| {
        let ctx = comm_core::testing::context(1, "tcptest", Duration::from_secs(20));
        TcpBackend::open(
            &ctx,
            TcpConfig { sockets: 3, interface: Some("lo".into()), tending: t, ..TcpConfig::default() },
        )
        .unwrap()
    };
    for t in [Tending::On, Tending::Off] {
        let (a, b) = (backend(0, Duration::from_secs(20)), tending(t));
        let conn = a.connect(1, &b.local_endpoint().unwrap()).unwrap();
        let waiter = b.connect(0, &a.local_endpoint().unwrap()).unwrap();
        let peer = b.listener.inbound().peer(0);
        assert!(!peer.tended(), "tended before anyone waited");
        waiter.progress().unwrap();
        assert_eq!(peer.tended(), t == Tending::On, "{t:?}");
        // While the waiter tends, a striped transfer larger than the socket buffers and its
        // flag land through the waiter's drains.
        let (len, src, theirs, remote, flag_at) = striped_transfer(&a, &b, 5);
        let sender = std::thread::spawn(move || {
            conn.write(&remote, 0, &src, 0, len).unwrap();
            conn.update_and_sync(&remote, flag_at, 1).unwrap();
            conn.flush().unwrap();
            (src, conn, remote)
        });
        let started = Instant::now();
        while theirs.load_u64(flag_at).unwrap() != 1 {
            assert!(started.elapsed() < Duration::from_secs(30), "{t:?}: the tended transfer stalled");
            waiter.progress().unwrap();
        }
        let (src, conn, remote) = sender.join().unwrap();
        assert!(same_bytes(&theirs, 0, &src, 0, len).unwrap(), "{t:?}: the striped bytes differ");
        // Once nobody waits, the readers apply what comes, however small.
        std::thread::sleep(crate::receive::TENDED_FOR * 2);
        assert!(!peer.tended(), "{t:?}: still tended with no waiter");
        let w = comm_core::connection::CheckedWrite::new(&remote, 0, &src, 0, 8).unwrap();
        conn.write_and_sync(w, flag_at, 2).unwrap();
        let started = Instant::now();
        while theirs.load_u64(flag_at).unwrap() != 2 {
            assert!(started.elapsed() < Duration::from_secs(5), "{t:?}: no reader took the message");
            std::thread::yield_now();
        }
    }
}

#[test]
fn a_pair_shares_one_set_of_sockets_both_ways() {
    let (a, b) = (backend(0, Duration::from_secs(20)), backend(1, Duration::from_secs(20)));
    let sockets = |x: &TcpBackend| x.listener.inbound().socket_count();
    let a_to_b = a.connect(1, &b.local_endpoint().unwrap()).unwrap();
    let b_to_a = b.connect(0, &a.local_endpoint().unwrap()).unwrap();
    // Rank 0 dialled three sockets; rank 1 writes on them instead of dialling its own.
    assert_eq!((sockets(&a), sockets(&b)), (3, 3));
    let len = 3 * MAX_FRAME_BYTES + 77; // striped, and larger than the socket buffers
    let send = |from: &TcpBackend, to: (&TcpBackend, usize), conn: Arc<dyn Connection>, seed: u8| {
        let src = patterned_source(from, len, seed).unwrap();
        let (theirs, remote) = region_of(to.0, to.1, from, len + 64).unwrap();
        let flag_at = len.next_multiple_of(8);
        let sender = std::thread::spawn(move || {
            for round in 1..=3u64 {
                conn.write(&remote, 0, &src, 0, len).map_err(|e| format!("{seed} write {round}: {e}"))?;
                conn.update_and_sync(&remote, flag_at, round).map_err(|e| format!("{seed} flag {round}: {e}"))?;
                conn.flush().map_err(|e| format!("{seed} flush {round}: {e}"))?;
            }
            Ok::<_, String>((src, conn))
        });
        (sender, theirs, flag_at)
    };
    // Both directions at once, each with flushes whose answers share the sockets with data.
    let (to_b, at_b, flag_b) = send(&a, (&b, 1), a_to_b, 11);
    let (to_a, at_a, flag_a) = send(&b, (&a, 0), b_to_a, 12);
    // Each side keeps its connection until both are done: a connection dropped closes its
    // direction, and its peer then counts it gone.
    let ((src_a, _a), (src_b, _b)) = (to_b.join().unwrap().unwrap(), to_a.join().unwrap().unwrap());
    assert_eq!((at_b.load_u64(flag_b).unwrap(), at_a.load_u64(flag_a).unwrap()), (3, 3));
    assert!(same_bytes(&at_b, 0, &src_a, 0, len).unwrap(), "rank 0's bytes differ at rank 1");
    assert!(same_bytes(&at_a, 0, &src_b, 0, len).unwrap(), "rank 1's bytes differ at rank 0");
}

#[test]
fn a_higher_rank_whose_peer_never_dials_dials_its_own_set() {
    let (a, b) = (backend(0, Duration::from_secs(20)), backend(1, Duration::from_secs(20)));
    let started = Instant::now();
    let b_to_a = b.connect(0, &a.local_endpoint().unwrap()).unwrap();
    let waited = started.elapsed();
    assert!(waited >= crate::listener::OFFER_GRACE, "connected after {waited:?} without rank 0's sockets");
    let src = patterned_source(&b, 64, 6).unwrap();
    let (theirs, remote) = region_of(&a, 0, &b, 128).unwrap();
    let w = comm_core::connection::CheckedWrite::new(&remote, 0, &src, 0, 64).unwrap();
    b_to_a.write_and_sync(w, 64, 1).unwrap();
    b_to_a.flush().unwrap();
    assert_eq!(theirs.load_u64(64).unwrap(), 1);
    assert!(same_bytes(&theirs, 0, &src, 0, 64).unwrap());
}

#[test]
fn three_peers_writing_at_once_are_read_by_one_thread_per_stripe() {
    let hub = backend(0, Duration::from_secs(20));
    let peers: Vec<TcpBackend> = (1..=3).map(|r| backend(r, Duration::from_secs(20))).collect();
    // The hub dials a set of three sockets to each peer; each peer writes on the set it accepted.
    let _hub_to: Vec<_> =
        peers.iter().enumerate().map(|(i, p)| hub.connect(i + 1, &p.local_endpoint().unwrap()).unwrap()).collect();
    let inbound = hub.listener.inbound();
    assert_eq!((inbound.socket_count(), inbound.reader_threads()), (9, 3), "sockets and reader threads of the hub");
    let len = 2 * MAX_FRAME_BYTES + 13; // striped over all three sockets of each peer
    let senders: Vec<_> = peers
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let conn = p.connect(0, &hub.local_endpoint().unwrap()).unwrap();
            let src = patterned_source(p, len, 20 + i as u8).unwrap();
            let (theirs, remote) = region_of(&hub, 0, p, len + 64).unwrap();
            let flag_at = len.next_multiple_of(8);
            let sender = std::thread::spawn(move || {
                for round in 1..=3u64 {
                    conn.write(&remote, 0, &src, 0, len).map_err(|e| format!("peer {} write {round}: {e}", i + 1))?;
                    conn.update_and_sync(&remote, flag_at, round).map_err(|e| format!("peer {} flag: {e}", i + 1))?;
                    conn.flush().map_err(|e| format!("peer {} flush {round}: {e}", i + 1))?;
                }
                Ok::<_, String>((src, conn))
            });
            (sender, theirs, flag_at)
        })
        .collect();
    for (i, (sender, theirs, flag_at)) in senders.into_iter().enumerate() {
        let (src, _conn) = sender.join().unwrap().unwrap();
        assert_eq!(theirs.load_u64(flag_at).unwrap(), 3, "peer {}'s last flag", i + 1);
        assert!(same_bytes(&theirs, 0, &src, 0, len).unwrap(), "peer {}'s bytes differ at the hub", i + 1);
    }
    assert_eq!(inbound.reader_threads(), 3, "no reader thread per socket");
}

/// Connects rank 0 (comm timeout 30 s) to a peer said to listen at `addr`, sets the backend's
/// abort flag 200 ms in, and checks the connect ends as aborted within a second.
fn a_called_off_dial_ends_at_once(addr: std::net::SocketAddr) {
    let a = backend(0, Duration::from_secs(30));
    let peer = Endpoint { addr, token: [7; 16] }.encode();
    let abort = a.abort.clone();
    let started = Instant::now();
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            abort.store(true, Ordering::Release);
        });
        a.connect(1, &peer).map(|_| ())
    });
    let took = started.elapsed();
    assert!(matches!(outcome, Err(Error::Aborted(_))), "a called-off connect gave {outcome:?}");
    assert!(took < Duration::from_secs(1), "the called-off connect took {took:?} to end");
}

#[test]
fn a_connect_to_a_host_that_drops_the_handshake_is_called_off_at_once() {
    // The kernel drops the SYNs, as for a host gone dark; a blocking connect would wait out the
    // whole comm timeout.
    let dropper = comm_core::testing::HandshakeDropper::open().unwrap();
    a_called_off_dial_ends_at_once(dropper.addr());
}

#[test]
fn a_connect_whose_handshake_is_never_answered_is_called_off_at_once() {
    // The kernel accepts the connection into the queue, but nobody reads the hello or answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    a_called_off_dial_ends_at_once(silent.local_addr().unwrap());
}
