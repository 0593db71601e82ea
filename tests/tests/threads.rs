//! Large worlds on one machine: the host collectives matrix at small sizes with every rank a
//! thread of this process, over the loopback bootstrap and transport. 256 ranks run in CI;
//! 512 and 1,024 ranks run on demand (`cargo test -p weave-tests --test threads -- --ignored`).
//! With `WEAVE_THREADS_BUILD_ONLY` set, the matrix tests only build their communicators (to
//! measure creation alone).

use std::time::{Duration, Instant};

use collectives::{Algorithm, Collective, Communicator, DataType, ReduceOp};
use comm_core::config::Config;
use comm_core::loopback::{LoopbackBootstrap, LoopbackTransport};
use weave_tests::matrix::{MatrixSpec, run_matrix};

/// Set to make the matrix tests stop once their communicators are built.
const BUILD_ONLY: &str = "WEAVE_THREADS_BUILD_ONLY";

/// Builds an `n`-rank communicator of threads and runs `spec` on every rank; returns the checked
/// calls of rank 0 and how long the build and the matrix took.
fn matrix_on_threads(n: usize, spec: &MatrixSpec, timeout: Duration) -> (usize, Duration, Duration) {
    matrix_on_threads_with(n, spec, timeout, &[])
}

/// [`matrix_on_threads`] with `forced` algorithms.
fn matrix_on_threads_with(
    n: usize,
    spec: &MatrixSpec,
    timeout: Duration,
    forced: &[(Collective, Algorithm)],
) -> (usize, Duration, Duration) {
    let group = LoopbackBootstrap::group(n, timeout);
    let config = Config { timeout, ..Config::default() };
    let start = Instant::now();
    let results: Vec<(usize, Duration)> = on_thread_ranks(group, |b| {
        let rank = b_rank(&b);
        let mut builder = Communicator::builder(b).with_transport(LoopbackTransport).with_config(config.clone());
        for &(c, a) in forced {
            builder = builder.with_algorithm(c, a);
        }
        let comm = builder.build().unwrap_or_else(|e| panic!("rank {rank}: building the communicator: {e}"));
        let built = start.elapsed();
        if std::env::var_os(BUILD_ONLY).is_some() {
            return (1, built);
        }
        let checked = run_matrix(&comm, spec).unwrap_or_else(|e| panic!("rank {rank} of {n}: {e}"));
        (checked, built)
    });
    let built = results.iter().map(|r| r.1).max().unwrap_or_default();
    (results[0].0, built, start.elapsed() - built)
}

fn b_rank(b: &LoopbackBootstrap) -> usize {
    comm_core::bootstrap::Bootstrap::rank(b)
}

/// Small sizes of every collective, every operator, an integer and a floating-point type.
fn small_spec() -> MatrixSpec {
    MatrixSpec {
        dtypes: vec![DataType::F32, DataType::I32],
        ops: ReduceOp::ALL.to_vec(),
        counts: vec![0, 1, 5],
        large: None,
    }
}

/// Runs [`small_spec`] on `ranks` thread ranks within `timeout`, checks that calls were
/// checked, and prints how long building and running took.
fn small_matrix_on_threads(ranks: usize, timeout: Duration) {
    let (checked, built, ran) = matrix_on_threads(ranks, &small_spec(), timeout);
    assert!(checked > 0);
    println!("{ranks} thread ranks: built in {built:.2?}, {checked} calls checked per rank in {ran:.2?}");
}

#[test]
fn the_host_matrix_at_small_sizes_with_256_thread_ranks() {
    small_matrix_on_threads(256, Duration::from_secs(120));
}

#[test]
#[ignore = "512 threads: about 0.8 GB and 12 s on two cores (docs/perf-log/cpu-host.md, Large worlds); run with --ignored"]
fn the_host_matrix_at_small_sizes_with_512_thread_ranks() {
    small_matrix_on_threads(512, Duration::from_secs(300));
}

#[test]
#[ignore = "1,024 threads: about 2.8 GB and 80 s on two cores (docs/perf-log/cpu-host.md, Large worlds); run with --ignored"]
fn the_host_matrix_at_small_sizes_with_1024_thread_ranks() {
    small_matrix_on_threads(1024, Duration::from_secs(600));
}

#[test]
#[ignore = "a measurement (docs/perf-log/cpu-host.md, Large worlds): the 256-rank matrix with the algorithms the table chose before the logarithmic ones"]
fn the_256_rank_matrix_with_the_linear_algorithms_forced() {
    use Algorithm::*;
    use Collective::*;
    // What the host rows picked at 256 ranks for these sizes before: `n - 1` steps or more.
    let linear = [
        (AllReduce, Ring),
        (AllGather, Ring),
        (ReduceScatter, Ring),
        (Broadcast, Direct),
        (Reduce, TwoPhase),
        (AllToAll, Direct),
    ];
    let (checked, built, ran) = matrix_on_threads_with(256, &small_spec(), Duration::from_secs(300), &linear);
    assert!(checked > 0);
    println!(
        "256 thread ranks, linear algorithms: built in {built:.2?}, {checked} calls checked per rank in {ran:.2?}"
    );
}

/// Every rank sends to every other rank first (blocking sends, ascending peers), then receives
/// from every other rank (descending peers): each send must return once its message is
/// buffered, even though the receiver has not yet used its point-to-point link with the sender.
#[test]
fn blocking_sends_to_every_peer_return_before_any_receive_with_64_thread_ranks() {
    let n = 64;
    let timeout = Duration::from_secs(60);
    let group = LoopbackBootstrap::group(n, timeout);
    let config = Config { timeout, ..Config::default() };
    let results = on_thread_ranks(group, |b| {
        let comm = Communicator::builder(b).with_transport(LoopbackTransport).with_config(config.clone()).build()?;
        let me = comm.rank();
        let message = |from: usize, to: usize| vec![(from * n + to) as u32; 1 + (from + to) % 7];
        for peer in (0..n).filter(|&p| p != me) {
            comm.send(&message(me, peer), peer)?;
        }
        for peer in (0..n).rev().filter(|&p| p != me) {
            let mut got = vec![0u32; message(peer, me).len()];
            comm.recv(&mut got, peer)?;
            if got != message(peer, me) {
                return Err(comm_core::Error::protocol(format!("rank {me} received {got:?} from rank {peer}")));
            }
        }
        Ok::<_, comm_core::Error>(())
    });
    for (rank, result) in results.into_iter().enumerate() {
        result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
}

/// `n` thread ranks build a communicator; the ranks of `dead` drop theirs (their bootstraps go
/// with it, as a process's would); every other rank agrees on the lost ranks, shrinks, and
/// checks an all-reduce on the shrunk communicator. Returns the slowest agreement and the
/// slowest agreement + shrink.
fn agree_and_shrink_on_threads(n: usize, dead: &[usize], timeout: Duration) -> (Duration, Duration) {
    let group = LoopbackBootstrap::group(n, timeout);
    let config = Config { timeout, ..Config::default() };
    let built = std::sync::Barrier::new(n);
    let done = std::sync::Barrier::new(n - dead.len());
    let (built, done) = (&built, &done);
    let took: Vec<(Duration, Duration)> = on_thread_ranks(group, |b| {
        let rank = b_rank(&b);
        let comm = Communicator::builder(b)
            .with_transport(LoopbackTransport)
            .with_config(config.clone())
            .build()
            .unwrap_or_else(|e| panic!("rank {rank}: building the communicator: {e}"));
        built.wait();
        if dead.contains(&rank) {
            drop(comm);
            return (Duration::ZERO, Duration::ZERO);
        }
        let started = Instant::now();
        let lost = comm.agree_on_failed().unwrap_or_else(|e| panic!("rank {rank}: agree: {e}"));
        let agreed = started.elapsed();
        assert_eq!(lost, dead, "rank {rank} agreed on the wrong ranks");
        let shrunk = comm.shrink(&lost).unwrap_or_else(|e| panic!("rank {rank}: shrink: {e}"));
        let took = started.elapsed();
        let mut sum = [0u64];
        shrunk.all_reduce(&[rank as u64], &mut sum, ReduceOp::Sum).unwrap();
        let want: u64 = (0..n as u64).filter(|r| !dead.contains(&(*r as usize))).sum();
        assert_eq!(sum[0], want, "rank {rank}: the shrunk communicator's all-reduce");
        // Reachable until every survivor is done: a late one may still ask.
        done.wait();
        (agreed, took)
    });
    let agreed = took.iter().map(|t| t.0).max().unwrap_or_default();
    (agreed, took.iter().map(|t| t.1).max().unwrap_or_default())
}

#[test]
fn sixty_four_thread_ranks_agree_on_three_lost_and_shrink() {
    let (agreed, took) = agree_and_shrink_on_threads(64, &[0, 17, 63], Duration::from_secs(20));
    println!("64 thread ranks, 3 lost: agreed in {agreed:.2?}, agree + shrink in {took:.2?}");
}

#[test]
#[ignore = "1,024 threads: about 3 GB and 90 s on two cores (docs/perf-log/failures.md); run with --ignored"]
fn a_thousand_and_twenty_four_thread_ranks_agree_and_shrink_within_five_seconds() {
    let (agreed, took) = agree_and_shrink_on_threads(1024, &[5, 511, 1000], Duration::from_secs(300));
    println!("1,024 thread ranks, 3 lost: agreed in {agreed:.2?}, agree + shrink in {took:.2?}");
    assert!(took < Duration::from_secs(5), "agree + shrink took {took:.2?}");
}

/// Four thread ranks on two posed nodes run a hierarchical all-reduce; rank 3 revokes instead
/// of calling the second one. The others wait in a step (on a node or rail communicator) for
/// it: the revocation of the communicator must end those waits within milliseconds, not at the
/// timeout.
#[test]
fn a_revocation_ends_a_hierarchical_call_waiting_in_a_step() {
    const N: usize = 4;
    let timeout = Duration::from_secs(20);
    let ready = std::sync::Barrier::new(N);
    let ready = &ready;
    on_thread_ranks(LoopbackBootstrap::group(N, timeout), |b| {
        let rank = b_rank(&b);
        let config = Config { timeout, host_id: Some(format!("posed-node-{}", rank / 2)), ..Config::default() };
        let comm = Communicator::builder(b)
            .with_transport(LoopbackTransport)
            .with_config(config)
            .with_algorithm(Collective::AllReduce, Algorithm::Hierarchical)
            .build()
            .unwrap_or_else(|e| panic!("rank {rank}: building the communicator: {e}"));
        let mut sum = [0u64; 1024];
        comm.all_reduce(&[rank as u64 + 1; 1024], &mut sum, ReduceOp::Sum).unwrap();
        assert_eq!(sum, [10; 1024], "rank {rank}: the first all-reduce");
        ready.wait();
        if rank == N - 1 {
            std::thread::sleep(Duration::from_millis(200));
            comm.revoke();
            return;
        }
        let started = Instant::now();
        let e = comm.all_reduce(&[1u64; 1024], &mut sum, ReduceOp::Sum).expect_err("rank 3 never called");
        let took = started.elapsed();
        assert!(matches!(e, comm_core::Error::Revoked(_)), "rank {rank}: {e}");
        assert!(took < Duration::from_secs(3), "rank {rank}: the revoked call returned after {took:.2?}");
    });
}

/// The stack of a rank thread in a job of more than [`SMALL_JOB`] ranks: small, so that a
/// thousand ranks fit. Smaller jobs keep the default (which `RUST_MIN_STACK` sets).
const RANK_STACK_BYTES: usize = 1 << 20;
/// The most ranks whose threads keep the default stack.
const SMALL_JOB: usize = 64;

/// Runs `body` on each bootstrap of `group` (one loopback job), each in its own thread named
/// after its rank; returns what each rank returned, in rank order; panics where a rank did.
fn on_thread_ranks<R: Send>(group: Vec<LoopbackBootstrap>, body: impl Fn(LoopbackBootstrap) -> R + Sync) -> Vec<R> {
    let body = &body;
    let small_stacks = group.len() > SMALL_JOB;
    std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .map(|b| {
                let thread = std::thread::Builder::new().name(format!("rank-{}", b_rank(&b)));
                let thread = if small_stacks { thread.stack_size(RANK_STACK_BYTES) } else { thread };
                thread.spawn_scoped(s, move || body(b)).expect("spawning a rank thread")
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank thread panicked")).collect()
    })
}

/// Counts a rank as done when dropped, so that a rank that panics counts too.
struct DoneOnDrop<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for DoneOnDrop<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Waits until `count` reaches `n`, a minute at the most.
fn wait_for_count(count: &std::sync::atomic::AtomicUsize, n: usize, rank: usize) {
    let started = Instant::now();
    while count.load(std::sync::atomic::Ordering::Acquire) < n {
        assert!(started.elapsed() < Duration::from_secs(60), "rank {rank}: the other ranks never finished");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_revocation_does_not_end_a_split_and_an_abort_does() {
    const N: usize = 3;
    let timeout = Duration::from_secs(20);
    // Every rank stays until ranks 0 and 1 are done with the child (gone, a rank would be a lost
    // peer, not a late one); a rank that panics counts as done, so nothing waits for it.
    let done = std::sync::atomic::AtomicUsize::new(0);
    let done = &done;
    on_thread_ranks(LoopbackBootstrap::group(N, timeout), |b| {
        let rank = b_rank(&b);
        let finished = (rank < N - 1).then(|| DoneOnDrop(done));
        let config = Config { timeout, ..Config::default() };
        let comm = Communicator::builder(b)
            .with_transport(LoopbackTransport)
            .with_config(config)
            .build()
            .unwrap_or_else(|e| panic!("rank {rank}: building the communicator: {e}"));
        // Rank 2 revokes the communicator while ranks 0 and 1 wait in a split for it,
        // then splits too: a member may revoke a parent once its own split is done, so
        // a revocation must not end a split the others are still in.
        if rank == N - 1 {
            std::thread::sleep(Duration::from_millis(200));
            comm.revoke();
        }
        let child = comm
            .split(Some(0), rank as i64)
            .unwrap_or_else(|e| panic!("rank {rank}: the split of a revoked parent: {e}"))
            .expect("every rank passed color 0");
        assert_eq!((child.rank(), child.world_size()), (rank, N));
        // Ranks 0 and 1 split the child, rank 2 never does: an abort (from another
        // thread) ends the wait, well before the 20-second timeout would.
        if rank == N - 1 {
            wait_for_count(done, N - 1, rank);
            return;
        }
        let aborting = child.abort_handle();
        let abort = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            aborting.abort();
            Instant::now()
        });
        let e = child.split(Some(0), 0).map(|_| ()).expect_err("rank 2 never split the child");
        let aborted_at = abort.join().unwrap();
        // Its own abort, or the other rank's passed on to it by the tree all-gather
        // (whichever came first), never the timeout.
        let aborted = matches!(e, comm_core::Error::Aborted(_)) || e.to_string().contains("aborted");
        assert!(aborted, "rank {rank}: {e}");
        let took = aborted_at.elapsed();
        assert!(took < Duration::from_secs(10), "rank {rank}: the aborted split returned after {took:.2?}");
        drop(finished);
        wait_for_count(done, N - 1, rank);
    });
}
