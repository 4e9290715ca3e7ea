//! The viewer protocol's JSON control messages (docs/PROTOCOL.md, "Viewer
//! protocol"), both directions, as two serde enums: the server builds what
//! it sends from [`ServerMessage`] and parses what it hears into
//! [`ClientMessage`]; clients and tests use the same types the other way
//! round. Binary frames (terminal bytes one way, input bytes the other) are
//! not modelled here.

use serde::{Deserialize, Serialize};

/// The subprotocol of every viewer socket.
pub const SUBPROTOCOL: &str = "tether.v1";

/// The `error` message of a terminal whose daemon is not connected
/// (docs/PROTOCOL.md): the socket stays open and the stream starts when the
/// daemon is back, so a client waits rather than ends.
pub const HOST_OFFLINE: &str = "host offline";

/// The close reason (with 1008) of a viewer that did not read its output
/// fast enough (docs/PROTOCOL.md, "Slow viewers"): the one 1008 a client
/// may reattach after.
pub const TOO_SLOW_A_READER: &str = "too slow a reader";

/// Grids are clamped to `GRID_MIN..=GRID_MAX` in both dimensions.
pub const GRID_MIN: u16 = 1;
pub const GRID_MAX: u16 = 1000;

/// Clamps a grid to the protocol's range.
pub fn clamp_grid(cols: u16, rows: u16) -> (u16, u16) {
    (cols.clamp(GRID_MIN, GRID_MAX), rows.clamp(GRID_MIN, GRID_MAX))
}

/// Server -> client (a text frame).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ServerMessage {
    /// What this connection may do, sent first on every connection:
    /// `readOnly` when the token may watch but not type, resize or claim
    /// the grid (docs/PROTOCOL.md, "Read-only viewers").
    Access {
        #[serde(rename = "readOnly")]
        read_only: bool,
    },
    /// The terminal's state and whether its host is online.
    Status { state: String, host: String },
    /// A screen snapshot taken at stream offset `offset` follows as binary
    /// frames, then `Live`.
    Replay { cols: u16, rows: u16, offset: u64 },
    /// Live bytes from `offset` follow, with no gap and no duplicate.
    Live { offset: u64 },
    /// Answer to `?from=N`: raw bytes from `offset` follow, no repaint.
    Resume { offset: u64 },
    /// The PTY's grid; `yours` only for the grid holder.
    Size { cols: u16, rows: u16, yours: bool },
    /// The process ended; the socket is closed 1000 next.
    Exit {
        #[serde(rename = "exitCode")]
        exit_code: Option<i32>,
    },
    /// Something the client should show (e.g. "host offline").
    Error { message: String },
    /// The answer to a client's `ping` (docs/PROTOCOL.md, "Liveness").
    Pong,
    /// A type this build does not know: newer servers may add some, and an
    /// older client keeps working. Never sent.
    #[serde(other, skip_serializing)]
    Unknown,
}

impl ServerMessage {
    /// The message as the text frame's JSON.
    pub fn to_json(&self) -> String {
        // Plain strings and numbers: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn parse(text: impl AsRef<[u8]>) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(text.as_ref())
    }

    pub fn error(message: impl Into<String>) -> Self {
        Self::Error { message: message.into() }
    }
}

/// A grid dimension as a client sends it: any JSON number is clamped to
/// the protocol's range (a value that is not a number is an error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct GridDim(pub u16);

impl<'de> Deserialize<'de> for GridDim {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = serde_json::Number::deserialize(deserializer)?;
        let value = number.as_f64().unwrap_or(1.0).clamp(f64::from(GRID_MIN), f64::from(GRID_MAX));
        // In GRID_MIN..=GRID_MAX after the clamp, so the cast keeps the value.
        Ok(GridDim(value as u16))
    }
}

/// Client -> server (a text frame).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ClientMessage {
    /// Keystrokes (binary frames carry input bytes too).
    Input { data: String },
    /// Claims the grid for this viewer.
    Resize { cols: GridDim, rows: GridDim },
    /// This viewer's natural grid and signs of use, for the grid arbiter.
    #[serde(rename_all = "camelCase")]
    View {
        cols: GridDim,
        rows: GridDim,
        #[serde(default = "yes")]
        visible: bool,
        #[serde(default)]
        idle_ms: u64,
        #[serde(default = "yes")]
        open: bool,
    },
    /// Asks for a `pong`: how a client that cannot see WebSocket pings (a
    /// browser) learns that the server still answers (docs/PROTOCOL.md,
    /// "Liveness"). Any viewer may send it, read-only ones included.
    Ping,
}

fn yes() -> bool {
    true
}

impl ClientMessage {
    pub fn resize(cols: u16, rows: u16) -> Self {
        let (cols, rows) = clamp_grid(cols, rows);
        Self::Resize { cols: GridDim(cols), rows: GridDim(rows) }
    }

    pub fn view(cols: u16, rows: u16, visible: bool, idle_ms: u64, open: bool) -> Self {
        let (cols, rows) = clamp_grid(cols, rows);
        Self::View { cols: GridDim(cols), rows: GridDim(rows), visible, idle_ms, open }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_server_control_message() {
        let cases: &[(&str, ServerMessage)] = &[
            (
                r#"{"type":"status","state":"running","host":"online"}"#,
                ServerMessage::Status { state: "running".into(), host: "online".into() },
            ),
            (
                r#"{"type":"replay","cols":80,"rows":24,"offset":12345}"#,
                ServerMessage::Replay { cols: 80, rows: 24, offset: 12345 },
            ),
            (r#"{"type":"live","offset":7}"#, ServerMessage::Live { offset: 7 }),
            (r#"{"type":"resume","offset":9}"#, ServerMessage::Resume { offset: 9 }),
            (
                r#"{"type":"size","cols":100,"rows":30,"yours":false}"#,
                ServerMessage::Size { cols: 100, rows: 30, yours: false },
            ),
            (r#"{"type":"exit","exitCode":3}"#, ServerMessage::Exit { exit_code: Some(3) }),
            (r#"{"type":"exit","exitCode":null}"#, ServerMessage::Exit { exit_code: None }),
            (r#"{"type":"exit"}"#, ServerMessage::Exit { exit_code: None }),
            (r#"{"type":"error","message":"host offline"}"#, ServerMessage::Error { message: "host offline".into() }),
            (r#"{"type":"pong"}"#, ServerMessage::Pong),
            (r#"{"type":"somethingNew","x":1}"#, ServerMessage::Unknown),
        ];
        for (json, expected) in cases {
            assert_eq!(&ServerMessage::parse(json.as_bytes()).unwrap(), expected, "{json}");
        }
    }

    #[test]
    fn rejects_malformed_control_messages() {
        for bad in [
            &b"not json"[..],
            br#"{"state":"running"}"#,
            br#"{"type":"live"}"#,
            br#"{"type":"live","offset":-1}"#,
            br#"{"type":"replay","cols":80,"rows":24,"offset":"x"}"#,
        ] {
            assert!(ServerMessage::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn client_messages_match_the_spec_shapes() {
        let view: serde_json::Value =
            serde_json::from_str(&ClientMessage::view(120, 40, true, 1500, true).to_json()).unwrap();
        assert_eq!(
            view,
            serde_json::json!({"type":"view","cols":120,"rows":40,"visible":true,"idleMs":1500,"open":true})
        );
        let resize: serde_json::Value = serde_json::from_str(&ClientMessage::resize(0, 5000).to_json()).unwrap();
        assert_eq!(resize, serde_json::json!({"type":"resize","cols":1,"rows":1000}));
        assert_eq!(ClientMessage::Ping.to_json(), r#"{"type":"ping"}"#);
        assert_eq!(serde_json::from_str::<ClientMessage>(r#"{"type":"ping"}"#).unwrap(), ClientMessage::Ping);
        assert_eq!(ServerMessage::Pong.to_json(), r#"{"type":"pong"}"#);
    }

    #[test]
    fn server_messages_have_the_documented_shape() {
        let exit = ServerMessage::Exit { exit_code: Some(3) }.to_json();
        assert_eq!(exit, r#"{"type":"exit","exitCode":3}"#);
        let size = ServerMessage::Size { cols: 80, rows: 24, yours: true }.to_json();
        assert_eq!(size, r#"{"type":"size","cols":80,"rows":24,"yours":true}"#);
        assert_eq!(
            ServerMessage::parse(&size).expect("parses"),
            ServerMessage::Size { cols: 80, rows: 24, yours: true }
        );
        assert_eq!(ServerMessage::parse(r#"{"type":"later","x":1}"#).expect("parses"), ServerMessage::Unknown);
    }

    #[test]
    fn client_grids_are_clamped_and_non_numbers_refused() {
        let m: ClientMessage = serde_json::from_str(r#"{"type":"resize","cols":-1,"rows":3000.5}"#).expect("parses");
        assert_eq!(m, ClientMessage::resize(1, 1000));
        assert!(serde_json::from_str::<ClientMessage>(r#"{"type":"resize","cols":"80","rows":3}"#).is_err());
        let v: ClientMessage = serde_json::from_str(r#"{"type":"view","cols":80,"rows":24}"#).expect("parses");
        assert_eq!(v, ClientMessage::view(80, 24, true, 0, true));
        assert_eq!(v.to_json(), r#"{"type":"view","cols":80,"rows":24,"visible":true,"idleMs":0,"open":true}"#);
    }
}
