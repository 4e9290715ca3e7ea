//! `ResumeRing`: the recent raw output of one terminal's stream, kept by its
//! arbiter so that a viewer resuming with `?from=N` (docs/PROTOCOL.md,
//! "Viewer protocol") is served without a round trip to the daemon.
//!
//! The ring holds one contiguous stretch of the stream, `[start, end)`.
//! Bytes handed to it may overlap what it already holds (a resumed
//! Scrollback repeats bytes the live stream carried, a re-sent Output
//! repeats a chunk): only the part past `end` is added, so a resume never
//! sees a byte twice. Bytes that would leave a hole are refused, and the
//! caller starts the ring over.
//!
//! A chunk arrives as a slice of the frame it came in, and that frame of
//! the buffer its connection read it into, shared with the host's other
//! terminals' frames. A slice keeps its whole buffer alive, so a quiet
//! terminal's few bytes could keep a busy neighbour's output in memory
//! for as long as the ring holds them (hundreds of MiB for a watched
//! terminal that prints a line now and then). Chunks shorter than
//! [`SHARE_FROM`] are therefore copied; longer ones (a flood's 64 KiB
//! chunks) are kept as slices, which hold at most a few times their own
//! length.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

/// What [`ResumeRing::append`] did with a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Some or all of the chunk was new and is now held.
    Added,
    /// The ring already had every byte of the chunk.
    Duplicate,
    /// The chunk starts past the ring's end: a hole; nothing was added.
    Gap { expected: u64 },
    /// The ring does not know where the stream is yet (no start point).
    Unanchored,
}

/// Chunks at least this long are held as slices of the frame they came in;
/// shorter ones are copied (see the module's note).
const SHARE_FROM: usize = 32 * 1024;

#[derive(Debug)]
pub struct ResumeRing {
    capacity: usize,
    chunks: VecDeque<(u64, Bytes)>,
    held: usize,
    /// Offset just past the last byte of the stream seen, once anchored.
    end: Option<u64>,
}

impl ResumeRing {
    pub fn new(capacity: usize) -> Self {
        Self { capacity, chunks: VecDeque::new(), held: 0, end: None }
    }

    /// The next offset of the stream, once known.
    pub fn end(&self) -> Option<u64> {
        self.end
    }

    /// Forgets everything, including where the stream is.
    pub fn reset(&mut self) {
        self.chunks.clear();
        self.held = 0;
        self.end = None;
    }

    /// The stream continues at `offset` (a snapshot was taken there). Kept
    /// bytes stay only if they end exactly there; an older anchor is
    /// ignored (the ring is already further on).
    pub fn anchor(&mut self, offset: u64) {
        match self.end {
            Some(end) if end >= offset => {}
            _ => {
                self.reset();
                self.end = Some(offset);
            }
        }
    }

    /// Adds the stream's bytes `[offset, offset + data.len())`.
    pub fn append(&mut self, offset: u64, data: &Bytes) -> Appended {
        let Some(end) = self.end else { return Appended::Unanchored };
        let chunk_end = offset + data.len() as u64;
        if offset > end {
            return Appended::Gap { expected: end };
        }
        if chunk_end <= end {
            return Appended::Duplicate;
        }
        let fresh = data.slice((end - offset) as usize..);
        let fresh = if fresh.len() < SHARE_FROM { Bytes::copy_from_slice(&fresh) } else { fresh };
        self.held += fresh.len();
        self.chunks.push_back((end, fresh));
        self.end = Some(chunk_end);
        while self.held > self.capacity {
            match self.chunks.pop_front() {
                Some((_, old)) => self.held -= old.len(),
                None => break,
            }
        }
        Appended::Added
    }

    /// Takes bytes that may start before the ring's end (a resumed
    /// Scrollback `[offset, ..)`): if they leave no hole they extend the
    /// ring; otherwise the ring starts over with them.
    pub fn absorb(&mut self, offset: u64, data: &Bytes) {
        if self.end.is_none_or(|end| offset > end) {
            self.reset();
            self.end = Some(offset);
        }
        self.append(offset, data);
    }

    /// The stream from `from` to the end, if the ring still holds all of it.
    pub fn since(&self, from: u64) -> Option<Bytes> {
        let end = self.end?;
        if from > end {
            return None;
        }
        if from == end {
            return Some(Bytes::new());
        }
        let start = self.chunks.front()?.0;
        if from < start {
            return None;
        }
        let mut out = BytesMut::with_capacity((end - from) as usize);
        for (offset, data) in &self.chunks {
            let chunk_end = offset + data.len() as u64;
            if chunk_end <= from {
                continue;
            }
            out.extend_from_slice(&data[from.saturating_sub(*offset) as usize..]);
        }
        Some(out.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    /// A few bytes of a large buffer are held as a copy, so the buffer is
    /// freed once its other users are done with it; a flood's chunk is held
    /// as it came.
    #[test]
    fn short_chunks_do_not_keep_their_buffer_alive() {
        let mut ring = ResumeRing::new(1 << 20);
        ring.anchor(0);
        let buffer = Bytes::from(vec![b'x'; 256 * 1024]);
        assert_eq!(ring.append(0, &buffer.slice(..100)), Appended::Added);
        assert!(buffer.is_unique(), "the ring holds a slice of the whole buffer");
        assert_eq!(ring.append(100, &buffer.slice(..SHARE_FROM)), Appended::Added);
        assert!(!buffer.is_unique(), "a long chunk is held as a slice, not copied");
        assert_eq!(ring.since(0).map(|b| b.len()), Some(100 + SHARE_FROM));
    }

    #[test]
    fn an_unanchored_ring_holds_nothing() {
        let mut ring = ResumeRing::new(100);
        assert_eq!(ring.append(0, &b("abc")), Appended::Unanchored);
        assert_eq!(ring.since(0), None);
    }

    #[test]
    fn overlapping_bytes_are_held_once() {
        let mut ring = ResumeRing::new(100);
        ring.anchor(4);
        assert_eq!(ring.append(4, &b("BBBB")), Appended::Added);
        // A resumed Scrollback repeats everything from 0: only new bytes count.
        ring.absorb(0, &b("AAAABBBBCC"));
        assert_eq!(ring.since(4).as_deref(), Some(&b"BBBBCC"[..]));
        assert_eq!(ring.append(6, &b("BBCC")), Appended::Duplicate);
        assert_eq!(ring.append(8, &b("CCD")), Appended::Added);
        assert_eq!(ring.since(4).as_deref(), Some(&b"BBBBCCD"[..]));
        assert_eq!(ring.end(), Some(11));
    }

    #[test]
    fn a_hole_is_refused_and_the_ring_is_unchanged() {
        let mut ring = ResumeRing::new(100);
        ring.anchor(0);
        ring.append(0, &b("ab"));
        assert_eq!(ring.append(5, &b("x")), Appended::Gap { expected: 2 });
        assert_eq!(ring.since(0).as_deref(), Some(&b"ab"[..]));
    }

    #[test]
    fn absorbing_past_a_hole_starts_over() {
        let mut ring = ResumeRing::new(100);
        ring.anchor(0);
        ring.append(0, &b("ab"));
        ring.absorb(10, &b("xyz"));
        assert_eq!(ring.since(0), None);
        assert_eq!(ring.since(10).as_deref(), Some(&b"xyz"[..]));
    }

    #[test]
    fn an_anchor_elsewhere_forgets_and_an_older_one_is_ignored() {
        let mut ring = ResumeRing::new(100);
        ring.anchor(0);
        ring.append(0, &b("abcd"));
        ring.anchor(2);
        assert_eq!(ring.since(0).as_deref(), Some(&b"abcd"[..]));
        ring.anchor(4);
        assert_eq!(ring.since(0).as_deref(), Some(&b"abcd"[..]));
        ring.anchor(9);
        assert_eq!(ring.since(4), None);
        assert_eq!(ring.since(9).as_deref(), Some(&b""[..]));
    }

    #[test]
    fn old_bytes_leave_when_over_capacity() {
        let mut ring = ResumeRing::new(4);
        ring.anchor(0);
        ring.append(0, &b("ab"));
        ring.append(2, &b("cd"));
        ring.append(4, &b("ef"));
        assert_eq!(ring.since(0), None);
        assert_eq!(ring.since(2).as_deref(), Some(&b"cdef"[..]));
        assert_eq!(ring.since(3).as_deref(), Some(&b"def"[..]));
        assert_eq!(ring.since(7), None);
    }

    /// Any sequence of chunks, overlapping or not, in any order that leaves
    /// no hole: every resume point the ring answers gives exactly the
    /// stream's bytes from there.
    #[test]
    fn every_answer_is_the_stream_itself() {
        let stream: Vec<u8> = (0..4000u32).map(|i| (i % 251) as u8).collect();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..200 {
            let mut ring = ResumeRing::new(64 + next(1500) as usize);
            let mut end = next(50);
            ring.anchor(end);
            while end < stream.len() as u64 {
                // Start anywhere at or before the end (an overlap), never past it.
                let start = end - next(end.min(300) + 1);
                let len = 1 + next(200);
                let stop = (start + len).min(stream.len() as u64);
                let chunk = Bytes::copy_from_slice(&stream[start as usize..stop as usize]);
                if next(4) == 0 {
                    ring.absorb(start, &chunk);
                } else {
                    assert_ne!(ring.append(start, &chunk), Appended::Unanchored);
                }
                end = end.max(stop);
                assert_eq!(ring.end(), Some(end), "round {round}");
                for _ in 0..5 {
                    let from = next(end + 1);
                    if let Some(bytes) = ring.since(from) {
                        assert_eq!(&bytes[..], &stream[from as usize..end as usize], "round {round} from {from}");
                    }
                }
            }
        }
    }
}
