//! The viewer protocol as the client speaks it (docs/PROTOCOL.md, "Viewer
//! protocol"; docs/CLI.md, "What the client speaks"): the JSON control
//! messages are the server's own types (`crate::viewer_protocol`); here is
//! what each close code means to a user, and how the viewer URL is derived
//! from the server's HTTP base URL.
//!
//! Kept free of I/O so every rule here is unit-tested on its own.

use crate::client::ClientError;
pub use crate::viewer_protocol::{ClientMessage, ServerMessage, SUBPROTOCOL, TOO_SLOW_A_READER};

/// Normal closure: what we send on detach and after `exit`.
pub const CLOSE_NORMAL: u16 = 1000;

/// Used when the server's Close frame carried no code (RFC 6455 §7.1.5).
pub const CLOSE_NO_STATUS: u16 = 1005;

/// Used when the socket ended without any Close frame (RFC 6455 §7.1.5).
pub const CLOSE_ABNORMAL: u16 = 1006;

/// Host disconnected or moved: the viewer is expected to reattach.
pub const CLOSE_HOST_MOVED: u16 = 4503;

/// What a close code means, in words a user can act on.
pub fn close_reason(code: u16) -> &'static str {
    match code {
        1000 => "closed by server",
        1001 => "server going away",
        CLOSE_NO_STATUS => "connection closed",
        CLOSE_ABNORMAL => "connection lost",
        1008 => "connection too slow or input overflow",
        1011 => "server error",
        1012 => "server restarting",
        4401 => "bad token",
        4403 => "forbidden",
        4404 => "terminal not found",
        4413 => "frame too large",
        4429 => "too many connections",
        CLOSE_HOST_MOVED => "host disconnected or moved",
        _ => "connection closed",
    }
}

/// Whether a close is worth reattaching after. 4503 is the protocol's
/// explicit "come back"; 1001/1012 (server going away or restarting) and
/// 1006 (socket dropped without a close) are what a drained or crashed
/// instance looks like from here, and another instance can serve us. A
/// 1008 for a reader too slow is ours to mend: we read again, and reattach
/// from where we are (what the server no longer holds comes as a repaint).
/// Every other 1008 (input overflow, a bad message) would come again.
pub fn should_reattach(code: u16, description: Option<&str>) -> bool {
    matches!(code, CLOSE_HOST_MOVED | 1001 | 1012 | CLOSE_ABNORMAL)
        || (code == 1008 && description.map(str::trim) == Some(TOO_SLOW_A_READER))
}

/// The reason shown for a close: our words for the code, plus the server's
/// own description when it says something more.
pub fn describe_close(code: u16, description: Option<&str>) -> String {
    let ours = close_reason(code);
    match description.map(str::trim) {
        Some(theirs) if !theirs.is_empty() && !theirs.eq_ignore_ascii_case(ours) => {
            format!("{ours}: {theirs}")
        }
        _ => ours.to_owned(),
    }
}

/// `ws(s)://HOST[/prefix]/ws/v1/terminals/{id}[?from=N]` from the HTTP base URL.
pub fn viewer_url(server: &str, terminal_id: &str, resume_from: Option<u64>) -> Result<String, ClientError> {
    let server = server.trim().trim_end_matches('/');
    let (scheme, rest) = server.split_once("://").ok_or_else(|| ClientError::InvalidServerUrl(server.to_owned()))?;
    let ws_scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => "ws",
        "https" | "wss" => "wss",
        _ => return Err(ClientError::InvalidServerUrl(server.to_owned())),
    };
    if rest.is_empty() || rest.contains(['?', '#']) {
        return Err(ClientError::InvalidServerUrl(server.to_owned()));
    }
    // Ids are UUIDs; refusing anything that would need escaping keeps a
    // stray `/` or `?` from silently addressing another route.
    let id_ok = !terminal_id.is_empty()
        && terminal_id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'));
    if !id_ok {
        return Err(ClientError::InvalidId(terminal_id.to_owned()));
    }
    let mut url = format!("{ws_scheme}://{rest}/ws/v1/terminals/{terminal_id}");
    if let Some(offset) = resume_from {
        url.push_str(&format!("?from={offset}"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derives_the_viewer_url() {
        let id = "0b9f6a7e-2f55-4c1e-9d7b-1c2d3e4f5a6b";
        assert_eq!(
            viewer_url("http://127.0.0.1:8080", id, None).unwrap(),
            format!("ws://127.0.0.1:8080/ws/v1/terminals/{id}")
        );
        assert_eq!(
            viewer_url("https://relay.example.com/tether/", id, Some(42)).unwrap(),
            format!("wss://relay.example.com/tether/ws/v1/terminals/{id}?from=42")
        );
        assert_eq!(viewer_url("WS://h:1", "t1", Some(0)).unwrap(), "ws://h:1/ws/v1/terminals/t1?from=0");
        assert!(matches!(viewer_url("127.0.0.1:8080", id, None), Err(ClientError::InvalidServerUrl(_))));
        assert!(matches!(viewer_url("ftp://h", id, None), Err(ClientError::InvalidServerUrl(_))));
        assert!(matches!(viewer_url("http://h?x=1", id, None), Err(ClientError::InvalidServerUrl(_))));
        for bad_id in ["", "a/b", "a?from=1", "a b"] {
            assert!(matches!(viewer_url("http://h", bad_id, None), Err(ClientError::InvalidId(_))));
        }
    }

    #[test]
    fn close_codes_have_clear_reasons() {
        assert_eq!(close_reason(4401), "bad token");
        assert_eq!(close_reason(4403), "forbidden");
        assert_eq!(close_reason(4404), "terminal not found");
        assert_eq!(close_reason(4503), "host disconnected or moved");
        assert_eq!(close_reason(4413), "frame too large");
        assert_eq!(close_reason(4429), "too many connections");
        assert_eq!(close_reason(1008), "connection too slow or input overflow");
        assert_eq!(close_reason(1011), "server error");
        assert_eq!(describe_close(4404, Some("Terminal not found")), "terminal not found");
        assert_eq!(describe_close(4404, Some("  ")), "terminal not found");
        assert_eq!(describe_close(1011, Some("database unavailable")), "server error: database unavailable");
    }

    #[test]
    fn only_moves_drops_and_a_slow_read_are_reattached() {
        for code in [4503, 1001, 1006, 1012] {
            assert!(should_reattach(code, None), "{code}");
        }
        assert!(should_reattach(1008, Some("too slow a reader")));
        for code in [1000, 1005, 1008, 1011, 4401, 4403, 4404, 4413, 4429] {
            assert!(!should_reattach(code, None), "{code}");
        }
        assert!(!should_reattach(1008, Some("input overflow")));
        assert!(!should_reattach(1008, Some("bad message: expected value")));
    }
}
