//! `--detach-key` of `tether attach` and `tether open` (docs/CLI.md): the
//! control key that leaves a terminal running instead of being typed into
//! it, `Ctrl-]` unless the program inside needs that one.

use std::fmt;

/// A control key, kept as the byte it sends and shown as `Ctrl-X`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetachKey(u8);

impl DetachKey {
    /// The byte the terminal sends for it.
    pub fn byte(self) -> u8 {
        self.0
    }

    /// Parses `ctrl-X`, `C-X` or `^X`, where X is a letter or one of
    /// `@ [ \ ] ^ _` (the keys a terminal sends as one control byte).
    pub fn parse(text: &str) -> Result<Self, String> {
        let lower = text.trim().to_ascii_lowercase();
        let key = ["ctrl-", "ctrl+", "c-", "^"].iter().find_map(|prefix| lower.strip_prefix(prefix));
        let mut chars = key.unwrap_or("").chars();
        match (chars.next(), chars.next()) {
            (Some(c @ ('a'..='z' | '@' | '[' | '\\' | ']' | '^' | '_')), None) => {
                Ok(Self(c.to_ascii_uppercase() as u8 & 0x1f))
            }
            _ => Err(format!(
                "{text:?} is not a control key: give ctrl-X (or C-X, ^X) with X a letter or one of @ [ \\ ] ^ _"
            )),
        }
    }
}

impl Default for DetachKey {
    fn default() -> Self {
        Self(crate::attach::DEFAULT_DETACH_KEY)
    }
}

impl fmt::Display for DetachKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = char::from(self.0 | 0x40);
        write!(f, "Ctrl-{}", key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_keys_parse_in_every_spelling_and_name_themselves() {
        for (text, byte, shown) in [
            ("ctrl-]", 0x1d, "Ctrl-]"),
            ("Ctrl-A", 0x01, "Ctrl-A"),
            ("c-q", 0x11, "Ctrl-Q"),
            ("^\\", 0x1c, "Ctrl-\\"),
            ("ctrl+_", 0x1f, "Ctrl-_"),
            ("^@", 0x00, "Ctrl-@"),
        ] {
            let key = DetachKey::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((key.byte(), key.to_string().as_str()), (byte, shown), "{text}");
        }
        assert_eq!(DetachKey::default().to_string(), "Ctrl-]");
    }

    #[test]
    fn other_keys_are_refused_with_the_forms_that_work() {
        for text in ["", "q", "ctrl-", "ctrl-ab", "ctrl-1", "alt-x", "ctrl-é"] {
            let error = DetachKey::parse(text).expect_err(text);
            assert!(error.contains("ctrl-X"), "{text}: {error}");
        }
    }
}
