//! Per-terminal ring buffer of recent output, addressed by stream offset.
//!
//! Every byte a terminal emits gets an offset (bytes emitted before it). The
//! ring keeps the most recent `capacity` bytes (512 KiB by default;
//! docs/ARCHITECTURE.md, "Where state lives") and is the buffer between the PTY and the socket: the terminal task pushes
//! what it reads and cuts Output frames from it with [`OutputRing::bytes_since`].
//! Because unsent bytes live here, a slow socket is visible as "pending
//! bytes", which is what the terminal task throttles the PTY reader on.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

/// Recent terminal output with absolute stream offsets, kept as the chunks
/// it was pushed in: a push stores the reader's `Bytes` without copying,
/// and a read that falls inside one chunk is a slice of it.
#[derive(Debug)]
pub struct OutputRing {
    chunks: VecDeque<Bytes>,
    /// Bytes held in `chunks`, at most `capacity`.
    len: usize,
    capacity: usize,
    /// Offset of the first byte of `chunks[0]`: everything before it has been evicted.
    start: u64,
}

impl OutputRing {
    pub fn with_capacity(capacity: usize) -> Self {
        Self { chunks: VecDeque::new(), len: 0, capacity, start: 0 }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The offset the next pushed byte will get (= total bytes pushed).
    pub fn end_offset(&self) -> u64 {
        self.start + self.len as u64
    }

    /// The offset of the oldest byte the ring still holds.
    pub fn start_offset(&self) -> u64 {
        self.start
    }

    /// Appends output, evicting the oldest bytes beyond the capacity.
    pub fn push(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        self.len += data.len();
        self.chunks.push_back(data);
        let mut excess = self.len.saturating_sub(self.capacity);
        while excess > 0 {
            let Some(front) = self.chunks.front_mut() else { break };
            let evicted = excess.min(front.len());
            if evicted == front.len() {
                self.chunks.pop_front();
            } else {
                *front = front.slice(evicted..);
            }
            excess -= evicted;
            self.len -= evicted;
            self.start += evicted as u64;
        }
    }

    /// Up to `max_len` bytes starting at stream offset `offset`.
    ///
    /// `None` when `offset` was already evicted or lies beyond what was
    /// pushed; an empty `Bytes` when `offset` is exactly the end.
    pub fn bytes_since(&self, offset: u64, max_len: usize) -> Option<Bytes> {
        if offset < self.start || offset > self.end_offset() {
            return None;
        }
        let mut skip = usize::try_from(offset - self.start).ok()?;
        let wanted = (self.len - skip).min(max_len);
        let mut pieces = self.chunks.iter();
        let first = loop {
            match pieces.next() {
                Some(chunk) if skip >= chunk.len() => skip -= chunk.len(),
                Some(chunk) => break chunk.slice(skip..),
                None => return Some(Bytes::new()),
            }
        };
        if first.len() >= wanted {
            return Some(first.slice(..wanted));
        }
        // Spans chunks: one copy into a frame-sized buffer.
        let mut out = BytesMut::with_capacity(wanted);
        out.extend_from_slice(&first);
        for chunk in pieces {
            let take = (wanted - out.len()).min(chunk.len());
            out.extend_from_slice(&chunk[..take]);
            if out.len() == wanted {
                break;
            }
        }
        Some(out.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_count_every_pushed_byte() {
        let mut ring = OutputRing::with_capacity(8);
        assert_eq!(ring.end_offset(), 0);
        ring.push(Bytes::from_static(b"abc"));
        ring.push(Bytes::from_static(b"defg"));
        assert_eq!(ring.end_offset(), 7);
        assert_eq!(ring.bytes_since(0, 100).as_deref(), Some(&b"abcdefg"[..]));
        assert_eq!(ring.bytes_since(3, 2).as_deref(), Some(&b"de"[..]));
        assert_eq!(ring.bytes_since(7, 10).as_deref(), Some(&b""[..]));
        assert_eq!(ring.bytes_since(8, 10), None);
    }

    #[test]
    fn eviction_keeps_the_newest_bytes_at_their_offsets() {
        let mut ring = OutputRing::with_capacity(8);
        ring.push(Bytes::from_static(b"0123456"));
        ring.push(Bytes::from_static(b"789ab"));
        // 12 bytes pushed, 8 kept: offsets 4..12.
        assert_eq!(ring.end_offset(), 12);
        assert_eq!(ring.bytes_since(3, 100), None);
        assert_eq!(ring.bytes_since(4, 100).as_deref(), Some(&b"456789ab"[..]));
        assert_eq!(ring.bytes_since(10, 100).as_deref(), Some(&b"ab"[..]));
    }

    #[test]
    fn a_push_larger_than_the_ring_keeps_its_tail() {
        let mut ring = OutputRing::with_capacity(4);
        ring.push(Bytes::from_static(b"xy"));
        ring.push(Bytes::from_static(b"abcdefgh"));
        assert_eq!(ring.end_offset(), 10);
        assert_eq!(ring.bytes_since(5, 100), None);
        assert_eq!(ring.bytes_since(6, 100).as_deref(), Some(&b"efgh"[..]));
    }

    #[test]
    fn reads_across_the_wrap_point_are_contiguous() {
        let mut ring = OutputRing::with_capacity(6);
        // Force the deque to wrap internally by evicting from the front repeatedly.
        let mut expected = Vec::new();
        for round in 0..20u8 {
            let chunk = [round, round.wrapping_add(100), round.wrapping_add(200)];
            ring.push(Bytes::copy_from_slice(&chunk));
            expected.extend_from_slice(&chunk);
            let end = ring.end_offset();
            let start = end - 6.min(end);
            let got = ring.bytes_since(start, 100).unwrap_or_default();
            assert_eq!(&got[..], &expected[start as usize..end as usize]);
            // Chunked reads stitch back to the same bytes.
            let mut stitched = Vec::new();
            let mut at = start;
            while at < end {
                let piece = ring.bytes_since(at, 4).unwrap_or_default();
                at += piece.len() as u64;
                stitched.extend_from_slice(&piece);
            }
            assert_eq!(stitched, got.to_vec());
        }
    }
}
