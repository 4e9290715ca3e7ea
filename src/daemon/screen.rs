//! The screen model of a terminal (vt100) and the grid sizes it accepts.
//!
//! Fed with every byte the terminal emits, it answers "what does the screen
//! look like right now" as escape sequences that repaint it: the data of a
//! Scrollback (on attach) and of the final Snapshot (before Exit).

use std::num::NonZeroU16;

use bytes::Bytes;

use super::screen_skip::{Region, ScrollSkip};

/// Grids are clamped to 1..=1000 in both directions (docs/PROTOCOL.md, "Terminals").
const MAX_GRID: u16 = 1000;

/// Snapshots must fit a 1 MiB frame with room for the envelope; a screen
/// that formats larger than this (a huge grid full of attributes) is sent
/// as its bottom rows, as many as fit (`trimmed`).
const MAX_SNAPSHOT_BYTES: usize = 960 * 1024;

/// Before each row of a trimmed snapshot: attributes back to the default,
/// which is what each row's formatting starts from.
const RESET_ATTRIBUTES: &str = "\x1b[m";

/// Enter/leave the alternate screen: vt100 formats only the active grid, so
/// the snapshot says which buffer it belongs to. A snapshot taken on the
/// alternate screen first paints the main screen as it was when the
/// program switched, then switches: a viewer that joined while `less` or
/// `vim` ran sees the shell again when it quits, as the real terminal does.
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
    /// While the alternate screen is active: the main screen as it was when
    /// the program switched (vt100 formats only the active grid, and the
    /// main one does not change meanwhile), if it is still known.
    main_before_alternate: Option<String>,
}

impl ScreenModel {
    pub fn new(size: GridSize) -> Self {
        // No scrollback: snapshots repaint the visible screen only, and the
        // ring buffer already holds recent history. `ScrollSkip` relies on
        // this: with scrollback, skipped lines would be missing from it.
        Self {
            parser: vt100::Parser::new(size.rows, size.cols, 0),
            skip: ScrollSkip::default(),
            main_before_alternate: None,
        }
    }

    /// Parses output into the screen; returns how many of its bytes were
    /// skipped as scrolled off unseen (see `screen_skip`). At a switch to
    /// the alternate screen the main one is formatted first and kept.
    pub fn process(&mut self, output: &[u8]) -> usize {
        let mut skipped = 0;
        let mut rest = output;
        loop {
            let alternate = self.parser.screen().alternate_screen();
            let switch = if alternate { LEAVE_ALTERNATE_SCREEN } else { ENTER_ALTERNATE_SCREEN };
            let Some(at) = memchr::memmem::find(rest, switch) else { break };
            let switched = at + switch.len();
            skipped += self.skip.process(&mut self.parser, &rest[..at]);
            if !alternate {
                self.skip.flush(&mut self.parser);
                self.main_before_alternate = Some(self.parser.screen().state_formatted());
            }
            skipped += self.skip.process(&mut self.parser, &rest[at..switched]);
            rest = &rest[switched..];
        }
        skipped += self.skip.process(&mut self.parser, rest);
        if !self.parser.screen().alternate_screen() {
            self.main_before_alternate = None;
        }
        skipped
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
        let state = screen.state_formatted();
        let mut out = Vec::with_capacity(state.len() + 16);
        let main = self
            .main_before_alternate
            .as_deref()
            .filter(|main| screen.alternate_screen() && main.len() + state.len() + 32 <= MAX_SNAPSHOT_BYTES);
        if let Some(main) = main {
            out.extend_from_slice(LEAVE_ALTERNATE_SCREEN);
            out.extend_from_slice(main.as_bytes());
        }
        out.extend_from_slice(if screen.alternate_screen() { ENTER_ALTERNATE_SCREEN } else { LEAVE_ALTERNATE_SCREEN });
        if out.len() + state.len() <= MAX_SNAPSHOT_BYTES {
            out.extend_from_slice(state.as_bytes());
        } else {
            let left_out = trimmed(screen, &mut out);
            tracing::warn!(formatted_bytes = state.len(), rows_left_out = left_out, "tether_daemon_snapshot_trimmed");
        }
        // vt100's formatted state leaves out the active grid's scroll
        // region; output that scrolls within it would scroll a replayed
        // screen whole. Setting it homes the cursor, so the cursor is set
        // again after it.
        if let Region::Rows(top, bottom) = self.skip.region(screen.alternate_screen()) {
            out.extend_from_slice(format!("\x1b[{};{}r", top + 1, bottom + 1).as_bytes());
            out.extend_from_slice(screen.cursor_state_formatted().as_bytes());
        }
        Bytes::from(out)
    }
}

/// Repaints the bottom rows of `screen`, as many as fit in
/// `MAX_SNAPSHOT_BYTES` with what `out` holds, from a cleared screen, with
/// the cursor, attributes and input modes as a full snapshot has them;
/// returns how many rows at the top were left out (blank in the repaint).
///
/// Each row's formatting starts from the default attributes, so every kept
/// row is preceded by an attribute reset. A row that continues a wrapped
/// one counts on the cursor waiting at the end of the row above, where
/// writing the row above left it; the first kept row, and every row that
/// starts a line, is preceded by a move to its start instead.
fn trimmed(screen: &vt100::Screen, out: &mut Vec<u8>) -> usize {
    let (_, cols) = screen.size();
    let rows: Vec<String> = screen.rows_formatted(0, cols.get()).collect();
    let continues = |row: usize| row > 0 && u16::try_from(row - 1).is_ok_and(|above| screen.row_wrapped(above));
    let start_of = |row: usize| format!("{RESET_ATTRIBUTES}\x1b[{};1H", row + 1);
    let tail = [screen.cursor_state_formatted(), screen.attributes_formatted(), screen.input_mode_formatted()].concat();
    let budget = MAX_SNAPSHOT_BYTES.saturating_sub(out.len() + CLEAR_AND_HOME.len() + tail.len());
    // The top row to keep: the highest from which the rest fits (each row
    // counted with the longer of its two preludes).
    let mut first = rows.len();
    let mut used = 0;
    for row in (0..rows.len()).rev() {
        used += start_of(row).len() + rows[row].len();
        if used > budget {
            break;
        }
        first = row;
    }
    out.extend_from_slice(CLEAR_AND_HOME);
    for (row, contents) in rows.iter().enumerate().skip(first) {
        if row == first || !continues(row) {
            out.extend_from_slice(start_of(row).as_bytes());
        } else {
            out.extend_from_slice(RESET_ATTRIBUTES.as_bytes());
        }
        out.extend_from_slice(contents.as_bytes());
    }
    out.extend_from_slice(tail.as_bytes());
    first
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

    /// A scroll region set on the screen is set by its snapshot too: a
    /// replayed screen then scrolls the same rows as the real one.
    #[test]
    fn snapshot_sets_the_scroll_region() {
        let (rows, cols) = (NonZeroU16::new(8).unwrap(), NonZeroU16::new(20).unwrap());
        for setup in [&b"\x1b[HTOP\x1b[3;6r\x1b[6;1H"[..], b"\x1b[?1049hALT\x1b[2;5r\x1b[5;4H"] {
            let mut model = ScreenModel::new(GridSize::clamped(20, 8));
            model.process(setup);
            let snapshot = model.snapshot();
            let mut replay = vt100::Parser::new(rows, cols, 0);
            replay.process(&snapshot);
            assert_eq!(replay.screen().cursor_position(), model.parser.screen().cursor_position());
            let more: Vec<u8> = (1..=12).flat_map(|n| format!("{n}\r\n").into_bytes()).collect();
            model.process(&more);
            replay.process(&more);
            model.snapshot(); // parses what the model still held back
            assert_eq!(replay.screen().contents(), model.parser.screen().contents(), "{setup:?}");
        }
    }

    #[test]
    fn snapshot_names_the_alternate_screen() {
        let mut model = ScreenModel::new(GridSize::clamped(10, 3));
        assert!(model.snapshot().starts_with(LEAVE_ALTERNATE_SCREEN));
        model.process(b"\x1b[?1049hfull-screen");
        let mut replay = vt100::Parser::new(NonZeroU16::new(3).unwrap(), NonZeroU16::new(10).unwrap(), 0);
        replay.process(&model.snapshot());
        assert!(replay.screen().alternate_screen());
    }

    /// A viewer that joins while a full-screen program runs on the
    /// alternate screen gets the main screen too: when the program quits,
    /// the replayed screen shows what the real one shows (the shell's
    /// lines and the cursor where it was), not a blank screen.
    #[test]
    fn a_snapshot_on_the_alternate_screen_keeps_the_main_one_underneath() {
        let (rows, cols) = (NonZeroU16::new(6).unwrap(), NonZeroU16::new(30).unwrap());
        // The switch in the middle of a read, after main-screen output.
        for (before, switch) in [(&b"$ seq 3\r\n1\r\n2\r\n3\r\n$ less f"[..], &b"\r\n\x1b[?1049h\x1b[?1h\x1b=page"[..])]
        {
            for split in [false, true] {
                let mut model = ScreenModel::new(GridSize::clamped(30, 6));
                if split {
                    model.process(before);
                    model.process(switch);
                } else {
                    model.process(&[before, switch].concat());
                }
                let mut replay = vt100::Parser::new(rows, cols, 0);
                replay.process(&model.snapshot());
                assert!(replay.screen().alternate_screen());
                assert_eq!(replay.screen().contents(), model.parser.screen().contents());
                let quit = b"\x1b[?1049l\x1b[?1l\x1b>after-less\r\n$ ";
                model.process(quit);
                replay.process(quit);
                model.snapshot(); // parses what the model still held back
                assert_eq!(replay.screen().contents(), model.parser.screen().contents(), "split {split}");
                assert_eq!(replay.screen().cursor_position(), model.parser.screen().cursor_position());
                assert!(replay.screen().contents().contains("$ less f\nafter-less"), "{}", replay.screen().contents());
            }
        }
        // Back to the main screen and off again in one read: the main
        // screen kept is the newer one.
        let mut model = ScreenModel::new(GridSize::clamped(30, 6));
        model.process(b"one\r\n\x1b[?1049hA\x1b[?1049ltwo\r\n\x1b[?1049hB");
        let mut replay = vt100::Parser::new(rows, cols, 0);
        replay.process(&model.snapshot());
        replay.process(b"\x1b[?1049l");
        model.process(b"\x1b[?1049l");
        model.snapshot();
        assert_eq!(replay.screen().contents(), model.parser.screen().contents());
    }

    /// A screen whose formatting is over the limit (a 400x120 grid of
    /// 24-bit colours) repaints its bottom rows exactly, colours and cursor
    /// included, within the limit; the rows left out are blank.
    #[test]
    fn an_oversized_screen_repaints_its_bottom_rows() {
        let (cols, rows) = (400u16, 120u16);
        let mut model = ScreenModel::new(GridSize::clamped(cols.into(), rows.into()));
        let mut output = Vec::new();
        for row in 0..rows {
            for col in 0..cols {
                let (r, g, b) = (row % 256, col % 256, (row * 7 + col) % 256);
                output.extend_from_slice(
                    format!("\x1b[38;2;{r};{g};{b};48;2;{b};{r};{g}m{}", (b'a' + (col % 26) as u8) as char).as_bytes(),
                );
            }
        }
        // The last row is written whole, then the cursor goes back into it.
        output.extend_from_slice(b"\x1b[0m\x1b[120;17H");
        model.process(&output);
        let full = model.parser.screen().state_formatted();
        assert!(full.len() > MAX_SNAPSHOT_BYTES, "the test's screen formats to {} bytes", full.len());

        let blank = repaint_matches_below_the_blank_rows(&mut model);
        assert!((1..60).contains(&blank), "{blank} rows left out");
        assert_eq!(model.parser.screen().cursor_position(), (119, 16));
    }

    /// Replays the model's snapshot, which must fit the limit, into a fresh
    /// parser: below the blank rows at the top (their count is returned)
    /// every cell and wrap flag is the model's, and so is the cursor.
    fn repaint_matches_below_the_blank_rows(model: &mut ScreenModel) -> usize {
        let snapshot = model.snapshot();
        assert!(snapshot.len() <= MAX_SNAPSHOT_BYTES, "{}", snapshot.len());
        let (rows, cols) = model.parser.screen().size();
        let mut replay = vt100::Parser::new(rows, cols, 0);
        replay.process(&snapshot);
        let (original, repainted) = (model.parser.screen(), replay.screen());
        let (rows, cols) = (rows.get(), cols.get());
        let blank =
            (0..rows).take_while(|row| repainted.contents_between(*row, 0, *row, cols).trim().is_empty()).count();
        for row in u16::try_from(blank).unwrap()..rows {
            assert_eq!(repainted.row_wrapped(row), original.row_wrapped(row), "row {row}");
            for col in 0..cols {
                assert_eq!(repainted.cell(row, col), original.cell(row, col), "cell {row},{col}");
            }
        }
        assert_eq!(repainted.cursor_position(), original.cursor_position());
        blank
    }

    /// Wrapped rows keep wrapping in a trimmed repaint, whether the first
    /// row kept starts a line or continues one.
    #[test]
    fn a_trimmed_repaint_keeps_wrapped_rows_whole() {
        let (cols, rows) = (1000u16, 1000u16);
        let mut model = ScreenModel::new(GridSize::clamped(cols.into(), rows.into()));
        let mut output = Vec::new();
        // Lines of 1,500 coloured cells: each wraps once.
        for line in 0..500u32 {
            for col in 0..1500u32 {
                output.extend_from_slice(
                    format!("\x1b[38;5;{}m{}", (line + col) % 256, (b'a' + (col % 26) as u8) as char).as_bytes(),
                );
            }
            if line < 499 {
                output.extend_from_slice(b"\r\n");
            }
        }
        model.process(&output);
        let blank = repaint_matches_below_the_blank_rows(&mut model);
        assert!(blank > 0 && blank < 1000, "{blank} rows left out");
    }

    #[test]
    fn resize_changes_the_model_size() {
        let mut model = ScreenModel::new(GridSize::clamped(80, 24));
        model.resize(GridSize::clamped(100, 30));
        let (rows, cols) = model.parser.screen().size();
        assert_eq!((rows.get(), cols.get()), (30, 100));
    }
}
