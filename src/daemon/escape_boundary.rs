//! Where terminal output can be cut without splitting an escape sequence or
//! a UTF-8 character.
//!
//! PTY reads end wherever the kernel buffer did. The terminal task holds back
//! an incomplete trailing sequence until the rest arrives, so its screen
//! model and stream offset always sit on a boundary: a viewer that starts
//! from a Scrollback never receives the second half of a sequence whose
//! first half it never saw (it would print "[31m" as text). Holding the
//! tail back changes nothing visible, since an incomplete sequence has no
//! effect on the screen yet.

/// How far back an incomplete sequence is looked for. A longer unterminated
/// string (a huge OSC 52 clipboard write) is passed through as is; this bounds
/// what is held back.
pub const WINDOW: usize = 4096;

const ESC: u8 = 0x1b;
const BEL: u8 = 0x07;
const CAN: u8 = 0x18;
const SUB: u8 = 0x1a;

/// Length of the longest prefix of `data` that does not end inside an
/// escape sequence or a UTF-8 character (looking at the last `WINDOW` bytes).
pub fn complete_prefix_len(data: &[u8]) -> usize {
    let start = data.len().saturating_sub(WINDOW);
    let window = &data[start..];
    // memrchr, not a byte loop: a whole window is searched for every chunk
    // of plain output (2 % of the daemon's samples under `cat` before).
    if let Some(esc) = memchr::memrchr(ESC, window) {
        if !escape_complete(&window[esc..]) {
            return start + esc;
        }
    }
    data.len() - incomplete_utf8_suffix(window)
}

/// Whether `seq` (starting with ESC and containing no other ESC) is a whole
/// sequence, following the VT500 parser states that vte implements.
fn escape_complete(seq: &[u8]) -> bool {
    let Some(&kind) = seq.get(1) else {
        return false;
    };
    let body = &seq[2..];
    match kind {
        // CSI: parameters and intermediates (0x20..=0x3f) up to a final byte.
        // Any other byte ends it too (vte executes or ignores it).
        b'[' => body.iter().any(|&byte| !(0x20..=0x3f).contains(&byte)),
        // OSC ends with BEL or ST (ESC \, which would be a later ESC); CAN
        // and SUB abort any string.
        b']' => body.iter().any(|&byte| matches!(byte, BEL | CAN | SUB)),
        // DCS, SOS, PM, APC: only ST, CAN or SUB end them.
        b'P' | b'X' | b'^' | b'_' => body.iter().any(|&byte| matches!(byte, CAN | SUB)),
        // ESC, intermediates, then a final byte.
        0x20..=0x2f => body.iter().any(|&byte| !(0x20..=0x2f).contains(&byte)),
        _ => true,
    }
}

/// Bytes at the end of `data` that start a UTF-8 character not yet complete.
fn incomplete_utf8_suffix(data: &[u8]) -> usize {
    for back in 1..=data.len().min(4) {
        let byte = data[data.len() - back];
        if byte & 0xc0 == 0x80 {
            continue; // a continuation byte: the leader is further back
        }
        let needed = match byte {
            0xf0..=0xff => 4,
            0xe0..=0xef => 3,
            0xc0..=0xdf => 2,
            _ => 1,
        };
        return if needed > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(data: &[u8]) -> (&[u8], &[u8]) {
        data.split_at(complete_prefix_len(data))
    }

    #[test]
    fn complete_output_is_not_held_back() {
        for data in [
            &b"plain text\r\n"[..],
            b"\x1b[31mred\x1b[0m",
            b"\x1b[?1049h",
            b"\x1b]0;title\x07",
            b"\x1b]0;title\x1b\\",
            b"\x1b(B",
            b"\x1b7",
            "caf\u{e9} \u{1f600}".as_bytes(),
            b"",
        ] {
            assert_eq!(cut(data).1, b"", "{data:?}");
        }
    }

    #[test]
    fn an_incomplete_trailing_sequence_is_held_back() {
        assert_eq!(cut(b"ab\x1b"), (&b"ab"[..], &b"\x1b"[..]));
        assert_eq!(cut(b"ab\x1b[3"), (&b"ab"[..], &b"\x1b[3"[..]));
        assert_eq!(cut(b"\x1b[0mab\x1b[38;5"), (&b"\x1b[0mab"[..], &b"\x1b[38;5"[..]));
        assert_eq!(cut(b"x\x1b]0;tit"), (&b"x"[..], &b"\x1b]0;tit"[..]));
        assert_eq!(cut(b"x\x1bP1$r"), (&b"x"[..], &b"\x1bP1$r"[..]));
        assert_eq!(cut(b"x\x1b("), (&b"x"[..], &b"\x1b("[..]));
    }

    #[test]
    fn an_incomplete_utf8_character_is_held_back() {
        let smile = "\u{1f600}".as_bytes();
        for split in 1..smile.len() {
            let mut data = b"ok ".to_vec();
            data.extend_from_slice(&smile[..split]);
            assert_eq!(cut(&data), (&b"ok "[..], &smile[..split]), "split at {split}");
        }
        assert_eq!(cut("\u{e9}".as_bytes()).1, b"");
        assert_eq!(cut(&"\u{e9}".as_bytes()[..1]).1, &"\u{e9}".as_bytes()[..1]);
    }

    #[test]
    fn a_string_longer_than_the_window_passes_through() {
        let mut data = b"\x1b]52;c;".to_vec();
        data.extend(std::iter::repeat_n(b'A', WINDOW));
        assert_eq!(complete_prefix_len(&data), data.len());
    }
}
