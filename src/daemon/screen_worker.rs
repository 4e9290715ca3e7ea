//! The screen model on a thread of its own, off the output path.
//!
//! Parsing output into a grid is the costliest per-byte work the daemon
//! does, and no viewer needs it while it streams: it is only read for a
//! Scrollback (on attach) and the final Snapshot. So the terminal task
//! forwards each chunk first and hands it to this worker, which parses on
//! its own thread in stream order (docs/ARCHITECTURE.md, "The output path").
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

/// Chunks queued for the parser. Each is at most one PTY read plus a
/// held-back tail (~16 KiB), so this lets the parser lag by about 1 MiB:
/// enough to absorb bursts, small next to the output ring.
const QUEUED_CHUNKS: usize = 64;
/// vt100 keeps its state on the heap; the stack only holds the parser's frames.
const THREAD_STACK_BYTES: usize = 256 * 1024;

enum Job {
    Feed(Bytes),
    Resize(GridSize),
    Snapshot(oneshot::Sender<Bytes>),
}

/// The terminal task's handle on its screen thread. Dropping it ends the thread.
pub struct ScreenWorker {
    jobs: mpsc::Sender<Job>,
    /// The size the model has once every queued job is done.
    size: GridSize,
}

impl ScreenWorker {
    /// Starts the thread with a blank screen of `size`.
    pub fn start(name: String, size: GridSize) -> io::Result<Self> {
        let (jobs, queue) = mpsc::channel(QUEUED_CHUNKS);
        std::thread::Builder::new()
            .name(name)
            .stack_size(THREAD_STACK_BYTES)
            .spawn(move || run(ScreenModel::new(size), queue))?;
        Ok(Self { jobs, size })
    }

    /// Queues output for the model, waiting while the queue is full.
    pub async fn feed(&self, data: Bytes) {
        // A send fails only if the thread died; snapshots then say so.
        let _ = self.jobs.send(Job::Feed(data)).await;
    }

    /// Resizes the model after the output queued so far.
    pub async fn resize(&mut self, size: GridSize) {
        self.size = size;
        let _ = self.jobs.send(Job::Resize(size)).await;
    }

    pub fn size(&self) -> GridSize {
        self.size
    }

    /// The screen after everything queued so far (see [`ScreenModel::snapshot`]).
    /// If the parser thread is gone (it panicked on some input), a blank
    /// repaint: a viewer then sees an empty screen that fills with the
    /// output that follows, which beats no terminal at all.
    pub async fn snapshot(&self) -> Bytes {
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
            Job::Feed(data) => {
                fed_bytes += data.len();
                skipped_bytes += model.process(&data);
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
