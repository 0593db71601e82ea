//! Turn-taking between the benchmark jobs: weave's ranks and Open MPI's run at the same time but
//! never at once, one batch of one size at a time, so a noisy host hurts both alike.
//!
//! The driver listens on a Unix socket; each rank of each job connects once it is up and sends
//! one line, `JOB RANK\n` (`weave 0`, `mpi 1`). Then, for each size and each of the K rounds, the
//! driver gives every job in turn one batch: it writes the byte `g` to each of the job's ranks
//! and reads one byte `d` back from each (a rank writes it after its batch; after the last batch
//! of a size, once rank 0 printed the size's line). Ranks wait for `g` in a blocking read, so
//! the job that is not running leaves the CPUs to the one that is. A rank that dies closes its
//! socket (the driver errors at once); a driver that dies closes every socket (the ranks error
//! and their jobs end).
//!
//! `Turns` is the driver's end, [`RankTurns`] a rank's (the bench workers').

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use weave_launch::CancelToken;

/// How often a wait looks at the deadline, the cancel token and whether the job still runs.
const POLL: Duration = Duration::from_millis(50);

/// One job taking turns: its name in the hello lines, its ranks' sockets (by rank), and a flag
/// its runner thread sets when the job has ended.
pub(crate) struct Job {
    /// `weave` or `mpi`, as the ranks say in their hello line.
    pub(crate) name: &'static str,
    /// Set when the job's processes have all exited.
    pub(crate) ended: Arc<AtomicBool>,
    streams: Vec<Option<UnixStream>>,
}

impl Job {
    /// A job of `ranks` ranks whose runner sets `ended` when it is over.
    pub(crate) fn new(name: &'static str, ranks: usize, ended: Arc<AtomicBool>) -> Job {
        Job { name, ended, streams: (0..ranks).map(|_| None).collect() }
    }
}

/// The driver's side of the turn socket.
pub(crate) struct Turns {
    listener: UnixListener,
    path: PathBuf,
    jobs: Vec<Job>,
    deadline: Instant,
    token: CancelToken,
}

impl Turns {
    /// Listens on a fresh socket in `dir` for the ranks of `jobs`; every wait ends with an error
    /// after `timeout` in all or when `token` is cancelled.
    pub(crate) fn listen(dir: &Path, jobs: Vec<Job>, timeout: Duration, token: CancelToken) -> Result<Turns, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = dir.join(format!("turns-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        listener.set_nonblocking(true).map_err(|e| format!("turn socket: {e}"))?;
        Ok(Turns { listener, path, jobs, deadline: Instant::now() + timeout, token })
    }

    /// The socket path the ranks connect to (`--turns PATH`).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Errors when the run should stop waiting: timeout, cancel, or `job` ended early.
    fn check(&self, job: Option<usize>, what: &str) -> Result<(), String> {
        if let Some(s) = self.token.requested() {
            return Err(format!("cancelled with {} while {what}", s.as_str()));
        }
        if Instant::now() > self.deadline {
            return Err(format!("timed out while {what}"));
        }
        let ended = |j: &Job| j.ended.load(Ordering::Acquire);
        match job {
            Some(j) if ended(&self.jobs[j]) => Err(format!("the {} job ended while {what}", self.jobs[j].name)),
            None => match self.jobs.iter().find(|j| ended(j)) {
                Some(j) => Err(format!("the {} job ended while {what}", j.name)),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// Waits until every rank of every job has connected and said who it is.
    pub(crate) fn accept_all(&mut self) -> Result<(), String> {
        let what = "waiting for the ranks to connect to the turn socket";
        while self.jobs.iter().any(|j| j.streams.iter().any(Option::is_none)) {
            match self.listener.accept() {
                Ok((stream, _)) => self.hello(stream)?,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.check(None, what)?;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(format!("turn socket accept: {e}")),
            }
        }
        Ok(())
    }

    /// Reads a new connection's hello line and files it under its job and rank.
    fn hello(&mut self, mut stream: UnixStream) -> Result<(), String> {
        let io = |e: std::io::Error| format!("turn socket: {e}");
        stream.set_nonblocking(false).map_err(io)?;
        stream.set_read_timeout(Some(POLL)).map_err(io)?;
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while b[0] != b'\n' {
            match stream.read(&mut b) {
                Ok(1) if line.len() < 64 => line.push(b[0]),
                Ok(_) => return Err(format!("bad hello on the turn socket: {:?}", String::from_utf8_lossy(&line))),
                // A read with a timeout fails with EINTR after the process was stopped and
                // continued (signal(7)), by a job control or a paused host: look again.
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                    self.check(None, "reading a rank's hello")?
                }
                Err(e) => return Err(io(e)),
            }
        }
        let text = String::from_utf8_lossy(&line);
        let mut words = text.split_whitespace();
        let (name, rank) = (words.next().unwrap_or(""), words.next().and_then(|r| r.parse::<usize>().ok()));
        let slot = self
            .jobs
            .iter_mut()
            .find(|j| j.name == name)
            .and_then(|j| rank.and_then(|r| j.streams.get_mut(r)))
            .filter(|s| s.is_none())
            .ok_or_else(|| format!("unexpected hello on the turn socket: {:?}", text.trim()))?;
        *slot = Some(stream);
        Ok(())
    }

    /// Gives job `j` one turn: `g` to each of its ranks, then waits for every rank's `d`.
    pub(crate) fn turn(&mut self, j: usize) -> Result<(), String> {
        let name = self.jobs[j].name;
        for (r, s) in self.jobs[j].streams.iter_mut().enumerate() {
            let s = s.as_mut().ok_or_else(|| format!("{name} rank {r} is not connected"))?;
            s.write_all(b"g").map_err(|e| format!("giving {name} rank {r} its turn: {e}"))?;
        }
        for r in 0..self.jobs[j].streams.len() {
            let what = format!("waiting for {name} rank {r} to end its batch");
            loop {
                let mut b = [0u8; 1];
                let read = match self.jobs[j].streams[r].as_mut() {
                    Some(s) => s.read(&mut b),
                    None => return Err(format!("{name} rank {r} is not connected")),
                };
                match read {
                    Ok(1) if b[0] == b'd' => break,
                    Ok(0) => return Err(format!("{name} rank {r} closed the turn socket")),
                    Ok(_) => return Err(format!("{name} rank {r} sent {:?} on the turn socket", b[0] as char)),
                    Err(e)
                        if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) =>
                    {
                        self.check(Some(j), &what)?
                    }
                    Err(e) => return Err(format!("{what}: {e}")),
                }
            }
        }
        Ok(())
    }

    /// Closes every rank's socket (ranks still waiting for a turn then fail, ending their job).
    pub(crate) fn close(&mut self) {
        for j in &mut self.jobs {
            j.streams.iter_mut().for_each(|s| *s = None);
        }
    }
}

impl Drop for Turns {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A rank's end of the driver's turn socket (`--turns`); without one, every turn is the rank's.
pub struct RankTurns {
    stream: Option<UnixStream>,
}

impl RankTurns {
    /// Connects to the driver's socket at `path` (none: no turn-taking) and says which rank this
    /// is, once its communicator is up; a wait for a turn gives up after `timeout`.
    pub fn connect(path: Option<&str>, timeout: Duration, rank: usize) -> comm_core::Result<RankTurns> {
        let Some(path) = path else { return Ok(RankTurns { stream: None }) };
        let io = |what: &str, e: std::io::Error| comm_core::Error::protocol(format!("turn socket {path}: {what}: {e}"));
        let mut stream = UnixStream::connect(path).map_err(|e| io("connect", e))?;
        stream.set_read_timeout(Some(timeout)).map_err(|e| io("set_read_timeout", e))?;
        stream.write_all(format!("weave {rank}\n").as_bytes()).map_err(|e| io("hello", e))?;
        Ok(RankTurns { stream: Some(stream) })
    }

    /// Blocks until the driver gives this job the next turn.
    pub fn wait(&mut self) -> comm_core::Result<()> {
        let Some(s) = self.stream.as_mut() else { return Ok(()) };
        let mut b = [0u8; 1];
        loop {
            return match s.read(&mut b) {
                Ok(1) if b[0] == b'g' => Ok(()),
                Ok(0) => Err(comm_core::Error::protocol("the bench driver closed the turn socket")),
                Ok(_) => Err(comm_core::Error::protocol(format!("unexpected turn byte {:?}", b[0] as char))),
                // A read with a timeout fails with EINTR after the process was stopped and
                // continued (signal(7)): wait on.
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => Err(comm_core::Error::protocol(format!("waiting for a turn: {e}"))),
            };
        }
    }

    /// Hands the turn back to the driver.
    pub fn done(&mut self) -> comm_core::Result<()> {
        let Some(s) = self.stream.as_mut() else { return Ok(()) };
        s.write_all(b"d").map_err(|e| comm_core::Error::protocol(format!("ending a turn: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake rank: connects, says hello, then answers `rounds` turns.
    fn rank(path: PathBuf, name: &'static str, r: usize, rounds: usize, log: Arc<std::sync::Mutex<Vec<String>>>) {
        let mut s = UnixStream::connect(path).unwrap();
        s.write_all(format!("{name} {r}\n").as_bytes()).unwrap();
        for i in 0..rounds {
            let mut b = [0u8; 1];
            s.read_exact(&mut b).unwrap();
            assert_eq!(b[0], b'g');
            log.lock().unwrap().push(format!("{name}{i}"));
            s.write_all(b"d").unwrap();
        }
    }

    #[test]
    fn jobs_alternate_and_a_dead_job_is_an_error() {
        let dir = std::env::temp_dir().join(format!("weave-turns-test-{}", std::process::id()));
        let ended = || Arc::new(AtomicBool::new(false));
        let jobs = vec![Job::new("weave", 2, ended()), Job::new("mpi", 2, ended())];
        let mut t = Turns::listen(&dir, jobs, Duration::from_secs(20), CancelToken::new()).unwrap();
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let threads: Vec<_> = [("weave", 0), ("weave", 1), ("mpi", 0), ("mpi", 1)]
            .into_iter()
            .map(|(n, r)| {
                let (p, l) = (t.path().to_path_buf(), log.clone());
                std::thread::spawn(move || rank(p, n, r, 2, l))
            })
            .collect();
        t.accept_all().unwrap();
        for _ in 0..2 {
            t.turn(0).unwrap();
            t.turn(1).unwrap();
        }
        threads.into_iter().for_each(|h| h.join().unwrap());
        let log = log.lock().unwrap().clone();
        let order: Vec<&str> = log.iter().map(|s| s.trim_end_matches(char::is_numeric)).collect();
        assert_eq!(order, ["weave", "weave", "mpi", "mpi", "weave", "weave", "mpi", "mpi"]);
        // The ranks have closed their sockets: the next turn fails at once instead of waiting.
        assert!(t.turn(0).is_err());
        t.close();
        drop(t);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
