//! A run's output capture (docs/REST.md, "Runs"; docs/CLUSTER.md, "Run
//! logs across moves"): the bytes of a run's terminal on their way to the
//! run's log, as plain state so its rules are tested on their own. The
//! arbiter feeds it live output like a viewer's queue and flushes it to the
//! store; after a reconnect or an owner change it resumes from
//! [`RunCapture::end`], the first byte the log does not have.
//!
//! Every byte is kept with its stream offset, so the capture and the store
//! are idempotent by offset: bytes the capture already has are not taken
//! twice (a partly-overlapping chunk adds only its new part), and a stream
//! that restarts past the capture's end (the daemon's ring no longer held
//! the bytes in between) leaves a chunk that starts past the previous one,
//! which the store counts as lost (`logGapBytes`).
//!
//! While the database cannot take the log (docs/OPERATIONS.md, "Faults")
//! the chunks are put back and flushed later, so pending bytes are capped
//! at the log's own limit (`runs.log_max_bytes`): once that many wait, the
//! log will be full when they land, so later bytes could never be stored
//! and are not kept.

use uuid::Uuid;

/// Stream bytes to store, starting at `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub offset: u64,
    pub data: Vec<u8>,
}

#[derive(Debug)]
pub struct RunCapture {
    pub run_id: Uuid,
    /// Bytes received and not yet written to the log, in stream order;
    /// a new chunk starts only after a gap.
    pending: Vec<Chunk>,
    /// The stream offset after the last byte received.
    end: u64,
    /// Bytes lost to gaps since the capture started (for the log line).
    lost: u64,
    /// The log's limit: pending bytes never exceed it.
    limit: usize,
    /// `limit` bytes were pending at once: the log is full when they land.
    full: bool,
}

impl RunCapture {
    /// A capture of `run_id` whose log already reaches stream offset `end`
    /// and holds at most `limit` bytes.
    pub fn new(run_id: Uuid, end: u64, limit: usize) -> Self {
        Self { run_id, pending: Vec::new(), end, lost: 0, limit, full: false }
    }

    fn pending_bytes(&self) -> usize {
        self.pending.iter().map(|c| c.data.len()).sum()
    }

    /// Stream bytes from `offset`: only what lies past the capture's end is
    /// kept. Returns the bytes skipped over (lost) when `offset` is past
    /// the end.
    pub fn push(&mut self, offset: u64, data: &[u8]) -> u64 {
        let chunk_end = offset + data.len() as u64;
        if chunk_end <= self.end || self.full {
            return 0; // already held, or past what the log can hold
        }
        let gap = offset.saturating_sub(self.end);
        let fresh = &data[usize::try_from(self.end.saturating_sub(offset)).unwrap_or(usize::MAX).min(data.len())..];
        let room = self.limit.saturating_sub(self.pending_bytes());
        let (fresh, chunk_end) = if fresh.len() >= room {
            self.full = true;
            (&fresh[..room], offset.max(self.end) + room as u64)
        } else {
            (fresh, chunk_end)
        };
        match self.pending.last_mut() {
            Some(last) if gap == 0 => last.data.extend_from_slice(fresh),
            _ => self.pending.push(Chunk { offset: offset.max(self.end), data: fresh.to_vec() }),
        }
        self.end = chunk_end.max(self.end);
        self.lost += gap;
        gap
    }

    /// The stream restarts at `offset` without the bytes before it (the
    /// daemon answered a resume with a snapshot: its ring no longer held
    /// them). Returns the bytes lost.
    pub fn restart_at(&mut self, offset: u64) -> u64 {
        if offset > self.end {
            self.push(offset, &[])
        } else {
            0
        }
    }

    /// The stream offset after the last byte received: where a capture
    /// that lost its stream resumes.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Bytes lost to gaps since this capture started.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The pending chunks, to be written to the log now, in order.
    pub fn take(&mut self) -> Vec<Chunk> {
        std::mem::take(&mut self.pending)
    }

    /// Taken chunks the log could not take now, back in front of the
    /// pending ones, to be written again.
    pub fn put_back(&mut self, mut chunks: Vec<Chunk>) {
        chunks.append(&mut self.pending);
        self.pending = chunks;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(offset: u64, data: &[u8]) -> Chunk {
        Chunk { offset, data: data.to_vec() }
    }

    #[test]
    fn taken_bytes_leave_the_end_where_it_was() {
        let mut c = RunCapture::new(Uuid::nil(), 10, usize::MAX);
        assert_eq!(c.end(), 10);
        assert_eq!(c.push(10, b"abc"), 0);
        assert!(c.has_pending());
        assert_eq!(c.end(), 13);
        assert_eq!(c.take(), vec![chunk(10, b"abc")]);
        assert!(!c.has_pending());
        assert_eq!(c.end(), 13, "taking moves bytes to the log, the stream position stays");
        assert!(c.take().is_empty());
    }

    #[test]
    fn contiguous_bytes_make_one_chunk() {
        let mut c = RunCapture::new(Uuid::nil(), 0, usize::MAX);
        c.push(0, b"ab");
        c.push(2, b"cd");
        assert_eq!(c.take(), vec![chunk(0, b"abcd")]);
    }

    #[test]
    fn bytes_already_held_are_not_taken_twice() {
        let mut c = RunCapture::new(Uuid::nil(), 5, usize::MAX);
        assert_eq!(c.push(0, b"hello"), 0, "all below the end");
        assert!(!c.has_pending());
        assert_eq!(c.push(3, b"lo world"), 0, "overlaps the end by two bytes");
        assert_eq!(c.take(), vec![chunk(5, b" world")]);
        assert_eq!(c.end(), 11);
        assert_eq!(c.push(11, b""), 0);
        assert!(!c.has_pending(), "an empty chunk at the end is nothing");
    }

    #[test]
    fn a_resume_past_the_end_is_a_gap_of_the_bytes_between() {
        let mut c = RunCapture::new(Uuid::nil(), 5, usize::MAX);
        c.push(5, b"ab");
        assert_eq!(c.push(10, b"xyz"), 3, "bytes 7..10 are missing");
        assert_eq!(c.take(), vec![chunk(5, b"ab"), chunk(10, b"xyz")], "the store sees the jump");
        assert_eq!(c.end(), 13);
        assert_eq!(c.lost(), 3);
    }

    #[test]
    fn a_snapshot_answer_restarts_the_stream_with_a_recorded_gap() {
        let mut c = RunCapture::new(Uuid::nil(), 4, usize::MAX);
        assert_eq!(c.restart_at(4), 0, "restarting at the end loses nothing");
        assert!(!c.has_pending());
        assert_eq!(c.restart_at(9), 5);
        assert_eq!(c.take(), vec![chunk(9, b"")], "an empty chunk carries the gap to the store");
        assert_eq!(c.restart_at(2), 0, "never backwards");
        assert_eq!(c.end(), 9);
    }

    #[test]
    fn chunks_put_back_go_before_the_newer_ones() {
        let mut c = RunCapture::new(Uuid::nil(), 0, usize::MAX);
        c.push(0, b"abc");
        let taken = c.take();
        c.push(3, b"de");
        c.put_back(taken);
        assert_eq!(c.take(), vec![chunk(0, b"abc"), chunk(3, b"de")]);
        assert_eq!(c.end(), 5);
    }

    #[test]
    fn pending_bytes_stop_at_the_logs_limit() {
        let mut c = RunCapture::new(Uuid::nil(), 0, 6);
        c.push(0, b"abcd");
        let taken = c.take();
        c.put_back(taken);
        c.push(4, b"efgh");
        c.push(8, b"ijkl");
        assert_eq!(c.take(), vec![chunk(0, b"abcdef")], "six bytes fill the log; nothing after is kept");
        c.push(12, b"mnop");
        assert!(!c.has_pending(), "the log is full once they land");
        assert_eq!(c.lost(), 0, "bytes past the limit are not a gap");
    }
}
