//! JSON a peer sends (a REST body, a viewer's control message): how deep it
//! may nest, checked before any parser sees it, then parsed.
//!
//! serde_json limits the nesting of what it parses into values (at 128
//! levels), but skips a field the target type does not know without that
//! limit, so a REST body's unknown field could nest without end. [`parse`]
//! scans the bytes once first, in constant memory, and refuses anything
//! deeper than [`MAX_JSON_DEPTH`] the same way everywhere: REST `400
//! bad_json`, a viewer's `bad message` and close 1008.

use serde::de::DeserializeOwned;

/// Arrays and objects may nest this many levels; one more is refused (one
/// below serde_json's own limit, so the scan decides every case).
pub const MAX_JSON_DEPTH: usize = 127;

/// Why a peer's JSON was refused.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("JSON nested deeper than {MAX_JSON_DEPTH} levels (at byte {0})")]
    TooDeep(usize),
    #[error(transparent)]
    Parse(#[from] serde_json::Error),
}

/// Refuses bytes whose arrays and objects nest deeper than
/// [`MAX_JSON_DEPTH`]; brackets inside strings do not count. Anything else
/// that is wrong with the JSON is left to the parser.
pub fn check_depth(bytes: &[u8]) -> Result<(), JsonError> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (at, &byte) in bytes.iter().enumerate() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return Err(JsonError::TooDeep(at));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// Parses a peer's JSON into `T` after [`check_depth`].
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, JsonError> {
    check_depth(bytes)?;
    Ok(serde_json::from_slice(bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn nested(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[derive(Debug, serde::Deserialize)]
    struct Named {
        #[allow(dead_code)]
        name: String,
    }

    #[test]
    fn nesting_past_the_limit_is_refused_even_where_serde_would_skip_it() {
        assert!(parse::<Value>(nested(MAX_JSON_DEPTH).as_bytes()).is_ok());
        let refused = parse::<Value>(nested(MAX_JSON_DEPTH + 1).as_bytes()).unwrap_err();
        assert_eq!(refused.to_string(), format!("JSON nested deeper than {MAX_JSON_DEPTH} levels (at byte 127)"));
        // serde_json skips an unknown field without its depth limit.
        let skipped = format!(r#"{{"name": "x", "extra": {}}}"#, nested(100_000));
        assert!(serde_json::from_str::<Named>(&skipped).is_ok());
        assert!(matches!(parse::<Named>(skipped.as_bytes()), Err(JsonError::TooDeep(_))));
    }

    #[test]
    fn brackets_in_strings_do_not_count() {
        let text = format!(r#"{{"name": "{}\"{}"}}"#, "[".repeat(500), "{".repeat(500));
        assert!(parse::<Named>(text.as_bytes()).is_ok());
        let refused = parse::<Value>(b"{\"a\": }").unwrap_err();
        assert!(matches!(refused, JsonError::Parse(_)), "other errors are the parser's: {refused}");
    }
}
