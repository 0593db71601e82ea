//! The ranks' output: one reader thread per pipe drains it line by line (so a rank never blocks
//! on a full pipe), echoes each line with its rank and keeps it for the report when asked.
//!
//! A pipe closes when the rank and everything it started have closed it. Once every rank has
//! been reaped, [`Readers::finish`] waits up to [`OUTPUT_GRACE`] for that and detaches the
//! readers of pipes that a process which escaped its rank's process group still holds.

use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long [`launch`](crate::launch) waits, after every rank has been reaped, for the ranks'
/// output pipes to close. A pipe stays open only when a rank started a process that left its
/// process group and outlived it; that output is then dropped and
/// [`RankReport::output_complete`](crate::RankReport::output_complete) is false.
pub const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// Where the ranks' output lines are echoed as they arrive, each prefixed `[rank R] `.
#[derive(Clone, Default)]
pub enum Echo {
    /// Not echoed (still read, so a rank never blocks on a full pipe).
    #[default]
    Off,
    /// A rank's stdout to our stdout, its stderr to our stderr.
    Stdio,
    /// Both streams of every rank into one writer, one whole line per write.
    To(Arc<Mutex<dyn Write + Send>>),
}

impl fmt::Debug for Echo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Echo::Off => f.write_str("Off"),
            Echo::Stdio => f.write_str("Stdio"),
            Echo::To(_) => f.write_str("To(..)"),
        }
    }
}

/// Which output stream of a rank a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Echo {
    fn line(&self, rank: usize, stream: Stream, line: &str) {
        if matches!(self, Echo::Off) {
            return;
        }
        let msg = format!("[rank {rank}] {line}\n");
        // Echo failures (a closed terminal, a full disk) must not stop the pump that keeps the
        // rank's pipe drained, so they are ignored.
        let _ = match self {
            Echo::Off => Ok(()),
            Echo::Stdio if stream == Stream::Stdout => std::io::stdout().lock().write_all(msg.as_bytes()),
            Echo::Stdio => std::io::stderr().lock().write_all(msg.as_bytes()),
            Echo::To(w) => w.lock().unwrap_or_else(PoisonError::into_inner).write_all(msg.as_bytes()),
        };
    }
}

/// One output-pump thread.
struct Reader {
    /// Index of its rank's process in the job (and in [`Readers::finish`]'s answer).
    proc_index: usize,
    handle: JoinHandle<()>,
    done: bool,
}

/// Tells [`Readers`] that a reader thread has finished, even if it panicked.
struct DoneGuard {
    tx: mpsc::Sender<usize>,
    id: usize,
}

impl Drop for DoneGuard {
    fn drop(&mut self) {
        let _ = self.tx.send(self.id);
    }
}

/// The reader threads of a job, and the channel on which each reports that it has finished.
pub(crate) struct Readers {
    readers: Vec<Reader>,
    done_tx: mpsc::Sender<usize>,
    done_rx: mpsc::Receiver<usize>,
}

impl Readers {
    /// No readers yet.
    pub(crate) fn new() -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        Readers { readers: Vec::new(), done_tx, done_rx }
    }

    /// Starts a thread that drains `pipe`, the `stream` of `rank` (the job's `proc_index`-th
    /// process), echoing each line to `echo` and appending it to `lines` when given.
    pub(crate) fn spawn(
        &mut self,
        proc_index: usize,
        rank: usize,
        stream: Stream,
        pipe: impl Read + Send + 'static,
        echo: Echo,
        lines: Option<Arc<Mutex<Vec<String>>>>,
    ) -> Result<()> {
        let guard = DoneGuard { tx: self.done_tx.clone(), id: self.readers.len() };
        let name = format!("weave-launch-r{rank}-{}", if stream == Stream::Stdout { "out" } else { "err" });
        let handle = thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _guard = guard;
                pump(rank, stream, pipe, &echo, lines.as_deref());
            })
            .map_err(|e| Error::io(format!("start the output reader thread of rank {rank}"), e))?;
        self.readers.push(Reader { proc_index, handle, done: false });
        Ok(())
    }

    /// Joins the reader threads that finish within [`OUTPUT_GRACE`] and detaches the rest.
    /// Returns, for each of the job's `procs` processes, whether all of its output was read.
    pub(crate) fn finish(&mut self, procs: usize) -> Vec<bool> {
        let end = Instant::now() + OUTPUT_GRACE;
        let mut pending = self.readers.iter().filter(|r| !r.done).count();
        while pending > 0 {
            match self.done_rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
                Ok(id) => {
                    if let Some(r) = self.readers.get_mut(id).filter(|r| !r.done) {
                        r.done = true;
                        pending -= 1;
                    }
                }
                Err(_) => break,
            }
        }
        let mut complete = vec![true; procs];
        for r in self.readers.drain(..) {
            if r.done {
                // The thread has sent its last message and is returning; a panic in it only
                // means lost echo lines, which `complete` cannot express better than this.
                let _ = r.handle.join();
            } else if let Some(c) = complete.get_mut(r.proc_index) {
                // Detached: it ends when the last holder of the pipe closes it.
                *c = false;
            }
        }
        complete
    }
}

/// The longest line kept whole: a longer one (a progress bar redrawn with `\r`, binary output)
/// is echoed and captured in pieces of this size, so that a rank cannot grow the launcher's
/// memory without bound.
const MAX_LINE_BYTES: u64 = 64 << 10;

/// Reads `pipe` line by line until it closes, echoing and capturing each line.
fn pump(rank: usize, stream: Stream, pipe: impl Read, echo: &Echo, lines: Option<&Mutex<Vec<String>>>) {
    let mut reader = BufReader::new(pipe);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match (&mut reader).take(MAX_LINE_BYTES).read_until(b'\n', &mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        let text = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let line = String::from_utf8_lossy(text);
        echo.line(rank, stream, &line);
        if let Some(lines) = lines {
            lines.lock().unwrap_or_else(PoisonError::into_inner).push(line.into_owned());
        }
    }
}
