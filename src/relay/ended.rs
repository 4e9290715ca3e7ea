//! What a viewer of a terminal that already ended is told (docs/PROTOCOL.md,
//! "Viewer protocol"): its status, its last size, the recorded final screen,
//! then `exit` (or `error` for a terminal that never started). The viewer
//! socket uses it for a terminal that had ended before the viewer came; the
//! arbiter uses it for viewers that were waiting when it learned the end
//! from the database rather than from the daemon's stream.

use bytes::Bytes;

use super::ViewerOut;
use crate::store::{Terminal, TerminalSnapshot, TerminalState};
use crate::viewer_protocol::ServerMessage;

/// The messages, in order; the caller closes the socket 1000 after them.
pub fn ended_messages(terminal: &Terminal, snapshot: Option<TerminalSnapshot>, host_online: bool) -> Vec<ViewerOut> {
    let host = if host_online { "online" } else { "offline" };
    let mut out =
        vec![ViewerOut::control(ServerMessage::Status { state: terminal.state.as_str().into(), host: host.into() })];
    let (cols, rows) = snapshot.as_ref().map_or((terminal.cols, terminal.rows), |s| (s.cols, s.rows));
    out.push(ViewerOut::control(ServerMessage::Size { cols, rows, yours: false }));
    if let Some(s) = snapshot {
        out.push(ViewerOut::Binary(Bytes::from(s.data)));
    }
    if terminal.state == TerminalState::Error {
        let message = terminal.error.clone().unwrap_or_else(|| "the terminal failed to start".into());
        out.push(ViewerOut::control(ServerMessage::error(message.clone())));
    } else {
        out.push(ViewerOut::control(ServerMessage::Exit { exit_code: terminal.exit_code }));
    }
    out
}
