//! Tests of the TCP bootstrap: jobs of threads over loopback, from 1 to 1,024 ranks.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::sync::Barrier;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::*;

pub(super) const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

pub(super) fn new_id() -> UniqueId {
    UniqueId::on_free_port(LOCALHOST).unwrap()
}

/// Runs `body(rank)` on `world_size` threads, one a rank, and returns their results by rank.
/// The threads' stacks are small (256 KiB), so that a thousand ranks fit.
pub(super) fn on_ranks<T: Send>(world_size: usize, body: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..world_size)
            .map(|rank| {
                let body = &body;
                std::thread::Builder::new().stack_size(256 << 10).spawn_scoped(scope, move || body(rank)).unwrap()
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Runs `body` on `world_size` ranks (threads) of one job and returns their results by rank.
pub(super) fn run_job<T: Send>(
    world_size: usize,
    timeout: Duration,
    body: impl Fn(TcpBootstrap) -> T + Sync,
) -> Vec<T> {
    run_job_at(&new_id(), world_size, timeout, body)
}

/// [`run_job`] for the job identified by `id`.
fn run_job_at<T: Send>(
    id: &UniqueId,
    world_size: usize,
    timeout: Duration,
    body: impl Fn(TcpBootstrap) -> T + Sync,
) -> Vec<T> {
    on_ranks(world_size, |rank| body(TcpBootstrap::new(id, rank, world_size, timeout).unwrap()))
}

/// Connects to a rank's listener at `addr` as a peer would and sends `hello` as the first,
/// length-prefixed frame.
fn connect_with_hello(addr: std::net::SocketAddr, hello: &[u8]) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(&(hello.len() as u32).to_le_bytes()).unwrap();
    s.write_all(hello).unwrap();
    s
}

/// Everything a job of any size must do right.
pub(super) fn exercise(b: &TcpBootstrap) {
    let (me, n) = (b.rank(), b.world_size());
    assert_eq!(b.local_rank(), me, "all ranks run on this host");
    assert_eq!(b.local_world_size(), n);
    assert_eq!(b.job_key().len(), 16);
    for round in 0..3 {
        let all = b.all_gather(format!("rank {me} round {round}").as_bytes()).unwrap();
        let expected: Vec<Vec<u8>> = (0..n).map(|r| format!("rank {r} round {round}").into_bytes()).collect();
        assert_eq!(all, expected);
        for root in [0, n / 2, n - 1] {
            let got = b.broadcast(root, format!("from {root} round {round}").as_bytes()).unwrap();
            assert_eq!(got, format!("from {root} round {round}").into_bytes());
        }
        b.barrier().unwrap();
    }
    // Tagged messages read in another order than sent; one tag keeps its order.
    if n > 1 {
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        for tag in [10u64, 11, 12] {
            b.send(next, tag, format!("{me}->{next} tag {tag}").as_bytes()).unwrap();
        }
        for i in 0..20u32 {
            b.send(next, 20, &i.to_le_bytes()).unwrap();
        }
        for tag in [12u64, 10, 11] {
            assert_eq!(b.recv(prev, tag).unwrap(), format!("{prev}->{me} tag {tag}").into_bytes());
        }
        for i in 0..20u32 {
            assert_eq!(b.recv(prev, 20).unwrap(), i.to_le_bytes());
        }
    }
    // Sending to oneself goes through the own mailbox.
    b.send(me, 99, b"note to self").unwrap();
    assert_eq!(b.recv(me, 99).unwrap(), b"note to self");
    b.barrier().unwrap();
}

#[test]
fn jobs_of_1_2_3_4_and_8_ranks() {
    for world_size in [1, 2, 3, 4, 8] {
        let job_keys = run_job(world_size, Duration::from_secs(10), |b| {
            exercise(&b);
            b.job_key()
        });
        assert!(job_keys.iter().all(|k| *k == job_keys[0]), "{job_keys:?}");
    }
}

#[test]
fn large_messages() {
    const LEN: usize = 8 << 20;
    // Built once: generating 8 MiB patterns per rank is slow in debug builds.
    let patterns: HashMap<usize, Vec<u8>> = [1, 7, 10, 11, 12]
        .into_iter()
        .map(|seed| (seed, (0..LEN).map(|i| (i.wrapping_mul(31) ^ seed) as u8).collect()))
        .collect();
    let pattern = |seed: usize| patterns[&seed].as_slice();
    run_job(3, Duration::from_secs(20), |b| {
        let me = b.rank();
        let got = b.broadcast(1, if me == 1 { pattern(1) } else { &[] }).unwrap();
        assert!(got == pattern(1));
        let all = b.all_gather(pattern(me + 10)).unwrap();
        for (rank, data) in all.iter().enumerate() {
            assert!(*data == pattern(rank + 10), "rank {rank}'s contribution differs");
        }
        // A small message on another tag is not held up behind a large one.
        if me == 0 {
            b.send(2, 1, pattern(7)).unwrap();
            b.send(2, 2, b"small").unwrap();
        } else if me == 2 {
            assert_eq!(b.recv(0, 2).unwrap(), b"small");
            assert!(b.recv(0, 1).unwrap() == pattern(7));
        }
        b.barrier().unwrap();
    });
}

#[test]
fn a_dropped_peer_is_lost_promptly() {
    let timeout = Duration::from_secs(10);
    run_job(2, timeout, |b| {
        if b.rank() == 1 {
            b.send(0, 7, b"last words").unwrap();
            let started = Instant::now();
            drop(b);
            assert!(started.elapsed() < Duration::from_secs(1), "drop took {:?}", started.elapsed());
        } else {
            // Messages sent before the drop are still delivered, then the loss shows.
            assert_eq!(b.recv(1, 7).unwrap(), b"last words");
            let started = Instant::now();
            let lost = b.recv(1, 7);
            assert!(matches!(lost, Err(Error::PeerLost { peer: 1, .. })), "{lost:?}");
            assert!(started.elapsed() < Duration::from_secs(2), "noticed after {:?}", started.elapsed());
            let send = b.send(1, 7, b"anyone?");
            assert!(matches!(send, Err(Error::PeerLost { peer: 1, .. })), "{send:?}");
            assert!(matches!(b.barrier(), Err(Error::PeerLost { peer: 1, .. })));
        }
    });
}

#[test]
fn a_silent_peer_times_out_naming_it() {
    let timeout = Duration::from_millis(500);
    let done = Barrier::new(2);
    let outcomes = run_job(2, timeout, |b| {
        let outcome = (b.rank() == 0).then(|| {
            let started = Instant::now();
            (b.recv(1, 5), started.elapsed())
        });
        // Rank 1 stays alive (and silent) until rank 0 has given up.
        done.wait();
        outcome
    });
    let Some((result, waited)) = &outcomes[0] else { unreachable!("rank 0 returns an outcome") };
    match result {
        Err(Error::Timeout { peer: Some(1), operation, .. }) => assert!(operation.contains("tag 5"), "{operation}"),
        other => panic!("expected a timeout naming rank 1, got {other:?}"),
    }
    assert!(*waited >= timeout && *waited < timeout * 3, "waited {waited:?}");
}

/// Open file descriptors and threads of this process.
fn process_resources() -> (usize, usize) {
    let count = |dir: &str| std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
    (count("/proc/self/fd"), count("/proc/self/task"))
}

/// Builds a job of `world_size` thread ranks, each doing an all-gather and a barrier right
/// after joining; returns the seconds until every rank was done, and the largest number of
/// sockets (links and the listener) any rank held.
fn create_at_scale(world_size: usize, roots: usize, timeout: Duration) -> (f64, usize) {
    let ids: Vec<UniqueId> = (0..roots).map(|_| new_id()).collect();
    let started = Instant::now();
    let done = Barrier::new(world_size);
    let sockets = on_ranks(world_size, |rank| {
        let b = TcpBootstrap::with_roots(&ids, rank, world_size, timeout).unwrap();
        let all = b.all_gather(&(rank as u32).to_le_bytes()).unwrap();
        assert!(all.iter().enumerate().all(|(r, v)| v[..] == (r as u32).to_le_bytes()));
        b.barrier().unwrap();
        let sockets = b.open_links() + 1;
        // Everyone holds its bootstrap until all are counted.
        done.wait();
        sockets
    });
    let sockets = sockets.into_iter().max().unwrap_or(0);
    (started.elapsed().as_secs_f64(), sockets)
}

#[test]
fn two_hundred_fifty_six_ranks_with_a_few_links_each() {
    let (seconds, sockets) = create_at_scale(256, 1, Duration::from_secs(60));
    // Tree links (a parent and four children) and the listener.
    assert!(sockets <= 6, "a rank held {sockets} sockets");
    assert!(seconds < 30.0, "took {seconds:.1} s");
}

#[test]
#[ignore = "1,024 ranks as threads (about 3,000 sockets in this process): run by hand, alone"]
fn a_thousand_and_twenty_four_ranks_join_within_ten_seconds_and_leave_nothing() {
    let before = process_resources();
    for roots in [1, 4] {
        let (seconds, sockets) = create_at_scale(1024, roots, Duration::from_secs(60));
        println!(
            "1024 ranks, {roots} root(s): joined, all_gather and barrier in {seconds:.2} s; at most {sockets} sockets per rank"
        );
        assert!(seconds <= 10.0 && sockets <= 32, "{seconds:.2} s, {sockets} sockets");
    }
    let after = process_resources();
    assert_eq!(before, after, "(file descriptors, threads) before and after");
}

#[test]
fn a_second_job_meets_at_the_same_address_while_the_first_lives() {
    let id = new_id();
    let join = |world_size: usize| run_job_at(&id, world_size, Duration::from_secs(10), |b| b);
    let first = join(3);
    let second = join(3);
    std::thread::scope(|scope| {
        for b in first.iter().chain(&second) {
            scope.spawn(move || exercise(b));
        }
    });
}

#[test]
fn several_roots_make_one_job() {
    for (world_size, roots) in [(2, 2), (7, 3), (10, 4)] {
        let ids: Vec<UniqueId> = (0..roots).map(|_| new_id()).collect();
        let keys = on_ranks(world_size, |rank| {
            let b = TcpBootstrap::with_roots(&ids, rank, world_size, Duration::from_secs(10)).unwrap();
            exercise(&b);
            b.job_key()
        });
        assert!(keys.iter().all(|k| *k == ids[0].job_key()), "{keys:?}");
    }
    let id = new_id();
    let too_many = TcpBootstrap::with_roots(&[id.clone(), id.clone(), id], 0, 2, Duration::from_secs(1));
    assert!(matches!(too_many, Err(Error::InvalidArgument(_))), "{too_many:?}");
    assert!(matches!(TcpBootstrap::with_roots(&[], 0, 2, Duration::from_secs(1)), Err(Error::InvalidArgument(_))));
}

#[test]
fn links_open_on_demand_and_watch_their_peer() {
    let timeout = Duration::from_secs(10);
    run_job(9, timeout, |b| {
        let (me, n) = (b.rank(), b.world_size());
        let tree_links = usize::from(tree::parent(me).is_some()) + tree::children(me, n).count();
        // Ranks 3 and 8 are no tree neighbours (8 hangs below 1).
        match me {
            3 => {
                b.send(8, 1, b"far away").unwrap();
                assert_eq!(b.recv(8, 2).unwrap(), b"and back");
                assert_eq!(b.open_links(), tree_links + 1);
            }
            8 => {
                assert_eq!(b.recv(3, 1).unwrap(), b"far away");
                b.send(3, 2, b"and back").unwrap();
                assert_eq!(b.open_links(), tree_links + 1, "the answer reused the link");
            }
            5 => {
                // Asking about a peer without a link opens one, so its loss will show.
                assert_eq!(b.peer_lost(7), None);
                let deadline = Deadline::after(timeout);
                while b.open_links() == tree_links && !deadline.expired() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert_eq!(b.open_links(), tree_links + 1);
            }
            _ => assert!(b.open_links() <= tree_links + usize::from(me == 7)),
        }
        b.barrier().unwrap();
        if me == 7 {
            drop(b);
        } else if me == 5 {
            let deadline = Deadline::after(timeout);
            while b.peer_lost(7).is_none() && !deadline.expired() {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(b.peer_lost(7).is_some(), "rank 7's drop was not noticed");
        }
    });
}

#[test]
fn strangers_at_a_member_listener_are_refused_and_the_job_goes_on() {
    use std::io::Read;
    let id = new_id();
    let sync = Barrier::new(3);
    run_job_at(&id, 3, Duration::from_secs(10), |b| {
        let addr = b.addrs[2];
        sync.wait();
        if b.rank() == 0 {
            // A wrong secret, an old version, garbage: each is closed unanswered.
            let stranger = UniqueId::with_secret(id.addr, [0x77; 16]);
            let mut old = messages::encode_peer_hello(&id, 0, 2, 3);
            old[4..6].copy_from_slice(&1u16.to_le_bytes());
            for hello in [messages::encode_peer_hello(&stranger, 0, 2, 3), old, b"garbage".to_vec()] {
                let mut s = connect_with_hello(addr, &hello);
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut answer = Vec::new();
                let read = s.read_to_end(&mut answer);
                assert!(read.is_ok() && answer.is_empty(), "{read:?}: {answer:?}");
            }
        }
        sync.wait();
        exercise(&b);
    });
}

#[test]
fn bad_arguments_are_invalid() {
    let id = new_id();
    let timeout = Duration::from_secs(1);
    assert!(matches!(TcpBootstrap::new(&id, 0, 0, timeout), Err(Error::InvalidArgument(_))));
    assert!(matches!(TcpBootstrap::new(&id, 2, 2, timeout), Err(Error::InvalidArgument(_))));
    assert!(matches!(TcpBootstrap::new(&id, 0, 1, Duration::ZERO), Err(Error::InvalidArgument(_))));
    let single = TcpBootstrap::new(&id, 0, 1, timeout).unwrap();
    assert!(matches!(single.send(1, 0, b"x"), Err(Error::InvalidArgument(_))));
    assert!(matches!(single.recv(1, 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(single.broadcast(1, b"x"), Err(Error::InvalidArgument(_))));
    assert_eq!(single.all_gather(b"x").unwrap(), vec![b"x".to_vec()]);
    single.barrier().unwrap();
    assert!(format!("{single:?}").contains("TcpBootstrap"));
}

#[test]
fn a_garbage_frame_on_a_link_marks_its_peer_lost() {
    use std::io::{Read, Write};
    let id = new_id();
    let linked = Barrier::new(2);
    run_job_at(&id, 2, Duration::from_secs(10), |b| {
        if b.rank() == 0 {
            // A second link that claims to come from rank 0, then a frame of 2^64-1 bytes.
            let mut s = connect_with_hello(b.addrs[1], &messages::encode_peer_hello(&id, 0, 1, 2));
            let mut answer = [0u8; 4];
            s.read_exact(&mut answer).unwrap();
            let mut frame = 5u64.to_le_bytes().to_vec();
            frame.extend_from_slice(&u64::MAX.to_le_bytes());
            s.write_all(&frame).unwrap();
            linked.wait();
        } else {
            linked.wait();
            let lost = b.recv(0, 5);
            match lost {
                Err(Error::PeerLost { peer: 0, reason, .. }) => {
                    assert!(reason.contains("protocol error"), "{reason}")
                }
                other => panic!("{other:?}"),
            }
            assert!(b.peer_lost(0).is_some());
        }
    });
}

/// Joins rank `rank` of a `world_size`-rank job at `id` on a thread, with a cancel flag (and a
/// 5-second timeout, so that a join the flag does not end fails with a timeout).
fn join_cancellable(
    id: &UniqueId,
    rank: usize,
    world_size: usize,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<Result<TcpBootstrap>>) {
    let cancel = Arc::new(AtomicBool::new(false));
    let (id, flag) = (id.clone(), cancel.clone());
    let joining = std::thread::spawn(move || {
        TcpBootstrap::with_roots_cancellable(&[id], rank, world_size, Duration::from_secs(5), flag)
    });
    (cancel, joining)
}

/// After 300 ms in which the join (rank 1's) must still be trying to reach its root, cancels it:
/// it must end with [`Error::Aborted`] within a second.
fn calls_off_a_join_still_looking_for_its_root(
    cancel: Arc<AtomicBool>,
    joining: std::thread::JoinHandle<Result<TcpBootstrap>>,
) {
    std::thread::sleep(Duration::from_millis(300));
    assert!(!joining.is_finished(), "rank 1 did not keep trying to reach its root");
    let started = Instant::now();
    cancel.store(true, std::sync::atomic::Ordering::Release);
    let outcome = joining.join().unwrap();
    assert!(matches!(outcome, Err(Error::Aborted(_))), "gave {:?}", outcome.map(|_| ()));
    assert!(started.elapsed() < Duration::from_secs(1), "the join took {:?} to end", started.elapsed());
}

#[test]
fn a_cancelled_join_ends_at_once_and_frees_the_root_address() {
    // Ranks 0 and 1 of 3 join; rank 2 never comes. Rank 0 waits in the rendezvous for it, rank
    // 1 (acknowledged) for the rank table, each until its timeout unless called off.
    let id = new_id();
    let joins = [join_cancellable(&id, 0, 3), join_cancellable(&id, 1, 3)];
    std::thread::sleep(Duration::from_millis(300));
    assert!(joins.iter().all(|(_, j)| !j.is_finished()), "the join did not wait for rank 2");
    assert!(std::net::TcpListener::bind(id.addr).is_err(), "the root listens on the id's address while it waits");
    let started = Instant::now();
    for (cancel, _) in &joins {
        cancel.store(true, std::sync::atomic::Ordering::Release);
    }
    for (rank, (_, joining)) in joins.into_iter().enumerate() {
        match joining.join().unwrap() {
            Err(Error::Aborted(why)) => assert!(why.contains("bootstrap"), "rank {rank}: {why}"),
            other => panic!("rank {rank}: a cancelled join gave {:?}", other.map(|_| ())),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(2), "the joins took {:?} to end", started.elapsed());
    // Nothing is left listening: the id's address is free again.
    std::net::TcpListener::bind(id.addr).expect("the root's address is free once its join ended");
}

#[test]
fn a_cancelled_join_stops_looking_for_a_root_that_never_listens() {
    let id = new_id();
    let (cancel, joining) = join_cancellable(&id, 1, 2);
    calls_off_a_join_still_looking_for_its_root(cancel, joining);
}

#[test]
fn a_cancelled_join_ends_at_once_while_the_root_host_drops_its_handshakes() {
    // A root port that drops the handshakes, as a firewall or a host gone dark does, so a
    // connection attempt waits for its own limit (seconds).
    let dropper = crate::testing::HandshakeDropper::open().unwrap();
    let id = UniqueId::with_secret(dropper.addr(), [0x33; 16]);
    let (cancel, joining) = join_cancellable(&id, 1, 2);
    calls_off_a_join_still_looking_for_its_root(cancel, joining);
}

#[test]
fn a_socket_that_met_itself_is_told_from_a_connection() {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, bind, connect, getsockname, socket};
    use std::os::fd::AsRawFd;
    // Bound to a port and dialling that same port, with nobody listening: simultaneous open
    // connects the socket to itself, as a rank dialling a root's free port may by chance.
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).unwrap();
    bind(fd.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0)).unwrap();
    let me: SockaddrIn = getsockname(fd.as_raw_fd()).unwrap();
    connect(fd.as_raw_fd(), &me).unwrap();
    let met_itself = TcpStream::from(fd);
    assert!(crate::tcp_bounded::connected_to_itself(&met_itself));
    let root = TcpListener::bind((LOCALHOST, 0)).unwrap();
    let dialled = TcpStream::connect(root.local_addr().unwrap()).unwrap();
    assert!(!crate::tcp_bounded::connected_to_itself(&dialled));
}
