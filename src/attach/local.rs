//! The user's side of `tether attach`: raw mode and its restoration, raw
//! keystrokes from stdin, and the local window size with its changes.
//!
//! Everything here touches the real process terminal, which is why the
//! session logic never uses it directly: `run` builds a [`LocalIo`] from
//! these pieces, and tests build one from plain streams and buffers.
//!
//! [`LocalIo`]: super::LocalIo

use std::io::{self, IsTerminal, Read, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;

/// Used when the window size cannot be read (no controlling terminal).
const FALLBACK_SIZE: (u16, u16) = (80, 24);

/// Keystroke chunks waiting for the session; the reader thread blocks when it
/// is full, so a stalled socket cannot make stdin grow memory.
const STDIN_QUEUE: usize = 64;

/// Undoes modes the remote program may have left on when the stream stops
/// mid-session (detach, host gone): SGR reset, main screen, visible cursor,
/// mouse and focus reporting off, bracketed paste off, normal cursor keys and
/// keypad; then a new line so the closing message starts at column 0. The
/// scroll region is left alone: resetting it moves the cursor home.
const RESTORE_SEQUENCE: &[u8] = b"\x1b[0m\x1b[?1049l\x1b[?25h\
\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?1004l\x1b[?2004l\x1b[?1l\x1b>\r\n";

/// Puts the terminal in raw mode for its lifetime and restores it on drop,
/// which also runs on early returns, errors and panics that unwind.
pub(super) struct TerminalGuard {
    raw_mode: bool,
    reset_screen: bool,
}

impl TerminalGuard {
    /// Raw mode only when stdin is a terminal: in a pipe there is no line
    /// discipline to switch off, and the bytes already arrive unprocessed.
    pub(super) fn enter() -> io::Result<Self> {
        let raw_mode = io::stdin().is_terminal();
        if raw_mode {
            crossterm::terminal::enable_raw_mode()?;
        }
        Ok(Self { raw_mode, reset_screen: io::stdout().is_terminal() })
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        // Errors cannot be reported from drop, and there is nothing better
        // to do than try both steps regardless.
        if self.reset_screen {
            let mut stdout = io::stdout();
            let _ = stdout.write_all(RESTORE_SEQUENCE);
            let _ = stdout.flush();
        }
        if self.raw_mode {
            let _ = crossterm::terminal::disable_raw_mode();
        }
    }
}

/// The local window size as (cols, rows).
pub(super) fn window_size() -> (u16, u16) {
    match crossterm::terminal::size() {
        Ok((cols, rows)) if cols > 0 && rows > 0 => (cols, rows),
        _ => FALLBACK_SIZE,
    }
}

/// Raw stdin bytes, read on a dedicated thread because stdin reads block and
/// the session runs on a single-threaded runtime. The thread ends at EOF or
/// when the session is gone and a further keystroke finds the channel closed.
pub(super) fn stdin_chunks() -> io::Result<StdinChunks> {
    let (tx, rx) = mpsc::channel(STDIN_QUEUE);
    std::thread::Builder::new().name("tether-attach-stdin".into()).spawn(move || {
        let mut stdin = io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx.blocking_send(Bytes::copy_from_slice(&buf[..n])).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "tether_attach_stdin_failed");
                    break;
                }
            }
        }
    })?;
    Ok(StdinChunks(rx))
}

/// Stream side of [`stdin_chunks`].
pub(super) struct StdinChunks(mpsc::Receiver<Bytes>);

impl Stream for StdinChunks {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        self.0.poll_recv(cx)
    }
}

/// The new window size after every SIGWINCH.
pub(super) fn window_resizes() -> io::Result<WindowResizes> {
    Ok(WindowResizes(signal(SignalKind::window_change())?))
}

pub(super) struct WindowResizes(Signal);

impl Stream for WindowResizes {
    type Item = (u16, u16);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<(u16, u16)>> {
        self.0.poll_recv(cx).map(|signal| signal.map(|()| window_size()))
    }
}
