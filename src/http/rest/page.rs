//! List pagination (docs/REST.md, "Lists"): `?limit=` (default 500, at
//! most 5000) and `?after=<cursor>`; a page with more behind it carries
//! `nextCursor`, the cursor of its last item.
//!
//! A cursor names an item by its creation time and id
//! (`<microseconds>.<uuid>`). Lists are in creation order, so the next page
//! starts after that item, or, when it was deleted in between, after the
//! last item created no later than it: deletions never make a page skip
//! or repeat an item that is still there.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::http::error::ApiError;

pub const DEFAULT_LIMIT: usize = 500;
pub const MAX_LIMIT: usize = 5000;

/// The pagination parameters of a list request.
#[derive(Debug, Default, Deserialize)]
pub struct PageQuery {
    limit: Option<String>,
    after: Option<String>,
}

/// Where an item sits in a list: its creation time and id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub created_at: DateTime<Utc>,
    pub id: Uuid,
}

impl Position {
    fn cursor(self) -> String {
        format!("{}.{}", self.created_at.timestamp_micros(), self.id)
    }

    fn parse(cursor: &str) -> Option<Self> {
        let (micros, id) = cursor.split_once('.')?;
        let created_at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
        Some(Self { created_at, id: Uuid::parse_str(id).ok()? })
    }
}

impl PageQuery {
    /// The page of `items` (in creation order) this query asks for, as
    /// `{key: [...], "nextCursor"?: ...}`.
    pub fn page<T: serde::Serialize>(
        &self,
        items: Vec<T>,
        key: &str,
        position: impl Fn(&T) -> Position,
    ) -> Result<Value, ApiError> {
        let limit = match self.limit.as_deref() {
            None => DEFAULT_LIMIT,
            Some(text) => text.parse::<usize>().ok().filter(|n| (1..=MAX_LIMIT).contains(n)).ok_or_else(|| {
                ApiError::bad_request("bad_limit", format!("`limit` must be a number from 1 to {MAX_LIMIT}"))
            })?,
        };
        let start = match self.after.as_deref() {
            None => 0,
            Some(cursor) => {
                let after = Position::parse(cursor).ok_or_else(|| {
                    ApiError::bad_request("bad_cursor", "`after` must be a `nextCursor` from this list")
                })?;
                match items.iter().position(|item| position(item).id == after.id) {
                    Some(i) => i + 1,
                    None => items.iter().take_while(|item| position(item).created_at <= after.created_at).count(),
                }
            }
        };
        let mut items = items;
        let mut rest = items.split_off(start.min(items.len()));
        let more = rest.len() > limit;
        rest.truncate(limit);
        let next = rest.last().filter(|_| more).map(|last| position(last).cursor());
        let mut body = json!({ key: rest });
        if let Some(next) = next {
            body["nextCursor"] = Value::from(next);
        }
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(n: i64) -> Position {
        Position { created_at: DateTime::from_timestamp_micros(n * 1000).unwrap(), id: Uuid::from_u128(n as u128) }
    }

    fn query(limit: Option<&str>, after: Option<String>) -> PageQuery {
        PageQuery { limit: limit.map(str::to_owned), after }
    }

    fn ids(body: &Value) -> Vec<i64> {
        body["items"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect()
    }

    #[test]
    fn pages_follow_each_other_and_the_last_has_no_cursor() {
        let items: Vec<i64> = (1..=5).collect();
        let first = query(Some("2"), None).page(items.clone(), "items", |n| at(*n)).unwrap();
        assert_eq!(ids(&first), [1, 2]);
        let cursor = first["nextCursor"].as_str().unwrap().to_owned();
        let second = query(Some("2"), Some(cursor)).page(items.clone(), "items", |n| at(*n)).unwrap();
        assert_eq!(ids(&second), [3, 4]);
        let cursor = second["nextCursor"].as_str().unwrap().to_owned();
        let last = query(Some("2"), Some(cursor)).page(items.clone(), "items", |n| at(*n)).unwrap();
        assert_eq!(ids(&last), [5]);
        assert!(last.get("nextCursor").is_none());
        let exact = query(Some("5"), None).page(items, "items", |n| at(*n)).unwrap();
        assert!(exact.get("nextCursor").is_none(), "a full last page has nothing behind it");
    }

    #[test]
    fn a_deleted_cursor_item_neither_skips_nor_repeats() {
        let items: Vec<i64> = vec![1, 2, 4, 5];
        let page = query(Some("2"), Some(at(3).cursor())).page(items, "items", |n| at(*n)).unwrap();
        assert_eq!(ids(&page), [4, 5]);
    }

    #[test]
    fn bad_limits_and_cursors_are_refused() {
        for limit in ["0", "5001", "ten", "-1"] {
            let err = query(Some(limit), None).page(vec![1i64], "items", |n| at(*n)).unwrap_err();
            assert_eq!(err.code, "bad_limit", "{limit}");
        }
        for cursor in ["x", "12.not-a-uuid", ""] {
            let err = query(None, Some(cursor.into())).page(vec![1i64], "items", |n| at(*n)).unwrap_err();
            assert_eq!(err.code, "bad_cursor", "{cursor}");
        }
    }
}
