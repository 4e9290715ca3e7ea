//! The viewer protocol's client side (docs/CLI.md, "What the client speaks").
//!
//! - [`Client::open_viewer`]: one socket to `/ws/v1/terminals/{id}`
//!   (optionally `?from=N`), authenticated with the bearer token. The raw
//!   socket is what `tether attach` drives: it shows snapshots and live
//!   bytes alike and sends keystrokes.
//! - [`OutputFollower`]: the terminal's output *stream*, byte-exact, for
//!   programs (`tether run`, `tether logs --follow`, the examples): snapshot
//!   repaints are dropped, a replay that skips bytes is reported as a
//!   [`Followed::Gap`], and a socket closed because the host moved (4503) or
//!   dropped is reopened from the next offset.
//! - [`liveness`]: both give up a connection whose server stopped
//!   answering, and reattach.

mod follow;
pub mod fragments;
pub mod liveness;
pub mod protocol;

use std::time::Duration;

use awc::error::WsClientError;

pub use follow::{Followed, OutputFollower};

use super::error::from_send;
use super::{Client, ClientError};

/// An open viewer socket: awc frames in, messages out.
pub type ViewerSocket = actix_codec::Framed<awc::BoxedSocket, awc::ws::Codec>;

/// Handshake deadline: a server that accepts TCP but never answers must not
/// hang the caller.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest frame (and reassembled message) accepted from the server. Daemon
/// frames are capped at 1 MiB; a snapshot of a large grid with attributes
/// can exceed awc's 64 KiB default.
pub const MAX_FRAME: usize = 4 * 1024 * 1024;

impl Client {
    /// Opens a viewer socket; `from` asks the server to resume the stream
    /// at that offset instead of repainting (it may still replay).
    pub async fn open_viewer(&self, terminal_id: &str, from: Option<u64>) -> Result<ViewerSocket, ClientError> {
        let url = protocol::viewer_url(self.server(), terminal_id, from)?;
        let request =
            self.http.ws(&url).protocols([protocol::SUBPROTOCOL]).bearer_auth(self.token()).max_frame_size(MAX_FRAME);
        match tokio::time::timeout(CONNECT_TIMEOUT, request.connect()).await {
            Err(_) => Err(ClientError::Connect { url, message: "no answer to the WebSocket handshake".into() }),
            Ok(Ok((_response, socket))) => Ok(socket),
            Ok(Err(WsClientError::InvalidResponseStatus(status))) => {
                Err(ClientError::Rejected { status: status.as_u16() })
            }
            Ok(Err(e)) => Err(from_send(&url, &e)),
        }
    }
}
