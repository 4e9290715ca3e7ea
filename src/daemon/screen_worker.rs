//! The screen model on a thread of its own, off the output path.
//!
//! Parsing output into a grid is the costliest per-byte work the daemon
//! does, and no viewer needs it while it streams: it is only read for a
//! Scrollback (on attach) and the final Snapshot. So the terminal task
//! forwards each chunk first and hands it to this worker, which parses on
//! its own thread in stream order (docs/ARCHITECTURE.md, "The output path").
//!
//! Batches: chunks are handed over [`FEED_BATCH`] bytes at a time (they are
//! `Bytes` shared with the output ring, so holding them copies nothing), and
//! whatever is still held goes first when a snapshot or a resize is asked
//! for. One wake-up of the thread per batch instead of one per PTY read.
//!
//! Exactness: jobs are handled strictly in the order they were queued, so
//! a snapshot asked for after the chunk ending at offset N is the screen at
//! exactly N, however far behind the parser was when it was asked.
//!
//! Backpressure: the queue is bounded; when the parser falls that far
//! behind, `feed` waits, the terminal task stops taking PTY reads, and the
//! program is slowed to the parser's pace rather than memory growing.

use std::io;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::screen::{GridSize, ScreenModel};

/// Output held by the terminal task before it is handed to the thread.
const FEED_BATCH: usize = 64 * 1024;
/// Jobs queued for the parser. A batch is at most [`FEED_BATCH`] plus one
/// PTY read and a held-back tail (~80 KiB), so this lets the parser lag by
/// about 1.3 MiB: enough to absorb bursts, small next to what a program
/// writes in a second.
const QUEUED_JOBS: usize = 16;
/// vt100 keeps its state on the heap; the stack only holds the parser's frames.
const THREAD_STACK_BYTES: usize = 256 * 1024;

enum Job {
    Feed(Vec<Bytes>),
    Resize(GridSize),
    Snapshot(oneshot::Sender<Bytes>),
}

/// The terminal task's handle on its screen thread. Dropping it ends the thread.
pub struct ScreenWorker {
    jobs: mpsc::Sender<Job>,
    /// Output not handed to the thread yet, in order, and its length.
    held: Vec<Bytes>,
    held_bytes: usize,
    /// The size the model has once every queued job is done.
    size: GridSize,
}

impl ScreenWorker {
    /// Starts the thread with a blank screen of `size`.
    pub fn start(name: String, size: GridSize) -> io::Result<Self> {
        let (jobs, queue) = mpsc::channel(QUEUED_JOBS);
        std::thread::Builder::new()
            .name(name)
            .stack_size(THREAD_STACK_BYTES)
            .spawn(move || run(ScreenModel::new(size), queue))?;
        Ok(Self { jobs, held: Vec::new(), held_bytes: 0, size })
    }

    /// Takes output for the model; a full batch is queued, waiting while
    /// the queue is full.
    pub async fn feed(&mut self, data: Bytes) {
        self.held_bytes += data.len();
        self.held.push(data);
        if self.held_bytes >= FEED_BATCH {
            self.hand_over().await;
        }
    }

    /// Queues the output held so far.
    async fn hand_over(&mut self) {
        if self.held.is_empty() {
            return;
        }
        self.held_bytes = 0;
        // A send fails only if the thread died; snapshots then say so.
        let _ = self.jobs.send(Job::Feed(std::mem::take(&mut self.held))).await;
    }

    /// Resizes the model after the output taken so far.
    pub async fn resize(&mut self, size: GridSize) {
        self.hand_over().await;
        self.size = size;
        let _ = self.jobs.send(Job::Resize(size)).await;
    }

    pub fn size(&self) -> GridSize {
        self.size
    }

    /// The screen after all output taken so far (see [`ScreenModel::snapshot`]).
    /// If the parser thread is gone (it panicked on some input), a blank
    /// repaint: a viewer then sees an empty screen that fills with the
    /// output that follows, which beats no terminal at all.
    pub async fn snapshot(&mut self) -> Bytes {
        self.hand_over().await;
        let (answer, answered) = oneshot::channel();
        if self.jobs.send(Job::Snapshot(answer)).await.is_ok() {
            if let Ok(snapshot) = answered.await {
                return snapshot;
            }
        }
        tracing::error!("tether_daemon_screen_model_lost");
        ScreenModel::new(self.size).snapshot()
    }
}

fn run(mut model: ScreenModel, mut queue: mpsc::Receiver<Job>) {
    let (mut fed_bytes, mut skipped_bytes) = (0usize, 0usize);
    while let Some(job) = queue.blocking_recv() {
        match job {
            Job::Feed(batch) => {
                for data in batch {
                    fed_bytes += data.len();
                    skipped_bytes += model.process(&data);
                }
            }
            Job::Resize(size) => model.resize(size),
            Job::Snapshot(answer) => {
                let _ = answer.send(model.snapshot());
            }
        }
    }
    // How much the cheap path saved (docs/BENCHMARKS.md, issue 10).
    tracing::debug!(fed_bytes, skipped_bytes, "tether_daemon_screen_model_done");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot reflects exactly the output and resizes queued before it,
    /// even when it is asked for while the parser is still busy.
    #[tokio::test(flavor = "current_thread")]
    async fn snapshots_follow_the_queue_order() {
        let mut worker = ScreenWorker::start("screen-test".to_owned(), GridSize::clamped(20, 3)).expect("thread");
        worker.feed(Bytes::from_static(b"first")).await;
        let early = worker.snapshot().await;
        for _ in 0..200 {
            worker.feed(Bytes::from(vec![b'x'; 16 * 1024])).await;
        }
        worker.feed(Bytes::from_static(b"\x1b[H\x1b[2Jlast")).await;
        worker.resize(GridSize::clamped(30, 4)).await;
        let late = worker.snapshot().await;

        let replay = |snapshot: &[u8], cols, rows| {
            let mut parser = vt100::Parser::new(rows, cols, 0);
            parser.process(snapshot);
            parser.screen().contents()
        };
        let rows = |n: u16| std::num::NonZeroU16::new(n).expect("non-zero");
        assert_eq!(replay(&early, rows(20), rows(3)).trim_end(), "first");
        assert_eq!(replay(&late, rows(30), rows(4)).trim(), "last");
        assert_eq!(worker.size(), GridSize::clamped(30, 4));
    }
}
