//! The verdict on a call that timed out or lost a peer: which members are behind, in which
//! call, and how far each got — the same text on every member that asks, since it is computed
//! from the members' [ledgers](crate::ledger) alone.
//!
//! # Asking
//!
//! A member whose call failed sends a [`NoticeKind::LedgerQuery`](crate::notice::NoticeKind)
//! to every member not known lost; each member's notice service answers at once with its
//! ledger entry (whatever its own threads are doing), in a `LedgerAnswer` notice. The asker
//! waits for every answer, or for members to be known lost, at most a bounded time (the
//! *silence*): a member that says nothing by then is stopped (`SIGSTOP`), hung in its kernel,
//! or cut off.
//!
//! # Judging
//!
//! During a stall the ledgers do not move: the waiting members stay in the stalled call (a
//! failed call is begun and not finished), the member behind stays where it is. So members
//! asking at different moments get the same answers, and [`Verdict::judge`] reads them the
//! same way:
//!
//! - the *frontier* is the highest collective sequence number any member began, and the call
//!   at the frontier is the signature most members there have (ties: the lowest rank's);
//! - a member is *behind* when it was lost, said nothing, has not begun the frontier call, or
//!   began it with another signature (it skipped or changed a call) — or, for a call on device
//!   buffers, when it began the call but its GPU has not started the call's kernel while
//!   another member's GPU has (its GPU is kept busy by work queued before the call);
//! - a member in a point-to-point group whose wait timed out names the peer it waited for.

use std::fmt;
use std::time::Duration;

use crate::ledger::{CallKind, CallSignature, LedgerEntry};

/// What one member's ledger said, or why it said nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberState {
    /// The member answered with its ledger.
    Answered(LedgerEntry),
    /// The member is known lost (its process or host went away).
    Lost,
    /// The member did not answer within the silence.
    Silent,
}

/// Why a member is behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lag {
    /// It was lost.
    Lost,
    /// It did not answer within the silence: stopped, hung, or cut off.
    Silent(Duration),
    /// It has not begun the frontier call: it finished `finished` collectives, and is in
    /// `now` (or in no call).
    Earlier {
        /// Collectives it finished.
        finished: u64,
        /// Collectives it began.
        begun: u64,
        /// The call it is in, if it is in one.
        now: Option<CallSignature>,
    },
    /// It began the frontier call with another signature: it skipped or changed a call.
    Different(CallSignature),
    /// It began the frontier call on device buffers, but its GPU has not started the call's
    /// kernel (it is still on work queued before it); `started` is the latest collective whose
    /// kernel it did start.
    GpuBusy {
        /// The latest collective whose kernel this member's GPU started.
        started: u64,
    },
}

/// The members' ledgers, read (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Each member's state, by rank.
    pub states: Vec<MemberState>,
    /// How long the asker waited for answers at most.
    pub silence: Duration,
    /// The frontier: the highest collective sequence number begun, and its call.
    pub frontier: Option<(u64, CallSignature)>,
    /// The members behind the frontier, by rank, with why.
    pub behind: Vec<(usize, Lag)>,
    /// Members waiting in a point-to-point group, and the peer whose wait timed out.
    pub waiting: Vec<(usize, CallSignature, Option<u32>)>,
}

impl Verdict {
    /// Judges the members' `states` (see the module documentation).
    pub fn judge(states: Vec<MemberState>, silence: Duration) -> Verdict {
        let answered = || {
            states.iter().enumerate().filter_map(|(r, s)| match s {
                MemberState::Answered(e) => Some((r, e)),
                _ => None,
            })
        };
        let top = answered().map(|(_, e)| e.collectives_begun).max().unwrap_or(0);
        // The frontier call: the signature most members at the frontier have in their latest
        // collective; a member whose latest call is a group has moved past its collective.
        let mut counts: Vec<(CallSignature, usize, usize)> = Vec::new();
        for (r, e) in answered() {
            if e.collectives_begun != top || top == 0 {
                continue;
            }
            let Some(sig) = e.latest.filter(|s| s.kind != CallKind::Group) else { continue };
            match counts.iter_mut().find(|c| c.0 == sig) {
                Some(c) => c.1 += 1,
                None => counts.push((sig, 1, r)),
            }
        }
        // Most members, then the lowest first rank.
        let frontier = counts.iter().max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2))).map(|c| (top, c.0));
        // Kernels report when they start where some member's GPU reached the frontier call.
        let gpus_report =
            frontier.is_some_and(|(seq, call)| call.device && answered().any(|(_, e)| e.device_started >= seq));
        let mut behind = Vec::new();
        let mut waiting = Vec::new();
        for (r, s) in states.iter().enumerate() {
            let e = match s {
                MemberState::Lost => {
                    behind.push((r, Lag::Lost));
                    continue;
                }
                MemberState::Silent => {
                    behind.push((r, Lag::Silent(silence)));
                    continue;
                }
                MemberState::Answered(e) => e,
            };
            if let Some(sig) = e.latest.filter(|s| s.kind == CallKind::Group)
                && e.in_call()
            {
                waiting.push((r, sig, e.waited_on));
            }
            let Some((seq, call)) = frontier else { continue };
            if e.collectives_begun < seq {
                let now = e.latest.filter(|_| e.in_call());
                behind.push((r, Lag::Earlier { finished: e.collectives_finished, begun: e.collectives_begun, now }));
            } else if let Some(sig) = e.latest.filter(|s| s.kind != CallKind::Group && *s != call) {
                behind.push((r, Lag::Different(sig)));
            } else if gpus_report && e.collectives_begun == seq && e.device_started < seq {
                behind.push((r, Lag::GpuBusy { started: e.device_started }));
            }
        }
        Verdict { states, silence, frontier, behind, waiting }
    }

    /// The ranks behind, in order.
    pub fn behind_ranks(&self) -> Vec<usize> {
        self.behind.iter().map(|b| b.0).collect()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.states.len();
        write!(f, "verdict of the {n} members' ledgers: ")?;
        let behind = self.behind_ranks();
        match self.frontier {
            Some((seq, call)) => {
                let on_time = (0..n).filter(|r| !behind.contains(r)).count();
                write!(f, "{on_time} reached collective {seq} ({call})")?;
            }
            None => write!(f, "no member began a collective")?,
        }
        if behind.is_empty() {
            write!(f, "; nobody is behind it")?;
        }
        for (r, lag) in &self.behind {
            write!(f, "; rank {r} ")?;
            match lag {
                Lag::Lost => write!(f, "was lost")?,
                Lag::Silent(d) => write!(f, "did not answer within {d:.1?} (stopped, hung or cut off)")?,
                Lag::Earlier { finished, begun, now } => {
                    write!(f, "is behind: finished {finished} collectives")?;
                    match now {
                        Some(call) if call.kind == CallKind::Group => write!(f, ", now in a {call}")?,
                        Some(call) => write!(f, ", now in collective {begun} ({call})")?,
                        None => write!(f, ", in no call now")?,
                    }
                }
                Lag::Different(call) => write!(f, "called {call} there instead (a skipped or changed call)")?,
                Lag::GpuBusy { started } => write!(
                    f,
                    "began it, but its GPU has not started it: the GPU is still on work queued before it (the \
                     latest collective it started is {started})"
                )?,
            }
        }
        for (r, call, peer) in &self.waiting {
            write!(f, "; rank {r} waits in a {call}")?;
            if let Some(p) = peer {
                write!(f, " for rank {p}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(begun: u64, finished: u64, call: CallSignature) -> MemberState {
        MemberState::Answered(LedgerEntry {
            collectives_begun: begun,
            collectives_finished: finished,
            latest: Some(call),
            ..LedgerEntry::default()
        })
    }

    const SILENCE: Duration = Duration::from_millis(500);

    #[test]
    fn lost_silent_earlier_and_different_members_are_behind() {
        let ar = CallSignature::host(CallKind::AllReduce, 4096, None);
        let bc = CallSignature::host(CallKind::Broadcast, 512, Some(1));
        let states = vec![
            at(42, 41, ar),
            MemberState::Lost,
            at(41, 41, ar),
            at(42, 41, bc),
            MemberState::Silent,
            at(42, 41, ar),
        ];
        let v = Verdict::judge(states, SILENCE);
        assert_eq!(v.frontier, Some((42, ar)));
        assert_eq!(v.behind_ranks(), vec![1, 2, 3, 4]);
        assert_eq!(v.behind[1].1, Lag::Earlier { finished: 41, begun: 41, now: None });
        assert_eq!(v.behind[2].1, Lag::Different(bc));
        let text = v.to_string();
        for part in [
            "2 reached collective 42 (all_reduce of 4096 B)",
            "rank 1 was lost",
            "rank 2 is behind: finished 41 collectives, in no call now",
            "rank 3 called broadcast of 512 B, root 1 there instead",
            "rank 4 did not answer within 500.0ms",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
    }

    #[test]
    fn the_same_answers_give_the_same_verdict_and_ties_go_to_the_lowest_rank() {
        let ar = CallSignature::host(CallKind::AllReduce, 8, None);
        let ag = CallSignature::host(CallKind::AllGather, 8, None);
        let states = vec![at(3, 2, ag), at(3, 2, ar)];
        let v = Verdict::judge(states.clone(), SILENCE);
        assert_eq!(v, Verdict::judge(states, SILENCE));
        assert_eq!(v.frontier, Some((3, ag)));
        assert_eq!(v.behind, vec![(1, Lag::Different(ar))]);
    }

    #[test]
    fn a_member_whose_gpu_has_not_started_the_call_is_behind() {
        let ar = CallSignature { device: true, ..CallSignature::host(CallKind::AllReduce, 4096, None) };
        let gpu = |started| {
            MemberState::Answered(LedgerEntry {
                collectives_begun: 3,
                collectives_finished: 3,
                latest: Some(ar),
                device_started: started,
                ..LedgerEntry::default()
            })
        };
        let v = Verdict::judge(vec![gpu(3), gpu(2), gpu(3)], SILENCE);
        assert_eq!(v.behind, vec![(1, Lag::GpuBusy { started: 2 })]);
        let text = v.to_string();
        assert!(text.contains("2 reached collective 3 (all_reduce of 4096 B, device buffers)"), "{text}");
        assert!(
            text.contains("rank 1 began it, but its GPU has not started it: the GPU is still on work queued before it"),
            "{text}"
        );
        // Where no GPU reports its kernels starting, nobody is taken for busy.
        assert!(Verdict::judge(vec![gpu(0), gpu(0)], SILENCE).behind.is_empty());
        // A host call is no GPU's.
        let host = at(3, 3, CallSignature::host(CallKind::AllReduce, 4096, None));
        assert!(Verdict::judge(vec![host.clone(), host], SILENCE).behind.is_empty());
    }

    #[test]
    fn a_member_waiting_in_a_group_names_its_peer() {
        let group = CallSignature::host(CallKind::Group, 36, Some(1));
        let waiting = MemberState::Answered(LedgerEntry {
            collectives_begun: 5,
            collectives_finished: 5,
            groups_begun: 2,
            groups_finished: 1,
            latest: Some(group),
            waited_on: Some(1),
            device_started: 0,
        });
        let idle = at(5, 5, CallSignature::host(CallKind::AllReduce, 8, None));
        let v = Verdict::judge(vec![waiting, idle], SILENCE);
        assert!(v.behind.is_empty(), "{v}");
        assert_eq!(v.waiting, vec![(0, group, Some(1))]);
        assert!(
            v.to_string().contains("rank 0 waits in a point-to-point group of 36 B, first peer 1 for rank 1"),
            "{v}"
        );
        let none = Verdict::judge(vec![MemberState::Answered(LedgerEntry::default()); 2], SILENCE);
        assert!(none.to_string().contains("no member began a collective"), "{none}");
    }
}
