//! Reassembly of fragmented WebSocket messages: awc's codec hands
//! continuation frames over piecewise, and a control message or a chunk of
//! output may arrive split across several of them.

// awc hands out continuation `Item`s without re-exporting the type; actix-ws
// re-exports the very same actix-http type.
use actix_ws::Item;
use bytes::{Bytes, BytesMut};

use crate::client::ClientError;

/// A message reassembled from continuation frames.
#[derive(Debug, PartialEq, Eq)]
pub enum Complete {
    Text(Bytes),
    Binary(Bytes),
}

/// Reassembles one fragmented message at a time (WebSocket does not
/// interleave fragments of different messages).
pub struct Fragments {
    /// The message being reassembled: whether it is text, and its bytes.
    partial: Option<(bool, BytesMut)>,
    max_len: usize,
}

impl Fragments {
    /// Reassembled messages are limited to `max_len` bytes, like frames.
    pub fn new(max_len: usize) -> Self {
        Self { partial: None, max_len }
    }

    pub fn push(&mut self, item: Item) -> Result<Option<Complete>, ClientError> {
        let (is_text, last, data) = match item {
            Item::FirstText(data) => (Some(true), false, data),
            Item::FirstBinary(data) => (Some(false), false, data),
            Item::Continue(data) => (None, false, data),
            Item::Last(data) => (None, true, data),
        };
        if let Some(is_text) = is_text {
            self.partial = Some((is_text, BytesMut::new()));
        }
        let Some((is_text, buf)) = self.partial.as_mut() else {
            return Err(ClientError::Protocol("continuation frame without a first fragment".into()));
        };
        if buf.len() + data.len() > self.max_len {
            return Err(ClientError::Protocol(format!("fragmented message over {} bytes", self.max_len)));
        }
        buf.extend_from_slice(&data);
        if !last {
            return Ok(None);
        }
        let message = buf.split().freeze();
        let complete = if *is_text { Complete::Text(message) } else { Complete::Binary(message) };
        self.partial = None;
        Ok(Some(complete))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reassembles_fragments_within_the_limit() {
        let mut fragments = Fragments::new(64);
        assert_eq!(fragments.push(Item::FirstText(Bytes::from_static(b"{\"type\":"))).unwrap(), None);
        assert_eq!(fragments.push(Item::Continue(Bytes::from_static(b"\"live\","))).unwrap(), None);
        assert_eq!(
            fragments.push(Item::Last(Bytes::from_static(b"\"offset\":1}"))).unwrap(),
            Some(Complete::Text(Bytes::from_static(b"{\"type\":\"live\",\"offset\":1}")))
        );
        assert_eq!(fragments.push(Item::FirstBinary(Bytes::from_static(b"ab"))).unwrap(), None);
        assert_eq!(
            fragments.push(Item::Last(Bytes::from_static(b"c"))).unwrap(),
            Some(Complete::Binary(Bytes::from_static(b"abc")))
        );
        assert!(fragments.push(Item::Last(Bytes::from_static(b"x"))).is_err());
        fragments.push(Item::FirstBinary(Bytes::new())).unwrap();
        let too_big = Bytes::from(vec![0u8; 65]);
        assert!(fragments.push(Item::Continue(too_big)).is_err());
    }
}
