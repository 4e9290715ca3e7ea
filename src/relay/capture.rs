//! A run's output capture (docs/REST.md, "Runs"): the bytes of a
//! run's terminal on their way to the run's log, as plain state so its
//! rules are tested on their own. The arbiter feeds it live output like a
//! viewer's queue and flushes it to the store; after a reconnect it
//! resumes from [`RunCapture::end`], the first byte the log does not have.

use uuid::Uuid;

#[derive(Debug)]
pub struct RunCapture {
    pub run_id: Uuid,
    /// Bytes received and not yet written to the log.
    pending: Vec<u8>,
    /// Bytes already written to the log.
    logged: u64,
}

impl RunCapture {
    /// A capture of `run_id` whose log already holds `logged` bytes.
    pub fn new(run_id: Uuid, logged: u64) -> Self {
        Self { run_id, pending: Vec::new(), logged }
    }

    /// Live output the log does not have yet.
    pub fn push(&mut self, data: &[u8]) {
        self.pending.extend_from_slice(data);
    }

    /// A resumed Scrollback: raw bytes from `offset`. Kept only when they
    /// start where the capture asked to resume (`asked`); otherwise the
    /// daemon no longer had the bytes since the log's end, and false says
    /// the log has a hole.
    pub fn resumed(&mut self, offset: u64, data: &[u8], asked: Option<u64>) -> bool {
        if asked == Some(offset) {
            self.push(data);
            true
        } else {
            false
        }
    }

    /// The stream offset after the last byte received: where a capture
    /// that lost its stream resumes.
    pub fn end(&self) -> u64 {
        self.logged + self.pending.len() as u64
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// The pending bytes, to be written to the log now; they count as
    /// logged from here on.
    pub fn take(&mut self) -> Vec<u8> {
        let data = std::mem::take(&mut self.pending);
        self.logged += data.len() as u64;
        data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taken_bytes_count_as_logged_and_the_end_stays() {
        let mut c = RunCapture::new(Uuid::nil(), 10);
        assert_eq!(c.end(), 10);
        c.push(b"abc");
        assert!(c.has_pending());
        assert_eq!(c.end(), 13);
        assert_eq!(c.take(), b"abc");
        assert!(!c.has_pending());
        assert_eq!(c.end(), 13, "taking moves bytes to the log, the stream position stays");
        assert!(c.take().is_empty());
    }

    #[test]
    fn a_resume_is_kept_only_from_where_it_was_asked() {
        let mut c = RunCapture::new(Uuid::nil(), 5);
        assert!(!c.resumed(7, b"xy", Some(5)), "bytes 5..7 are missing");
        assert_eq!(c.end(), 5);
        assert!(c.resumed(5, b"hello", Some(5)));
        assert_eq!(c.take(), b"hello");
        assert_eq!(c.end(), 10);
    }
}
