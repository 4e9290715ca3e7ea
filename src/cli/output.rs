//! Output for people: aligned tables, relative times, and colours only on a
//! terminal (never with `NO_COLOR` set, https://no-color.org).

use std::io::{self, IsTerminal, Write};

use chrono::{DateTime, Utc};
use serde_json::Value;

/// A few states worth a colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Plain,
    Good,
    Bad,
    Waiting,
    Faint,
}

impl Tone {
    /// The tone of a host, terminal or run state.
    pub fn of_state(state: &str) -> Tone {
        match state {
            "online" | "running" | "succeeded" => Tone::Good,
            "offline" | "error" | "failed" | "lost" => Tone::Bad,
            "pending" | "launching" | "queued" | "dispatched" => Tone::Waiting,
            "exited" => Tone::Faint,
            _ => Tone::Plain,
        }
    }

    fn sgr(self) -> Option<&'static str> {
        match self {
            Tone::Plain => None,
            Tone::Good => Some("32"),
            Tone::Bad => Some("31"),
            Tone::Waiting => Some("33"),
            Tone::Faint => Some("2"),
        }
    }
}

/// `text` with its control characters escaped as Rust writes them.
fn escape_controls(text: String) -> String {
    if !text.chars().any(char::is_control) {
        return text;
    }
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// Whether stdout gets colours.
pub fn colours_on_stdout() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && io::stdout().is_terminal()
}

/// A table printed with every column as wide as its widest cell.
/// The widest a cell of any column but the last is shown: a longer one (a
/// title of 256 characters, a long command line) ends in `…`, so one row
/// does not widen every other; `--json` has the whole text.
const MAX_CELL: usize = 48;

pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<(String, Tone)>>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Self {
        Self { headers: headers.to_vec(), rows: Vec::new() }
    }

    /// Adds a row. Control characters in a cell (a command's argv may
    /// hold newlines or escape sequences) are shown escaped (`\n`,
    /// `\u{1b}`), so a cell neither breaks the table nor drives the
    /// reader's terminal; a cell of any column but the last is cut to
    /// [`MAX_CELL`] characters.
    pub fn row(&mut self, cells: Vec<(String, Tone)>) {
        let last = cells.len().saturating_sub(1);
        let cell = |(i, (text, tone)): (usize, (String, Tone))| {
            let text = escape_controls(text);
            let text = match text.chars().nth(MAX_CELL) {
                Some(_) if i < last => text.chars().take(MAX_CELL - 1).chain(['…']).collect(),
                _ => text,
            };
            (text, tone)
        };
        self.rows.push(cells.into_iter().enumerate().map(cell).collect());
    }

    pub fn render(&self, colour: bool) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, (text, _)) in row.iter().enumerate() {
                widths[i] = widths[i].max(text.chars().count());
            }
        }
        let mut out = String::new();
        let header: Vec<(String, Tone)> = self.headers.iter().map(|h| (h.to_string(), Tone::Plain)).collect();
        for (n, row) in std::iter::once(&header).chain(&self.rows).enumerate() {
            let mut line = String::new();
            for (i, (text, tone)) in row.iter().enumerate() {
                let last = i + 1 == row.len();
                let pad = if last { 0 } else { widths[i] - text.chars().count() + 2 };
                match tone.sgr().filter(|_| colour) {
                    Some(sgr) => line.push_str(&format!("\x1b[{sgr}m{text}\x1b[0m")),
                    None if n == 0 && colour => line.push_str(&format!("\x1b[1m{text}\x1b[0m")),
                    None => line.push_str(text),
                }
                line.push_str(&" ".repeat(pad));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    pub fn print(&self) {
        print_stdout(&self.render(colours_on_stdout()));
    }
}

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a message.
pub fn print_stdout(text: &str) {
    let mut stdout = io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush());
}

/// Pretty JSON on stdout.
pub fn print_json(value: &Value) {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    print_stdout(&format!("{text}\n"));
}

/// `--json` (the list as the API wraps it) or `--quiet` (ids); `false`
/// when neither was asked for and the caller prints its table.
pub fn print_list<T: serde::Serialize>(
    format: super::Format,
    key: &str,
    items: &[T],
    id: impl Fn(&T) -> uuid::Uuid,
) -> bool {
    if format.json {
        print_json(&serde_json::json!({ key: items }));
    } else if format.quiet {
        print_stdout(&items.iter().map(|item| format!("{}\n", id(item))).collect::<String>());
    } else {
        return false;
    }
    true
}

/// `--json` (the resource as the API wraps it, `{"terminal":{...}}`) or
/// `--quiet` (its id); `false` when neither was asked for.
pub fn print_one<T: serde::Serialize>(format: super::Format, key: &str, item: &T, id: uuid::Uuid) -> bool {
    if format.json {
        print_json(&serde_json::json!({ key: item }));
    } else if format.quiet {
        print_stdout(&format!("{id}\n"));
    } else {
        return false;
    }
    true
}

/// "5s ago", "3m ago", "2h ago", "4d ago", a date beyond a month; "-" for none.
pub fn relative_time(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    let Some(at) = at else { return "-".to_owned() };
    let seconds = (now - at).num_seconds();
    match seconds {
        s if s < 0 => "just now".to_owned(),
        s if s < 60 => format!("{s}s ago"),
        s if s < 3600 => format!("{}m ago", s / 60),
        s if s < 86_400 => format!("{}h ago", s / 3600),
        s if s < 30 * 86_400 => format!("{}d ago", s / 86_400),
        _ => at.format("%Y-%m-%d").to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_colour_only_when_asked() {
        let mut table = Table::new(&["NAME", "STATE"]);
        table.row(vec![("laptop".into(), Tone::Plain), ("online".into(), Tone::Good)]);
        table.row(vec![("a".into(), Tone::Plain), ("offline".into(), Tone::Bad)]);
        assert_eq!(table.render(false), "NAME    STATE\nlaptop  online\na       offline\n");
        let coloured = table.render(true);
        assert!(coloured.contains("\x1b[32monline\x1b[0m"), "{coloured:?}");
    }

    #[test]
    fn control_characters_in_a_cell_are_shown_escaped() {
        let mut table = Table::new(&["COMMAND", "STATE"]);
        table.row(vec![("echo \x1b[31mred\nnext\t".into(), Tone::Plain), ("queued".into(), Tone::Plain)]);
        assert_eq!(table.render(false), "COMMAND                     STATE\necho \\u{1b}[31mred\\nnext\\t  queued\n");
    }

    #[test]
    fn a_long_cell_is_cut_unless_it_is_the_last() {
        let mut table = Table::new(&["TITLE", "COMMAND"]);
        table.row(vec![("t".repeat(300), Tone::Plain), ("c".repeat(300), Tone::Plain)]);
        table.row(vec![("t".repeat(MAX_CELL), Tone::Plain), ("short".into(), Tone::Plain)]);
        let shown = table.render(false);
        let lines: Vec<&str> = shown.lines().collect();
        assert_eq!(lines[1], format!("{}…  {}", "t".repeat(MAX_CELL - 1), "c".repeat(300)));
        assert_eq!(lines[2], format!("{}  short", "t".repeat(MAX_CELL)), "a cell that fits is whole");
    }

    #[test]
    fn times_are_relative() {
        let now = Utc::now();
        assert_eq!(relative_time(None, now), "-");
        assert_eq!(relative_time(Some(now - chrono::Duration::seconds(5)), now), "5s ago");
        assert_eq!(relative_time(Some(now - chrono::Duration::minutes(3)), now), "3m ago");
        assert_eq!(relative_time(Some(now - chrono::Duration::hours(2)), now), "2h ago");
        assert_eq!(relative_time(Some(now - chrono::Duration::days(4)), now), "4d ago");
        assert_eq!(relative_time(Some(now + chrono::Duration::seconds(2)), now), "just now");
    }
}
