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
}

impl RunCapture {
    /// A capture of `run_id` whose log already reaches stream offset `end`.
    pub fn new(run_id: Uuid, end: u64) -> Self {
        Self { run_id, pending: Vec::new(), end, lost: 0 }
    }

    /// Stream bytes from `offset`: only what lies past the capture's end is
    /// kept. Returns the bytes skipped over (lost) when `offset` is past
    /// the end.
    pub fn push(&mut self, offset: u64, data: &[u8]) -> u64 {
        let chunk_end = offset + data.len() as u64;
        if chunk_end <= self.end {
            return 0; // already held
        }
        let gap = offset.saturating_sub(self.end);
        let fresh = &data[usize::try_from(self.end.saturating_sub(offset)).unwrap_or(usize::MAX).min(data.len())..];
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(offset: u64, data: &[u8]) -> Chunk {
        Chunk { offset, data: data.to_vec() }
    }

    #[test]
    fn taken_bytes_leave_the_end_where_it_was() {
        let mut c = RunCapture::new(Uuid::nil(), 10);
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
        let mut c = RunCapture::new(Uuid::nil(), 0);
        c.push(0, b"ab");
        c.push(2, b"cd");
        assert_eq!(c.take(), vec![chunk(0, b"abcd")]);
    }

    #[test]
    fn bytes_already_held_are_not_taken_twice() {
        let mut c = RunCapture::new(Uuid::nil(), 5);
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
        let mut c = RunCapture::new(Uuid::nil(), 5);
        c.push(5, b"ab");
        assert_eq!(c.push(10, b"xyz"), 3, "bytes 7..10 are missing");
        assert_eq!(c.take(), vec![chunk(5, b"ab"), chunk(10, b"xyz")], "the store sees the jump");
        assert_eq!(c.end(), 13);
        assert_eq!(c.lost(), 3);
    }

    #[test]
    fn a_snapshot_answer_restarts_the_stream_with_a_recorded_gap() {
        let mut c = RunCapture::new(Uuid::nil(), 4);
        assert_eq!(c.restart_at(4), 0, "restarting at the end loses nothing");
        assert!(!c.has_pending());
        assert_eq!(c.restart_at(9), 5);
        assert_eq!(c.take(), vec![chunk(9, b"")], "an empty chunk carries the gap to the store");
        assert_eq!(c.restart_at(2), 0, "never backwards");
        assert_eq!(c.end(), 9);
    }
}
