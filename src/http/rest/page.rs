//! List pagination (docs/REST.md, "Lists"): `?limit=` (default 500, at
//! most 5000) and `?after=<cursor>`; a page with more behind it carries
//! `nextCursor`, the cursor of its last item.
//!
//! A cursor names an item by its creation time and id
//! (`<microseconds>.<uuid>`). Lists are in creation order, and the store
//! reads a page as the items after that position ([`PageAfter`]), so the
//! next page starts after that item, or, when it was deleted in between,
//! after where it was: deletions never make a page skip or repeat an item
//! that is still there, and a page costs its own rows, not the whole list.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::http::error::ApiError;
use crate::store::PageAfter;

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

/// A validated page request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pager {
    limit: usize,
    after: Option<Position>,
}

impl PageQuery {
    /// Checks `limit` and `after`.
    pub fn pager(&self) -> Result<Pager, ApiError> {
        let limit = match self.limit.as_deref() {
            None => DEFAULT_LIMIT,
            Some(text) => text.parse::<usize>().ok().filter(|n| (1..=MAX_LIMIT).contains(n)).ok_or_else(|| {
                ApiError::bad_request("bad_limit", format!("`limit` must be a number from 1 to {MAX_LIMIT}"))
            })?,
        };
        let after =
            match self.after.as_deref() {
                None => None,
                Some(cursor) => Some(Position::parse(cursor).ok_or_else(|| {
                    ApiError::bad_request("bad_cursor", "`after` must be a `nextCursor` from this list")
                })?),
            };
        Ok(Pager { limit, after })
    }
}

impl Pager {
    /// What to read from the store: one item more than asked, which tells
    /// whether another page follows.
    pub fn read(&self) -> PageAfter {
        PageAfter { after: self.after.map(|p| (p.created_at, p.id)), limit: self.limit + 1 }
    }

    /// The response `{key: [...], "nextCursor"?: ...}` for the items read
    /// with [`Pager::read`].
    pub fn body<T: serde::Serialize>(&self, mut items: Vec<T>, key: &str, position: impl Fn(&T) -> Position) -> Value {
        let more = items.len() > self.limit;
        items.truncate(self.limit);
        let next = items.last().filter(|_| more).map(|last| position(last).cursor());
        let mut body = json!({ key: items });
        if let Some(next) = next {
            body["nextCursor"] = Value::from(next);
        }
        body
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

    /// The store's side: the items after the position, at most `limit`.
    fn read(items: &[i64], page: PageAfter) -> Vec<i64> {
        let after = |n: &&i64| page.after.is_none_or(|(t, id)| (at(**n).created_at, at(**n).id) > (t, id));
        items.iter().filter(after).take(page.limit).copied().collect()
    }

    #[test]
    fn pages_follow_each_other_and_the_last_has_no_cursor() {
        let items: Vec<i64> = (1..=5).collect();
        let page = |limit, after| {
            let pager = query(limit, after).pager().unwrap();
            pager.body(read(&items, pager.read()), "items", |n| at(*n))
        };
        let first = page(Some("2"), None);
        assert_eq!(ids(&first), [1, 2]);
        let second = page(Some("2"), Some(first["nextCursor"].as_str().unwrap().to_owned()));
        assert_eq!(ids(&second), [3, 4]);
        let last = page(Some("2"), Some(second["nextCursor"].as_str().unwrap().to_owned()));
        assert_eq!(ids(&last), [5]);
        assert!(last.get("nextCursor").is_none());
        let exact = page(Some("5"), None);
        assert!(exact.get("nextCursor").is_none(), "a full last page has nothing behind it");
    }

    #[test]
    fn the_cursor_round_trips_and_one_more_is_read() {
        let pager = query(Some("7"), Some(at(3).cursor())).pager().unwrap();
        assert_eq!(pager.read(), PageAfter { after: Some((at(3).created_at, at(3).id)), limit: 8 });
        assert_eq!(query(None, None).pager().unwrap().read(), PageAfter::first(DEFAULT_LIMIT + 1));
    }

    #[test]
    fn bad_limits_and_cursors_are_refused() {
        for limit in ["0", "5001", "ten", "-1"] {
            let err = query(Some(limit), None).pager().unwrap_err();
            assert_eq!(err.code, "bad_limit", "{limit}");
        }
        for cursor in ["x", "12.not-a-uuid", ""] {
            let err = query(None, Some(cursor.into())).pager().unwrap_err();
            assert_eq!(err.code, "bad_cursor", "{cursor}");
        }
    }
}
