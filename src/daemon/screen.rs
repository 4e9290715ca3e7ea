//! The screen model of a terminal (vt100) and the grid sizes it accepts.
//!
//! Fed with every byte the terminal emits, it answers "what does the screen
//! look like right now" as escape sequences that repaint it: the data of a
//! Scrollback (on attach) and of the final Snapshot (before Exit).

use std::num::NonZeroU16;

use bytes::Bytes;

use super::screen_skip::ScrollSkip;

/// Grids are clamped to 1..=1000 in both directions (docs/PROTOCOL.md, "Terminals").
const MAX_GRID: u16 = 1000;

/// Snapshots must fit a 1 MiB frame with room for the envelope; a screen
/// that formats larger than this (huge grids full of attributes) is sent as
/// a blank repaint instead of a frame the server would refuse.
const MAX_SNAPSHOT_BYTES: usize = 960 * 1024;

/// Enter/leave the alternate screen: vt100 formats only the active grid, so
/// the snapshot says which buffer it belongs to.
const ENTER_ALTERNATE_SCREEN: &[u8] = b"\x1b[?1049h";
const LEAVE_ALTERNATE_SCREEN: &[u8] = b"\x1b[?1049l";
const CLEAR_AND_HOME: &[u8] = b"\x1b[H\x1b[2J";

/// A PTY grid: columns x rows, each 1..=1000.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridSize {
    cols: NonZeroU16,
    rows: NonZeroU16,
}

impl GridSize {
    /// Clamps a requested grid into 1..=1000.
    pub fn clamped(cols: u32, rows: u32) -> Self {
        Self { cols: clamp_dimension(cols), rows: clamp_dimension(rows) }
    }

    /// A Spawn's grid: 0 means "not given" and picks the classic 80x24.
    pub fn for_spawn(cols: u32, rows: u32) -> Self {
        Self::clamped(if cols == 0 { 80 } else { cols }, if rows == 0 { 24 } else { rows })
    }

    pub fn cols(self) -> u16 {
        self.cols.get()
    }

    pub fn rows(self) -> u16 {
        self.rows.get()
    }
}

fn clamp_dimension(value: u32) -> NonZeroU16 {
    let clamped = u16::try_from(value.min(u32::from(MAX_GRID))).unwrap_or(MAX_GRID);
    NonZeroU16::new(clamped).unwrap_or(NonZeroU16::MIN)
}

/// The terminal's current screen.
pub struct ScreenModel {
    parser: vt100::Parser,
    /// Keeps text that scrolls off unseen from being parsed (`screen_skip`).
    skip: ScrollSkip,
}

impl ScreenModel {
    pub fn new(size: GridSize) -> Self {
        // No scrollback: snapshots repaint the visible screen only, and the
        // ring buffer already holds recent history. `ScrollSkip` relies on
        // this: with scrollback, skipped lines would be missing from it.
        Self { parser: vt100::Parser::new(size.rows, size.cols, 0), skip: ScrollSkip::default() }
    }

    /// Parses output into the screen; returns how many of its bytes were
    /// skipped as scrolled off unseen (see `screen_skip`).
    pub fn process(&mut self, output: &[u8]) -> usize {
        self.skip.process(&mut self.parser, output)
    }

    pub fn resize(&mut self, size: GridSize) {
        self.skip.resize(&mut self.parser, size.rows, size.cols);
    }

    /// Escape sequences that repaint the screen on a terminal of the same
    /// size: buffer (main/alternate), contents with attributes, cursor
    /// position and visibility, and input modes (keypad, bracketed paste,
    /// mouse) so a fresh viewer behaves like the one that was there.
    pub fn snapshot(&mut self) -> Bytes {
        self.skip.flush(&mut self.parser);
        let screen = self.parser.screen();
        let buffer_switch = if screen.alternate_screen() { ENTER_ALTERNATE_SCREEN } else { LEAVE_ALTERNATE_SCREEN };
        let state = screen.state_formatted();
        let mut out = Vec::with_capacity(buffer_switch.len() + state.len());
        out.extend_from_slice(buffer_switch);
        if buffer_switch.len() + state.len() <= MAX_SNAPSHOT_BYTES {
            out.extend_from_slice(state.as_bytes());
        } else {
            tracing::warn!(formatted_bytes = state.len(), "tether_daemon_snapshot_too_large");
            out.extend_from_slice(CLEAR_AND_HOME);
            out.extend_from_slice(screen.cursor_state_formatted().as_bytes());
        }
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_are_clamped_and_spawn_defaults_apply() {
        let size = GridSize::clamped(0, 5000);
        assert_eq!((size.cols(), size.rows()), (1, 1000));
        let size = GridSize::for_spawn(0, 0);
        assert_eq!((size.cols(), size.rows()), (80, 24));
        let size = GridSize::for_spawn(132, 43);
        assert_eq!((size.cols(), size.rows()), (132, 43));
    }

    /// Replaying the snapshot into a fresh parser reproduces the screen,
    /// including the cursor position.
    #[test]
    fn snapshot_repaints_contents_and_cursor() {
        let mut model = ScreenModel::new(GridSize::clamped(20, 5));
        model.process(b"hello\r\n\x1b[31mred\x1b[0m world\r\nab");
        let snapshot = model.snapshot();

        let mut replay = vt100::Parser::new(NonZeroU16::new(5).unwrap(), NonZeroU16::new(20).unwrap(), 0);
        replay.process(&snapshot);
        assert_eq!(replay.screen().contents(), model.parser.screen().contents());
        assert_eq!(replay.screen().cursor_position(), (2, 2));
        assert_eq!(replay.screen().cell(1, 0).map(|cell| cell.fgcolor()), Some(vt100::Color::Idx(1)));
    }

    #[test]
    fn snapshot_names_the_alternate_screen() {
        let mut model = ScreenModel::new(GridSize::clamped(10, 3));
        assert!(model.snapshot().starts_with(LEAVE_ALTERNATE_SCREEN));
        model.process(b"\x1b[?1049hfull-screen");
        assert!(model.snapshot().starts_with(ENTER_ALTERNATE_SCREEN));
    }

    #[test]
    fn resize_changes_the_model_size() {
        let mut model = ScreenModel::new(GridSize::clamped(80, 24));
        model.resize(GridSize::clamped(100, 30));
        let (rows, cols) = model.parser.screen().size();
        assert_eq!((rows.get(), cols.get()), (30, 100));
    }
}
