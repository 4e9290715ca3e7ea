//! The cheap path into the screen model: plain text that scrolls off the
//! screen before anyone could see it is not parsed (issue 10 section 1;
//! docs/BENCHMARKS.md, "the output path after skipping scrolled-off text").
//!
//! A *plain run* is a stretch of output made only of printable ASCII, tab,
//! CR and LF, met while the parser is in its ground state. Inside such a run
//! the cursor only moves right and down, so when the run holds more line
//! feeds than the screen has rows, everything before the LF that has
//! `rows` more LFs after it in the run ends up scrolled away, and all that
//! remains of it is:
//!
//! - how many lines scrolled (vt100 counts them even without scrollback, and
//!   uses the count when a resize adds rows),
//! - that the cursor sits on the bottom row, on a blank row just scrolled in,
//!   at the column the text left it in.
//!
//! So the model is fed a synthetic equivalent of that prefix (CR, LFs down
//! to the bottom row, `CSI n S` for the scrolled lines, `CSI n G` for the
//! column) and then the rest of the run as it is: the last `rows` lines,
//! which repaint every row the prefix left behind. The model's state after
//! it is the same as after parsing every byte (`screen_skip` tests compare
//! the whole vt100 state, not just the snapshot), with one bound on the
//! count of scrolled lines, below.
//!
//! The count of scrolled lines is the exception. vt100 counts a scrolled
//! line by blanking a row, so a count of `n` costs `n` row resets, which
//! for `cat` of a large file was the screen thread's largest cost
//! (docs/BENCHMARKS.md, "the count of scrolled lines"). The count is read
//! only when a resize makes the screen taller: that many of the added rows
//! (at most all of them) come in blank at the top, and the count goes down
//! by as many. So a skip counts every scrolled line only while the model is
//! known to hold fewer than [`COUNTED_LINES`]; past that it counts a
//! screen's height, which blanks the screen just as the full count would.
//! What the model is known to hold goes down with each taller resize and
//! to zero with `CSI 3 J` and a full reset (both zero the count), and the
//! next skips count in full again. So the screen differs from a full
//! parse's only when taller resizes take more rows from the count than
//! the skips since have counted in full (at least [`COUNTED_LINES`], or all
//! that scrolled if fewer): then a full parse still has blank rows to
//! bring in at the top.
//!
//! This holds only while the active grid's scroll region is the whole
//! screen, and only when the run starts in vte's ground state. vt100 does
//! not expose either, so this module keeps its own copy:
//!
//! - the parser state, by following vte 0.15's state machine byte by byte
//!   outside the ground state (the ground state is only left by ESC);
//! - per grid (main and alternate) whether the region is known to be full:
//!   DECSTBM sets it (a region vt100 would set wrongly read is taken as
//!   partial), RIS resets both, `CSI ? 1049 h` clears the alternate one,
//!   and a resize to a new size makes both full again (vt100's
//!   `Grid::set_size`). Which grid is active is asked of vt100 itself.
//!
//! Whenever a condition is not known to hold, the run is parsed in full.

use vt100::Parser;

/// Sequences with more parameters than this are not read for their effect
/// on the regions (vte keeps 32; those cases are taken conservatively).
const MAX_PARAMS: usize = 16;
/// The private mode whose set clears the alternate grid (region included).
const ALTERNATE_SCREEN_CLEARED: u16 = 1049;
/// At most this much of an unfinished plain run is held back for the next
/// chunk; a longer one (a huge line without LF) is parsed as it comes.
const MAX_HELD_BYTES: usize = 64 * 1024;
/// Scrolled lines a skip keeps counted in the model (module docs): ten
/// times the tallest grid a terminal may have (`screen::MAX_GRID`).
const COUNTED_LINES: usize = 10_000;

/// vte 0.15's parser states, mirrored outside ground.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VtState {
    Ground,
    Escape,
    EscapeIntermediate,
    CsiEntry,
    CsiParam,
    CsiIntermediate,
    CsiIgnore,
    DcsEntry,
    DcsParam,
    DcsIntermediate,
    DcsIgnore,
    DcsPassthrough,
    OscString,
    SosPmApcString,
}

/// The control sequence being read, as far as the regions care.
#[derive(Debug, Default)]
struct CsiSequence {
    params: [u16; MAX_PARAMS],
    /// Parameters completed by `;`.
    completed: usize,
    current: u16,
    /// Sub-parameters (`:`) or more than [`MAX_PARAMS`]: not read.
    irregular: bool,
    intermediates: usize,
    first_intermediate: u8,
}

impl CsiSequence {
    fn digit(&mut self, byte: u8) {
        self.current = self.current.saturating_mul(10).saturating_add(u16::from(byte - b'0'));
    }

    fn next_param(&mut self) {
        if self.completed < MAX_PARAMS {
            self.params[self.completed] = self.current;
            self.completed += 1;
        } else {
            self.irregular = true;
        }
        self.current = 0;
    }

    fn collect(&mut self, byte: u8) {
        if self.intermediates == 0 {
            self.first_intermediate = byte;
        }
        self.intermediates += 1;
    }

    /// Completes the last parameter at the final byte, as vte does.
    fn finish(&mut self) {
        self.next_param();
    }

    fn params(&self) -> &[u16] {
        &self.params[..self.completed]
    }
}

/// What a byte outside ground did that the regions depend on.
enum Effect {
    None,
    /// A CSI sequence was dispatched with this final byte.
    Csi(u8),
    /// `ESC c`: vt100 builds a new screen.
    FullReset,
}

/// A grid's scroll region (DECSTBM) as vt100 keeps it, which vt100 does
/// not tell: known from the sequences that set and reset it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// The whole screen.
    Full,
    /// Rows `top..=bottom`, 0-based.
    Rows(u16, u16),
    /// Set by a sequence read conservatively (one with intermediates).
    Unknown,
}

/// Feeds a vt100 parser, replacing scrolled-off plain text with a synthetic
/// scroll (module docs).
pub struct ScrollSkip {
    state: VtState,
    csi: CsiSequence,
    /// The last byte given was a non-ASCII byte in ground, so vte may hold
    /// an incomplete UTF-8 sequence that the next byte completes or ends.
    utf8_pending: bool,
    main_region: Region,
    alternate_region: Region,
    /// Scrolled lines the main grid is known to count (a lower bound: only
    /// the synthetic scrolls add to it); see the module docs.
    counted: usize,
    synthetic: Vec<u8>,
    /// The end of the input when it is an unfinished plain run: not parsed
    /// yet, because the next chunk may scroll it away too (reads from a
    /// PTY are often 4 KiB, a few screens at most). [`ScrollSkip::flush`]
    /// parses it before the screen is read or resized.
    held: Vec<u8>,
    /// Where the plain run that reaches the end of the input starts.
    open_run: Option<usize>,
    /// `held` followed by the new input (kept for its allocation).
    joined: Vec<u8>,
}

/// A plain run found in the input, with what the skip decision needs.
struct PlainRun {
    start: usize,
    /// The LF after which exactly `rows` LFs of the run follow.
    split: usize,
    /// The last printable byte of the run (vt100 remembers it for `CSI b`).
    last_printable: Option<usize>,
}

impl Default for ScrollSkip {
    fn default() -> Self {
        Self {
            state: VtState::Ground,
            csi: CsiSequence::default(),
            utf8_pending: false,
            main_region: Region::Full,
            alternate_region: Region::Full,
            counted: 0,
            synthetic: Vec::new(),
            held: Vec::new(),
            open_run: None,
            joined: Vec::new(),
        }
    }
}

impl ScrollSkip {
    /// Gives `data` to `parser`, skipping what scrolls off unseen. Returns
    /// how many bytes were not parsed.
    pub fn process(&mut self, parser: &mut Parser, data: &[u8]) -> usize {
        if self.held.is_empty() {
            return self.process_joined(parser, data);
        }
        let mut joined = std::mem::take(&mut self.joined);
        joined.clear();
        joined.extend_from_slice(&self.held);
        joined.extend_from_slice(data);
        self.held.clear();
        let skipped = self.process_joined(parser, &joined);
        self.joined = joined;
        skipped
    }

    /// Parses what is held back; the parser is then up to date with all
    /// input given so far.
    pub fn flush(&mut self, parser: &mut Parser) {
        if !self.held.is_empty() {
            parser.process(&self.held);
            // Plain text is ASCII: no UTF-8 sequence is left open.
            self.utf8_pending = false;
            self.held.clear();
        }
    }

    fn process_joined(&mut self, parser: &mut Parser, data: &[u8]) -> usize {
        self.open_run = None;
        let mut fed = 0;
        let mut skipped = 0;
        let mut i = 0;
        while i < data.len() {
            if self.state == VtState::Ground {
                let end = memchr::memchr(0x1b, &data[i..]).map_or(data.len(), |at| i + at);
                skipped += self.scan_ground(parser, data, i, end, &mut fed);
                i = end;
                if i < data.len() {
                    self.enter_escape();
                    i += 1;
                }
                continue;
            }
            match self.step(data[i]) {
                Effect::None => {}
                Effect::Csi(final_byte) => {
                    if self.on_csi(parser, final_byte, &data[fed..=i]) {
                        fed = i + 1;
                    }
                }
                Effect::FullReset => {
                    self.main_region = Region::Full;
                    self.alternate_region = Region::Full;
                    self.counted = 0;
                }
            }
            i += 1;
        }
        let hold_from = self.open_run.map_or(data.len(), |start| start.max(fed));
        let hold_from = if data.len() - hold_from <= MAX_HELD_BYTES { hold_from } else { data.len() };
        parser.process(&data[fed..hold_from]);
        self.held.extend_from_slice(&data[hold_from..]);
        if hold_from > 0 {
            self.utf8_pending = self.state == VtState::Ground && !data[hold_from - 1].is_ascii();
        }
        skipped
    }

    /// The scroll region of the main grid, or of the alternate one, as
    /// the parser has it once what was given is parsed (a snapshot must
    /// set it: vt100's formatted state leaves it out).
    pub fn region(&self, alternate: bool) -> Region {
        if alternate {
            self.alternate_region
        } else {
            self.main_region
        }
    }

    /// Resizes the parser; a new size makes both regions full (vt100's
    /// `Grid::set_size` resets them to the new size; the same size is a no-op).
    pub fn resize(&mut self, parser: &mut Parser, rows: std::num::NonZeroU16, cols: std::num::NonZeroU16) {
        self.flush(parser);
        let (old_rows, old_cols) = parser.screen().size();
        if (old_rows, old_cols) != (rows, cols) {
            self.main_region = Region::Full;
            self.alternate_region = Region::Full;
        }
        // A taller screen takes up to the rows it gains from the count.
        self.counted = self.counted.saturating_sub(usize::from(rows.get().saturating_sub(old_rows.get())));
        parser.set_size(rows, cols);
    }

    fn enter_escape(&mut self) {
        self.state = VtState::Escape;
    }

    fn enter_csi(&mut self) {
        self.csi = CsiSequence::default();
        self.state = VtState::CsiEntry;
    }

    /// Acts on a dispatched CSI sequence that may change a region. `upto`
    /// is the input not yet fed, ending with the final byte; returns whether
    /// it was fed (DECSTBM needs the parser at that point to know which grid
    /// is active).
    fn on_csi(&mut self, parser: &mut Parser, final_byte: u8, upto: &[u8]) -> bool {
        self.csi.finish();
        let csi = &self.csi;
        let plain = csi.intermediates == 0 && !csi.irregular;
        let private = csi.intermediates == 1 && csi.first_intermediate == b'?' && !csi.irregular;
        let params = csi.params();
        match final_byte {
            b'r' => {
                let (rows, _) = parser.screen().size();
                let region = if plain { decstbm_region(params, rows.get()) } else { Region::Unknown };
                parser.process(upto);
                if parser.screen().alternate_screen() {
                    self.alternate_region = region;
                } else {
                    self.main_region = region;
                }
                true
            }
            b'h' => {
                if private && params.contains(&ALTERNATE_SCREEN_CLEARED) {
                    self.alternate_region = Region::Full;
                }
                false
            }
            // ED 3 (and vt100 reads `CSI ? 3 J` the same way) zeroes the
            // count; an unread parameter list is taken as doing so.
            b'J' => {
                if csi.irregular || params.first() == Some(&3) {
                    self.counted = 0;
                }
                false
            }
            _ => false,
        }
    }

    /// One byte outside ground, as vte 0.15 handles it.
    fn step(&mut self, byte: u8) -> Effect {
        use VtState::*;
        // vte's "anywhere" transitions, the same in every state.
        match byte {
            0x18 | 0x1a => {
                self.state = Ground;
                return Effect::None;
            }
            0x1b => {
                self.enter_escape();
                return Effect::None;
            }
            0x07 if self.state == OscString => {
                self.state = Ground;
                return Effect::None;
            }
            0x9c if self.state == DcsPassthrough => {
                self.state = Ground;
                return Effect::None;
            }
            // Other C0 controls, DEL and 8-bit bytes never change the state.
            0x20..=0x7e => {}
            _ => return Effect::None,
        }
        match (self.state, byte) {
            (Ground, _) => unreachable!("ground bytes are scanned by scan_ground"),
            (Escape, 0x20..=0x2f) => self.state = EscapeIntermediate,
            (Escape, b'P') => self.state = DcsEntry,
            (Escape, b'X' | b'^' | b'_') => self.state = SosPmApcString,
            (Escape, b'[') => self.enter_csi(),
            (Escape, b']') => self.state = OscString,
            (Escape, b'c') => {
                self.state = Ground;
                return Effect::FullReset;
            }
            (Escape | EscapeIntermediate, 0x30..=0x7e) => self.state = Ground,
            (CsiEntry | CsiParam, b'0'..=b'9') => {
                self.csi.digit(byte);
                self.state = CsiParam;
            }
            (CsiEntry | CsiParam, b':') => {
                self.csi.irregular = true;
                self.state = CsiParam;
            }
            (CsiEntry | CsiParam, b';') => {
                self.csi.next_param();
                self.state = CsiParam;
            }
            (CsiEntry, 0x3c..=0x3f) => {
                self.csi.collect(byte);
                self.state = CsiParam;
            }
            (CsiParam | CsiIntermediate, 0x30..=0x3f) => self.state = CsiIgnore,
            (CsiEntry | CsiParam | CsiIntermediate, 0x20..=0x2f) => {
                self.csi.collect(byte);
                self.state = CsiIntermediate;
            }
            (CsiEntry | CsiParam | CsiIntermediate, 0x40..=0x7e) => {
                self.state = Ground;
                return Effect::Csi(byte);
            }
            (CsiIgnore, 0x40..=0x7e) => self.state = Ground,
            (DcsEntry | DcsParam | DcsIntermediate, 0x40..=0x7e) => self.state = DcsPassthrough,
            (DcsEntry | DcsParam, 0x20..=0x2f) => self.state = DcsIntermediate,
            (DcsEntry | DcsParam, 0x30..=0x3b) => self.state = DcsParam,
            (DcsEntry, 0x3c..=0x3f) => self.state = DcsParam,
            (DcsParam | DcsIntermediate, 0x3c..=0x3f) | (DcsIntermediate, 0x30..=0x3b) => self.state = DcsIgnore,
            // Intermediates after the first, ignored sequences and string
            // contents keep the state.
            _ => {}
        }
        Effect::None
    }

    /// Scans `data[start..end]`, which vte reads in ground (no ESC in it),
    /// for plain runs worth skipping. Per byte it only checks that the run
    /// goes on; the line feeds that decide the split are found from the
    /// run's end with `memrchr`.
    fn scan_ground(&mut self, parser: &mut Parser, data: &[u8], start: usize, end: usize, fed: &mut usize) -> usize {
        let rows = usize::from(parser.screen().size().0.get());
        let mut skipped = 0;
        let mut i = start;
        while i < end {
            if !is_plain(data[i]) {
                i += 1;
                continue;
            }
            let run_start = i;
            i += plain_prefix_len(&data[i..end]);
            if i == data.len() {
                self.open_run = Some(run_start);
            }
            let run = &data[run_start..i];
            // The LF after which exactly `rows` LFs of the run follow.
            let Some(split) = memchr::memrchr_iter(b'\n', run).nth(rows) else { continue };
            let last_printable = run.iter().rposition(|&byte| !matches!(byte, b'\n' | b'\r' | b'\t'));
            // A non-ASCII byte just before the run may be an incomplete UTF-8
            // sequence that vte ends at the run's first byte: parse that byte.
            let before_non_ascii =
                if run_start > start { !data[run_start - 1].is_ascii() } else { start == 0 && self.utf8_pending };
            let run = PlainRun {
                start: run_start + usize::from(before_non_ascii),
                split: run_start + split,
                last_printable: last_printable.map(|at| run_start + at),
            };
            skipped += self.skip(parser, data, &run, fed);
        }
        skipped
    }

    /// Replaces `data[run.start..=run.split]` with its synthetic equivalent
    /// when every condition holds; returns the bytes not parsed.
    fn skip(&mut self, parser: &mut Parser, data: &[u8], run: &PlainRun, fed: &mut usize) -> usize {
        // The rest of the run must print, or vt100's last printed character
        // (for `CSI b`) would be the skipped text's.
        if run.split < run.start || run.last_printable.is_none_or(|at| at < run.split) {
            return 0;
        }
        parser.process(&data[*fed..run.start]);
        *fed = run.start;
        let screen = parser.screen();
        if self.region(screen.alternate_screen()) != Region::Full {
            return 0;
        }
        let (rows, cols) = screen.size();
        let (rows, cols) = (usize::from(rows.get()), usize::from(cols.get()));
        let (row, col) = screen.cursor_position();
        let (advances, col) = cursor_walk(&data[run.start..=run.split], usize::from(col), cols);
        let bottom = rows - 1;
        let row = usize::from(row);
        // The split LF must have scrolled (so the cursor is on a fresh bottom
        // row) and must not leave a pending wrap (which CHA cannot set).
        if row + advances <= bottom || col >= cols {
            return 0;
        }
        self.synthetic.clear();
        self.synthetic.push(b'\r');
        self.synthetic.resize(1 + bottom - row, b'\n');
        let scrolls = row + advances - bottom;
        // Any count from `rows` up blanks the screen; the main grid's count
        // is kept up to COUNTED_LINES (module docs), the alternate grid has
        // none.
        let mut scrolls = if screen.alternate_screen() {
            scrolls.min(rows)
        } else {
            let lines = scrolls.min(rows.max(COUNTED_LINES.saturating_sub(self.counted)));
            self.counted += lines;
            lines
        };
        // vt100 scrolls at most a region's height per `CSI n S`.
        while scrolls > 0 {
            let lines = scrolls.min(rows);
            push_csi(&mut self.synthetic, lines, b'S');
            scrolls -= lines;
        }
        if col > 0 {
            push_csi(&mut self.synthetic, col + 1, b'G');
        }
        parser.process(&self.synthetic);
        *fed = run.split + 1;
        run.split + 1 - run.start
    }
}

/// Printable ASCII, tab, CR or LF; written without branches (`|`, not
/// `||`) so that [`plain_prefix_len`] vectorises.
fn is_plain(byte: u8) -> bool {
    (byte.wrapping_sub(0x20) < 0x5f) | (byte == b'\t') | (byte == b'\n') | (byte == b'\r')
}

/// How many bytes at the start of `bytes` are plain. Whole blocks are
/// checked without an early exit, which the compiler turns into vector
/// compares (a byte at a time, this scan was most of the skip's own cost
/// under `cat`); the block holding the first other byte is then walked.
fn plain_prefix_len(bytes: &[u8]) -> usize {
    const BLOCK: usize = 32;
    let mut at = 0;
    for block in bytes.chunks_exact(BLOCK) {
        let mut other = 0u8;
        for &byte in block {
            other |= u8::from(!is_plain(byte));
        }
        if other != 0 {
            break;
        }
        at += BLOCK;
    }
    at + bytes[at..].iter().position(|&byte| !is_plain(byte)).unwrap_or(bytes.len() - at)
}

/// Whether vt100's DECSTBM with these parameters leaves the whole screen
/// as the region (`Grid::set_scroll_region`: an empty or inverted region
/// resets it).
fn decstbm_region(params: &[u16], rows: u16) -> Region {
    let param = |at: usize| params.get(at).copied().unwrap_or(0);
    let top = param(0).max(1) - 1;
    let bottom = match param(1) {
        0 => rows,
        bottom => bottom,
    };
    let bottom = (bottom - 1).min(rows - 1);
    if top >= bottom || (top == 0 && bottom == rows - 1) {
        Region::Full
    } else {
        Region::Rows(top, bottom)
    }
}

/// Follows the cursor through plain text from column `col` the way vt100
/// moves it (width-1 characters, tab stops every 8, a pending wrap at
/// `col == cols`): the number of row advances (LFs and wraps) and the
/// column it ends in. Stretches of printable characters between the
/// control bytes are taken whole: `n` of them from column `c` wrap
/// `(c + n - 1) / cols` times.
fn cursor_walk(text: &[u8], mut col: usize, cols: usize) -> (usize, usize) {
    let mut advances = 0;
    let mut at = 0;
    loop {
        let control = memchr::memchr3(b'\n', b'\r', b'\t', &text[at..]).map_or(text.len(), |found| at + found);
        let printed = control - at;
        if printed > 0 {
            let wraps = (col + printed - 1) / cols;
            advances += wraps;
            col = col + printed - wraps * cols;
        }
        match text.get(control) {
            Some(b'\n') => advances += 1,
            Some(b'\r') => col = 0,
            Some(_) => col = (col - col % 8 + 8).min(cols - 1),
            None => return (advances, col),
        }
        at = control + 1;
    }
}

fn push_csi(out: &mut Vec<u8>, param: usize, final_byte: u8) {
    out.extend_from_slice(b"\x1b[");
    out.extend_from_slice(param.to_string().as_bytes());
    out.push(final_byte);
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU16;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn size(n: u16) -> NonZeroU16 {
        NonZeroU16::new(n).expect("non-zero")
    }

    /// vt100's whole state: both grids (cells, wrap flags, cursor, saved
    /// cursor, scroll region, origin mode, the count of scrolled lines),
    /// attributes, modes and the last printed character.
    fn state(parser: &Parser) -> String {
        format!("{:?}", parser.screen())
    }

    /// The main grid's count of scrolled lines, read from the state.
    fn scrolled_count(parser: &Parser) -> usize {
        let state = state(parser);
        let (_, after) = state.split_once("unbounded_len: ").expect("the main grid counts");
        after[..after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len())].parse().expect("a count")
    }

    /// The state with the count of scrolled lines left out.
    fn state_but_count(parser: &Parser) -> String {
        let count = format!("unbounded_len: {}", scrolled_count(parser));
        state(parser).replacen(&count, "unbounded_len: _", 1)
    }

    /// A plain parser and one fed through `ScrollSkip`, side by side.
    struct Pair {
        plain: Parser,
        skipping: Parser,
        skip: ScrollSkip,
        fed: usize,
        skipped: usize,
    }

    impl Pair {
        fn new(rows: u16, cols: u16) -> Self {
            Self {
                plain: Parser::new(size(rows), size(cols), 0),
                skipping: Parser::new(size(rows), size(cols), 0),
                skip: ScrollSkip::default(),
                fed: 0,
                skipped: 0,
            }
        }

        fn feed(&mut self, chunk: &[u8]) {
            self.plain.process(chunk);
            self.skipped += self.skip.process(&mut self.skipping, chunk);
            self.fed += chunk.len();
        }

        fn resize(&mut self, rows: u16, cols: u16) {
            self.plain.set_size(size(rows), size(cols));
            self.skip.resize(&mut self.skipping, size(rows), size(cols));
        }

        fn assert_same(&mut self, context: &str) {
            self.skip.flush(&mut self.skipping);
            assert_eq!(state(&self.plain), state(&self.skipping), "{context}");
        }

        /// The same state but for the count of scrolled lines, which the
        /// skipping side keeps up to [`COUNTED_LINES`] (module docs).
        fn assert_same_but_count(&mut self, context: &str) {
            self.skip.flush(&mut self.skipping);
            assert_eq!(state_but_count(&self.plain), state_but_count(&self.skipping), "{context}");
        }
    }

    fn text_line(rng: &mut StdRng, cols: u16, out: &mut Vec<u8>) {
        const CHARS: &[u8] = b"abcdefghij XYZ 0123456789";
        let len = match rng.random_range(0..4) {
            0 => usize::from(cols),
            _ => rng.random_range(0..=usize::from(cols) * 2 + 2),
        };
        for _ in 0..len {
            match rng.random_range(0..40) {
                0 => out.push(b'\t'),
                1 => out.push(b'\r'),
                _ => out.push(CHARS[rng.random_range(0..CHARS.len())]),
            }
        }
        let end: &[u8] = match rng.random_range(0..20) {
            0..=11 => b"\r\n",
            12..=15 => b"\n",
            16 => b"\r",
            _ => b"",
        };
        out.extend_from_slice(end);
    }

    /// Enough lines to scroll a screen of `rows` several times, or a few.
    fn text_burst(rng: &mut StdRng, rows: u16, cols: u16, out: &mut Vec<u8>) {
        let lines = rng.random_range(0..=usize::from(rows) * 4 + 4);
        for _ in 0..lines {
            text_line(rng, cols, out);
        }
    }

    /// One random piece of terminal output: text, or a sequence or control
    /// byte that changes what text does (regions, grids, cursor, attributes,
    /// parser state), or a string sequence with text inside it.
    fn random_piece(rng: &mut StdRng, rows: u16, cols: u16, out: &mut Vec<u8>) {
        let n = |rng: &mut StdRng| rng.random_range(0..=rows + 2);
        let piece = match rng.random_range(0..40) {
            0..=11 => {
                text_burst(rng, rows, cols, out);
                return;
            }
            12 => format!("\x1b[{};{}r", n(rng), n(rng)),
            13 => "\x1b[r".to_owned(),
            14 => format!("\x1b[{}r", n(rng)),
            15 => format!("\x1b[;{}r", n(rng)),
            16 => ["\x1b[?1049h", "\x1b[?1049l", "\x1b[?47h", "\x1b[?47l", "\x1b[?25;1049h", "\x1b[?1049:1h"]
                [rng.random_range(0..6)]
            .to_owned(),
            17 => ["\x1bc", "\x1b\nc", "\x1b(c", "\x1b[?6h", "\x1b[?6l", "\x1b7", "\x1b8", "\x1bM"]
                [rng.random_range(0..8)]
            .to_owned(),
            18 => format!("\x1b[{}m", [0, 1, 7, 31, 42, 97, 104][rng.random_range(0..7)]),
            19 => format!("\x1b[{};{}H", n(rng), rng.random_range(0..=cols + 2)),
            20 => format!(
                "\x1b[{}{}",
                n(rng),
                ['A', 'B', 'C', 'D', 'G', 'd', 'b', 'L', 'M', 'S', 'T', 'X', '@', 'P'][rng.random_range(0..14)]
            ),
            21 => ["\x1b[J", "\x1b[2J", "\x1b[1J", "\x1b[K", "\x1b[1K", "\x1b[2K"][rng.random_range(0..6)].to_owned(),
            22 => ["é", "中", "e\u{301}", "\u{1f600}"][rng.random_range(0..4)].to_owned(),
            23 => {
                // Bytes that vte reads as broken or partial UTF-8, C1 and C0 controls.
                let bytes: &[&[u8]] =
                    &[b"\xc3", b"\xe4\xb8", b"\x9b", b"\x9c", b"\x08", b"\x07", b"\x0b", b"\x0c", b"\x00", b"\x7f"];
                out.extend_from_slice(bytes[rng.random_range(0..bytes.len())]);
                return;
            }
            24..=26 => {
                // String sequences whose contents look like text.
                let (open, close): (&[u8], &[u8]) = [
                    (&b"\x1b]0;"[..], &b"\x07"[..]),
                    (b"\x1b]2;", b"\x1b\\"),
                    (b"\x1bP1;2q", b"\x1b\\"),
                    (b"\x1bP$q", b"\x9c"),
                    (b"\x1b_", b"\x1b\\"),
                    (b"\x1bX", b"\x18"),
                    (b"\x1b[2;", b"3r"),
                    (b"\x1b[?1;", b"2h"),
                    (b"\x1b[1", b"\x1a"),
                ][rng.random_range(0..9)];
                out.extend_from_slice(open);
                text_burst(rng, rows, cols, out);
                out.extend_from_slice(close);
                return;
            }
            27 => format!("\x1b[{}\n;{}r", n(rng), n(rng)),
            28 => format!("\x1b[?{};{}r", n(rng), n(rng)),
            29 => format!("\x1b[{}:{}r", n(rng), n(rng)),
            30 => format!("\x1b[{} r", n(rng)),
            31 => format!("\x1b[1;{}r\x1b[?1049h\x1b[r", n(rng)),
            _ => {
                // Lines exactly as wide as the screen, ending in a bare LF:
                // the cursor waits in the pending-wrap column.
                for _ in 0..rng.random_range(1..=usize::from(rows) * 3) {
                    out.extend(std::iter::repeat_n(b'w', usize::from(cols)));
                    out.push(b'\n');
                }
                return;
            }
        };
        out.extend_from_slice(piece.as_bytes());
    }

    /// Feeds `stream` to both in random chunks, from single bytes to the
    /// whole of it, checking the cursor and text after each.
    fn feed_chunked(rng: &mut StdRng, pair: &mut Pair, stream: &[u8], case: u64) {
        let mut at = 0;
        while at < stream.len() {
            let left = stream.len() - at;
            let len = match rng.random_range(0..4) {
                0 => rng.random_range(1..=left.min(8)),
                1 => rng.random_range(1..=left.min(300)),
                _ => left,
            };
            pair.feed(&stream[at..at + len]);
            at += len;
            // A snapshot at this point (it parses what is held back).
            if rng.random_bool(0.7) {
                continue;
            }
            pair.skip.flush(&mut pair.skipping);
            assert_eq!(pair.plain.screen().cursor_position(), pair.skipping.screen().cursor_position(), "case {case}");
            assert_eq!(pair.plain.screen().contents(), pair.skipping.screen().contents(), "case {case}");
        }
    }

    /// The property: whatever the output and however it is cut into
    /// chunks, the skipping parser ends in exactly the plain parser's state.
    /// vt100's cursor, one byte at a time: what `cursor_walk` computes a
    /// stretch at a time.
    fn cursor_walk_byte_by_byte(text: &[u8], mut col: usize, cols: usize) -> (usize, usize) {
        let mut advances = 0;
        for &byte in text {
            match byte {
                b'\n' => advances += 1,
                b'\r' => col = 0,
                b'\t' => col = (col - col % 8 + 8).min(cols - 1),
                _ => {
                    if col >= cols {
                        col = 0;
                        advances += 1;
                    }
                    col += 1;
                }
            }
        }
        (advances, col)
    }

    #[test]
    fn the_plain_prefix_is_found_in_blocks_as_byte_by_byte() {
        let mut rng = StdRng::seed_from_u64(11);
        for case in 0..5_000 {
            let mut bytes: Vec<u8> =
                (0..rng.random_range(0..200)).map(|_| b"ab \t\r\n~"[rng.random_range(0..7)]).collect();
            if !bytes.is_empty() && rng.random_bool(0.7) {
                let at = rng.random_range(0..bytes.len());
                bytes[at] = [0x1b, 0x7f, 0x00, 0x1f, 0x80, 0xff][rng.random_range(0..6)];
            }
            let expected = bytes.iter().position(|&byte| !is_plain(byte)).unwrap_or(bytes.len());
            assert_eq!(plain_prefix_len(&bytes), expected, "case {case}: {bytes:?}");
        }
    }

    #[test]
    fn the_cursor_walk_matches_stepping_byte_by_byte() {
        let mut rng = StdRng::seed_from_u64(10);
        for case in 0..5_000 {
            let cols: u16 = rng.random_range(1..=100);
            let col = rng.random_range(0..=usize::from(cols));
            let mut text = Vec::new();
            for _ in 0..rng.random_range(0..6) {
                text_line(&mut rng, cols, &mut text);
            }
            let cols = usize::from(cols);
            assert_eq!(cursor_walk(&text, col, cols), cursor_walk_byte_by_byte(&text, col, cols), "case {case}");
        }
    }

    #[test]
    fn skipping_leaves_the_same_screen_as_parsing_everything() {
        const CASES: u64 = 3000;
        let (mut fed, mut skipped, mut cases_skipping) = (0, 0, 0);
        for case in 0..CASES {
            let mut rng = StdRng::seed_from_u64(case);
            let (mut rows, mut cols) = (rng.random_range(1..=8), rng.random_range(1..=20));
            let mut pair = Pair::new(rows, cols);
            let mut stream = Vec::new();
            for _ in 0..rng.random_range(1..=30) {
                if rng.random_range(0..10) == 0 {
                    feed_chunked(&mut rng, &mut pair, &stream, case);
                    stream.clear();
                    pair.assert_same(&format!("case {case} before a resize"));
                    if rng.random_bool(0.8) {
                        (rows, cols) = (rng.random_range(1..=8), rng.random_range(1..=20));
                    }
                    pair.resize(rows, cols);
                    pair.assert_same(&format!("case {case} after a resize"));
                } else {
                    random_piece(&mut rng, rows, cols, &mut stream);
                }
            }
            feed_chunked(&mut rng, &mut pair, &stream, case);
            pair.assert_same(&format!("case {case}"));
            // What follows may depend on state no snapshot shows: the last
            // printed character (`CSI b`) and the scrolled-line count that
            // a taller resize pulls rows back for.
            pair.feed(b"\x1b[3b");
            pair.resize(20, 25);
            pair.assert_same(&format!("case {case} after REP and a taller resize"));
            fed += pair.fed;
            skipped += pair.skipped;
            cases_skipping += usize::from(pair.skipped > 0);
        }
        println!("{CASES} cases: {fed} bytes, {skipped} skipped, {cases_skipping} cases with skips");
        assert!(cases_skipping > 1000 && skipped * 5 > fed, "too little was skipped to prove anything");
    }

    /// The case it is for: `cat` of a text file, 16 KiB reads on 80x24.
    #[test]
    fn cat_of_text_is_mostly_skipped() {
        let mut text = Vec::new();
        for line in 0..20_000 {
            text.extend_from_slice(
                format!("{line:010} the quick brown fox jumps over the lazy dog 0123456789\r\n").as_bytes(),
            );
        }
        let mut pair = Pair::new(24, 80);
        for chunk in text.chunks(16 * 1024) {
            pair.feed(chunk);
        }
        pair.assert_same_but_count("cat");
        assert!(pair.skipped * 100 > pair.fed * 95, "skipped {} of {}", pair.skipped, pair.fed);
        assert!(pair
            .skipping
            .screen()
            .contents()
            .ends_with("00019999 the quick brown fox jumps over the lazy dog 0123456789"));
    }

    /// `lines` numbered text lines, as a PTY renders them.
    fn numbered_lines(lines: std::ops::Range<usize>) -> Vec<u8> {
        let mut text = Vec::new();
        for line in lines {
            text.extend_from_slice(format!("{line:010} the quick brown fox\r\n").as_bytes());
        }
        text
    }

    /// The count of scrolled lines costs a row reset per line, so once a
    /// long `cat` has COUNTED_LINES of them counted, a chunk adds at most
    /// two screens (the synthetic scroll and the lines parsed after it)
    /// instead of all its lines; everything else is as after a full parse.
    #[test]
    fn a_long_cat_counts_a_bounded_number_of_scrolled_lines() {
        let mut pair = Pair::new(24, 80);
        let text = numbered_lines(0..30_000);
        let chunks = text.chunks(16 * 1024).len();
        for chunk in text.chunks(16 * 1024) {
            pair.feed(chunk);
        }
        pair.assert_same_but_count("cat");
        assert_eq!(scrolled_count(&pair.plain), 30_000 - 23);
        let counted = scrolled_count(&pair.skipping);
        assert!(
            (COUNTED_LINES..=COUNTED_LINES + 2 * 24 * chunks).contains(&counted),
            "counted {counted} in {chunks} chunks"
        );
    }

    /// What the count is read for, a taller screen (blank rows come in at
    /// the top), reads as after a full parse through resizes that take up
    /// to COUNTED_LINES rows from it; the count is topped up by the next
    /// skip, and `CSI 3 J` and a full reset, which zero it, are followed.
    #[test]
    fn a_taller_screen_after_a_long_cat_reads_as_after_a_full_parse() {
        let mut pair = Pair::new(24, 80);
        pair.feed(&numbered_lines(0..30_000));
        grow_cycles(&mut pair, "after a cat");
        pair.feed(&numbered_lines(30_000..45_000));
        grow_cycles(&mut pair, "after the top-up");
        // Each right after a long cat, when the count is at its highest.
        for (reset, what) in [(&b"\x1b[3J"[..], "CSI 3 J"), (b"\x1bc", "a full reset")] {
            pair.feed(&numbered_lines(0..30_000));
            pair.feed(reset);
            pair.assert_same(&format!("{what} zeroes both counts"));
            pair.feed(&numbered_lines(0..30_000));
            grow_cycles(&mut pair, &format!("after {what} and a cat"));
        }
    }

    /// Grows a 24-row screen to 1,000 rows and back, with the cursor home
    /// before each shrink so the rows go uncounted: each grow takes 976
    /// rows from the count, COUNTED_LINES in all.
    fn grow_cycles(pair: &mut Pair, context: &str) {
        for cycle in 0..(COUNTED_LINES / 976) {
            pair.resize(1000, 80);
            pair.assert_same_but_count(&format!("{context}: grow {cycle}"));
            pair.feed(b"\x1b[H");
            pair.resize(24, 80);
            pair.assert_same_but_count(&format!("{context}: shrink {cycle}"));
        }
    }

    /// vt100 0.18.1 resets a grid's region to the whole new screen on a
    /// resize (growing too), so skipping may go on after one.
    #[test]
    fn a_resize_makes_the_region_full() {
        let burst: Vec<u8> = b"line\r\n".repeat(50);
        let mut pair = Pair::new(5, 20);
        pair.feed(b"\x1b[2;3r");
        pair.resize(9, 20);
        assert!(state(&pair.plain).contains("scroll_top: 0, scroll_bottom: 8,"), "{}", state(&pair.plain));
        pair.feed(&burst);
        assert!(pair.skipped > 0);
        pair.assert_same("after a resize");
    }

    /// The region it tracks is vt100's own, set, reset and per grid.
    #[test]
    fn the_tracked_region_is_vt100s() {
        let mut pair = Pair::new(10, 20);
        let check = |pair: &Pair, alternate: bool, top: u16, bottom: u16| {
            let expected = if (top, bottom) == (0, 9) { Region::Full } else { Region::Rows(top, bottom) };
            assert_eq!(pair.skip.region(alternate), expected);
            if pair.plain.screen().alternate_screen() == alternate {
                let needle = format!("scroll_top: {top}, scroll_bottom: {bottom},");
                assert!(state(&pair.plain).contains(&needle), "{needle}: {}", state(&pair.plain));
            }
        };
        pair.feed(b"\x1b[3;7r");
        check(&pair, false, 2, 6);
        pair.feed(b"\x1b[5r");
        check(&pair, false, 4, 9);
        pair.feed(b"\x1b[?1049h\x1b[2;4r");
        check(&pair, true, 1, 3);
        check(&pair, false, 4, 9);
        pair.feed(b"\x1b[?1049l\x1b[6;6r");
        check(&pair, false, 0, 9);
        pair.feed(b"\x1b[2;99r");
        check(&pair, false, 1, 9);
        pair.feed(b"\x1bc");
        check(&pair, false, 0, 9);
    }

    /// Text after a partial region is parsed in full until the region is
    /// the whole screen again.
    #[test]
    fn a_partial_scroll_region_turns_skipping_off() {
        let burst: Vec<u8> = b"line\r\n".repeat(50);
        let mut pair = Pair::new(5, 20);
        pair.feed(b"\x1b[2;4r");
        pair.feed(&burst);
        assert_eq!(pair.skipped, 0);
        pair.feed(b"\x1b[?1049h");
        pair.feed(&burst);
        assert!(pair.skipped > 0, "the alternate grid's region is its own");
        pair.feed(b"\x1b[?1049l");
        let before = pair.skipped;
        pair.feed(&burst);
        assert_eq!(pair.skipped, before, "the main grid's region is still partial");
        pair.feed(b"\x1b[r");
        pair.feed(&burst);
        assert!(pair.skipped > before);
        pair.assert_same("regions");
    }
}
