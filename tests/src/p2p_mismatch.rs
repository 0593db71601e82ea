//! The point-to-point mismatch scenario of `collectives-worker p2p-mismatch OVER` (issue
//! "survive a failure", item 7): a send that nobody receives must never be taken for a later
//! message. `OVER` picks the path: `mailbox` (the host mailboxes over shared memory),
//! `channel` (channel links over shared memory), `tcp` (channel links, every rank a posed node
//! of its own, so every link is a TCP connection).
//!
//! 1. Rank 1 sends 36 B to rank 0, which posts no receive; then both exchange in a group (rank
//!    0 receives 20 B and sends 8 B). Rank 0 must find the mismatch at that exchange, naming
//!    rank 1's earlier group, and revoke: every rank's next all-reduce fails with `Revoked`.
//! 2. After agreeing (nobody failed) and shrinking to a fresh communicator: rank 1 sends 36 B
//!    that rank 0 receives only after an all-reduce, in a group of the same size. Rank 0 must
//!    find that the two groups lie on either side of a collective (or, where the collective
//!    shares the pair's link, that the collective met the orphan); again everyone stops.
//!
//! No receive may ever return data of the wrong message; the `OK` line names what each rank saw.

use collectives::{Algorithm, Collective, Communicator, ReduceOp};
use comm_core::config::Config;
use comm_core::{Error, Result};

/// The communicator of the scenario over `over` (see the module documentation).
fn communicator(over: &str) -> Result<Communicator> {
    let bootstrap = comm_core::bootstrap::from_env()?;
    let mut config = Config::from_env()?;
    let builder = match over {
        "mailbox" => Communicator::builder(bootstrap),
        "channel" => Communicator::builder(bootstrap).with_algorithm(Collective::SendRecv, Algorithm::ChannelDirect),
        "tcp" => {
            config.host_id = Some(format!("posed-node-{}", comm_core::bootstrap::Bootstrap::rank(&bootstrap)));
            Communicator::builder(bootstrap).with_algorithm(Collective::SendRecv, Algorithm::ChannelDirect)
        }
        other => return Err(Error::invalid(format!("p2p-mismatch: unknown path {other:?}"))),
    };
    builder.with_config(config).build()
}

/// What rank 0 must say about the mismatch of a case, and how the others' calls must end.
fn expect_mismatch(me: usize, r: Result<()>, says: &[&str]) -> Result<String> {
    match (me, r) {
        (0, Err(e @ Error::Protocol(_))) => {
            let text = e.to_string();
            match says.iter().find(|s| !text.contains(*s)) {
                Some(missing) => Err(Error::protocol(format!("rank 0's error lacks {missing:?}: {text}"))),
                None => Ok(text),
            }
        }
        (0, other) => Err(Error::protocol(format!("rank 0 was to find a mismatch, got {other:?}"))),
        // Rank 1's group ends as the revocation cuts it short, or finds a mismatch itself.
        (_, Err(Error::Revoked(_) | Error::Protocol(_)) | Ok(())) => Ok(String::new()),
        (_, Err(e)) => Err(Error::protocol(format!("rank {me}: expected a revocation, got {e}"))),
    }
}

/// Every rank's next call must fail with `Revoked`.
fn expect_revoked(comm: &Communicator, case: usize) -> Result<()> {
    let mut out = [0u64];
    match comm.all_reduce(&[1u64], &mut out, ReduceOp::Sum) {
        Err(Error::Revoked(_)) => Ok(()),
        other => Err(Error::protocol(format!("case {case}: the all-reduce after the mismatch returned {other:?}"))),
    }
}

/// Runs the scenario on this rank (see the module documentation).
pub fn p2p_mismatch(over: &str) -> Result<String> {
    let comm = communicator(over)?;
    let (me, n) = (comm.rank(), comm.world_size());
    if n < 2 {
        return Err(Error::invalid("p2p-mismatch needs at least 2 ranks"));
    }
    let orphan = [0x0au8; 36];
    let (mut got, mut twenty, eight) = ([0u8; 36], [0u8; 20], [8u8; 8]);
    let mut back = [0u8; 8];
    // Case 1: an orphaned send, then an exchange that differs.
    let r = match me {
        0 => {
            let mut g = comm.group();
            g.recv(&mut twenty, 1).send(&eight, 1);
            g.run()
        }
        1 => {
            comm.send(&orphan, 0)?;
            let later = [0x0bu8; 20];
            let mut g = comm.group();
            g.send(&later, 0).recv(&mut back, 0);
            g.run()
        }
        _ => Ok(()),
    };
    let first = expect_mismatch(
        me,
        r,
        &["rank 1 sent 36 B in its point-to-point group 1", "rank 0 met receiving 20 B in its group 1"],
    )?;
    expect_revoked(&comm, 1)?;
    let lost = comm.agree_on_failed()?;
    if !lost.is_empty() {
        return Err(Error::protocol(format!("the agreement after case 1 found failed ranks {lost:?}")));
    }
    let comm = comm.shrink(&[])?;
    // Case 2: an orphaned send received after a collective, by a group of the same size. A
    // first exchange opens the pair's link (a send on a link not open yet waits for the peer).
    if me < 2 {
        let (mine, mut hello) = ([me as u8; 4], [0u8; 4]);
        let mut g = comm.group();
        g.send(&mine, 1 - me).recv(&mut hello, 1 - me);
        g.run()?;
        if hello != [(1 - me) as u8; 4] {
            return Err(Error::protocol(format!("WRONG DATA: the first exchange of case 2 gave {hello:?}")));
        }
    }
    if me == 1 {
        comm.send(&orphan, 0)?;
    }
    let mut sum = [0u64];
    // Where collectives and sends share the pair's link (channel links), the collective meets
    // the orphan first.
    let r = comm.all_reduce(&[1u64], &mut sum, ReduceOp::Sum).and_then(|()| {
        if sum[0] != n as u64 {
            return Err(Error::protocol(format!("WRONG DATA: the all-reduce between the cases gave {}", sum[0])));
        }
        match me {
            0 => comm.recv(&mut got, 1),
            1 => comm.send(&[0x0bu8; 36], 0),
            _ => Ok(()),
        }
    });
    // Found at the receive (the groups' epochs differ) or at the collective.
    let at_collective = matches!(&r, Err(Error::Protocol(m)) if m.contains("before this all_reduce"));
    let says: &[&str] = if at_collective {
        &["rank 1 sent 36 B in its point-to-point group 2, which no receive of rank 0 took before this all_reduce"]
    } else {
        // The receiver's epoch; the sender's is in its stamp (over links, only its digest).
        &[
            "rank 1 sent 36 B in its point-to-point group 2",
            "its group 2 (its exchange 2 with rank 1, after 1 collectives",
        ]
    };
    let second = expect_mismatch(me, r, says)?;
    expect_revoked(&comm, 2)?;
    if (got.contains(&0x0b) || twenty.contains(&0x0b)) && me == 0 {
        return Err(Error::protocol("WRONG DATA: a receive that failed still took the later message"));
    }
    Ok(match me {
        0 => format!("both mismatches found: {first} | {second}"),
        _ => "revoked as rank 0 found the mismatches".into(),
    })
}
