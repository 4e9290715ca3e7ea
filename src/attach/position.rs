//! Where this viewer is in the terminal's output stream, so a reattach can
//! ask for exactly the bytes it has not shown yet (`?from=N`; docs/PROTOCOL.md,
//! "Offsets, replay and resume").
//!
//! The stream offset counts PTY output bytes since the terminal started. Only
//! live bytes advance it: a replay's snapshot is a repaint of the screen *at*
//! an offset, not part of the stream, and neither is the final snapshot an
//! exited terminal sends before `exit`.

#[derive(Debug, Clone)]
pub(super) struct StreamPosition {
    /// Whether the bytes arriving now are stream bytes: true after `live` or
    /// `resume` on this connection; false before (status, a final snapshot)
    /// and between `replay` and `live` (snapshot bytes).
    live: bool,
    /// Offset of the next live byte; `None` until a connection went live,
    /// and again while a replay repaints the screen.
    offset: Option<u64>,
}

impl StreamPosition {
    pub(super) fn new() -> Self {
        Self { live: false, offset: None }
    }

    /// A new connection starts in its preamble; the offset is kept, since it
    /// describes what is already on the user's screen.
    pub(super) fn on_connect(&mut self) {
        self.live = false;
    }

    /// A repaint begins: until `live`, the screen matches no stream offset,
    /// so a reattach in the middle of it must ask for a fresh replay.
    pub(super) fn on_replay(&mut self) {
        self.live = false;
        self.offset = None;
    }

    pub(super) fn on_live(&mut self, offset: u64) {
        self.live = true;
        self.offset = Some(offset);
    }

    /// Returns the offset we expected, when the server resumed elsewhere
    /// (the caller logs it: the screen may show a gap or a repeat).
    pub(super) fn on_resume(&mut self, offset: u64) -> Option<u64> {
        let expected = self.offset.filter(|&ours| ours != offset);
        self.live = true;
        self.offset = Some(offset);
        expected
    }

    /// Output bytes were shown.
    pub(super) fn on_output(&mut self, len: usize) {
        if self.live {
            if let Some(offset) = self.offset.as_mut() {
                *offset = offset.saturating_add(len as u64);
            }
        }
    }

    /// Whether this connection's bytes are stream bytes yet.
    pub(super) fn is_live(&self) -> bool {
        self.live
    }

    /// The `from` for the next connection: `None` asks for a fresh replay.
    pub(super) fn resume_from(&self) -> Option<u64> {
        self.offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_bytes_do_not_count_live_bytes_do() {
        let mut pos = StreamPosition::new();
        pos.on_connect();
        pos.on_output(10); // preamble bytes (a final snapshot)
        assert_eq!(pos.resume_from(), None);
        pos.on_replay();
        pos.on_output(500);
        assert_eq!(pos.resume_from(), None);
        assert!(!pos.is_live());
        pos.on_live(1000);
        assert!(pos.is_live());
        pos.on_output(3);
        pos.on_output(4);
        assert_eq!(pos.resume_from(), Some(1007));
    }

    #[test]
    fn offset_survives_a_reconnect_and_resume_continues_it() {
        let mut pos = StreamPosition::new();
        pos.on_replay();
        pos.on_live(20);
        pos.on_output(5);
        pos.on_connect();
        assert!(!pos.is_live());
        assert_eq!(pos.resume_from(), Some(25));
        pos.on_output(7); // preamble bytes again: not stream bytes
        assert_eq!(pos.on_resume(25), None);
        pos.on_output(2);
        assert_eq!(pos.resume_from(), Some(27));
    }

    #[test]
    fn a_resume_elsewhere_is_reported_and_adopted() {
        let mut pos = StreamPosition::new();
        pos.on_live(100);
        pos.on_connect();
        assert_eq!(pos.on_resume(90), Some(100));
        assert_eq!(pos.resume_from(), Some(90));
    }

    #[test]
    fn a_replay_cut_short_forgets_the_old_offset() {
        let mut pos = StreamPosition::new();
        pos.on_live(100);
        pos.on_connect();
        pos.on_replay();
        pos.on_output(50);
        pos.on_connect();
        assert_eq!(pos.resume_from(), None);
    }
}
