//! A lazy update (`Connection::update_lazily`) over TCP: held back until the next frame to the
//! peer, a wait of this process, or a flush.
//!
//! This test is a binary of its own on purpose. Held sends are process-wide
//! (`comm_core::deferred`): any wait anywhere in the process sends them, so beside the other
//! transport tests, whose waits run on other threads of the same process, "nothing goes out
//! while this rank neither sends nor waits" would not hold.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use comm_core::connection::CheckedWrite;
use comm_core::spin::{WaitContext, spin_until};
use comm_core::testing::{patterned_source, remote_region, same_bytes};
use comm_core::transport::TransportBackend;
use transport_tcp::{TcpBackend, TcpConfig};

fn backend(rank: usize) -> TcpBackend {
    let ctx = comm_core::testing::context(rank, "tcplazy", Duration::from_secs(20));
    let config = TcpConfig { sockets: 3, interface: Some("lo".into()), ..TcpConfig::default() };
    TcpBackend::open(&ctx, config).unwrap()
}

#[test]
fn a_lazy_update_rides_the_next_frame_or_goes_out_when_the_rank_waits() {
    let (a, b) = (backend(0), backend(1));
    let conn = a.connect(1, &b.local_endpoint().unwrap()).unwrap();
    let src = patterned_source(&a, 64, 4).unwrap();
    let (theirs, remote) = remote_region(&b, &a, 256).unwrap();
    let landed = |at: usize, want: u64| {
        let started = Instant::now();
        while theirs.load_u64(at).unwrap() != want {
            assert!(started.elapsed() < Duration::from_secs(10), "word {at} never became {want}");
            std::thread::yield_now();
        }
    };
    // Held back: nothing arrives while this rank neither sends nor waits.
    conn.update_lazily(&remote, 8, 1).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(theirs.load_u64(8).unwrap(), 0, "a lazy update went out on its own");
    // It rides in front of the next frame to the peer, which lands after it.
    let w = CheckedWrite::new(&remote, 64, &src, 0, 64).unwrap();
    conn.write_and_sync(w, 16, 2).unwrap();
    landed(16, 2);
    assert_eq!(theirs.load_u64(8).unwrap(), 1);
    assert!(same_bytes(&theirs, 64, &src, 0, 64).unwrap());
    // A wait on another peer that outlasts its spin sends it.
    conn.update_lazily(&remote, 8, 3).unwrap();
    let abort = AtomicBool::new(false);
    let ok = || Ok(());
    let ctx = WaitContext {
        operation: "a wait on something else",
        peer: None,
        timeout: Duration::from_secs(10),
        abort: &abort,
        check_peer: &ok,
    };
    let until = Instant::now() + Duration::from_millis(2);
    spin_until(&ctx, || Instant::now() >= until).unwrap();
    landed(8, 3);
    // A wait on this peer sends it at once: its first look makes progress on the connection.
    conn.update_lazily(&remote, 8, 7).unwrap();
    conn.progress().unwrap();
    landed(8, 7);
    // A second lazy update sends both at once: the later value wins.
    conn.update_lazily(&remote, 8, 4).unwrap();
    conn.update_lazily(&remote, 8, 5).unwrap();
    landed(8, 5);
    // Held behind a flush, which returns only once the peer applied it.
    conn.update_lazily(&remote, 24, 6).unwrap();
    conn.flush().unwrap();
    assert_eq!(theirs.load_u64(24).unwrap(), 6);
}
