//! From what a person types to one resource: a host by its name or an id
//! prefix, a terminal or run by an id prefix (docs/CLI.md, "Names and id
//! prefixes"). Ids are UUIDs; a prefix may be typed with or without the
//! dashes, in either case.
//!
//! Plain functions over lists, so the rules are unit-tested without a server.

use uuid::Uuid;

use super::resources::{Host, Run, Terminal};

/// Why a name or prefix did not pick exactly one resource.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("no {kind} matches {query:?}{}", known_list(.known))]
    Unknown { kind: &'static str, query: String, known: Vec<String> },
    #[error("{query:?} matches {} {kind}s: {}; type more of the id", .candidates.len(), .candidates.join(", "))]
    Ambiguous { kind: &'static str, query: String, candidates: Vec<String> },
}

fn known_list(known: &[String]) -> String {
    if known.is_empty() {
        String::new()
    } else {
        format!(" (known: {})", known.join(", "))
    }
}

/// The id without dashes, lower case: what prefixes are compared against.
fn compact(id: &Uuid) -> String {
    id.simple().to_string()
}

/// A typed prefix in the same form, or `None` when it cannot be one.
fn compact_prefix(query: &str) -> Option<String> {
    let prefix: String = query.chars().filter(|c| *c != '-').collect::<String>().to_ascii_lowercase();
    (!prefix.is_empty() && prefix.chars().all(|c| c.is_ascii_hexdigit())).then_some(prefix)
}

/// The short form shown in tables: the first 8 hex digits.
pub fn short_id(id: &Uuid) -> String {
    compact(id)[..8].to_owned()
}

/// Items whose id starts with `query`.
fn by_prefix<'a, T>(items: &'a [T], id: impl Fn(&T) -> Uuid, query: &str) -> Vec<&'a T> {
    match compact_prefix(query) {
        Some(prefix) => items.iter().filter(|item| compact(&id(item)).starts_with(&prefix)).collect(),
        None => Vec::new(),
    }
}

/// A host by exact name first (names are what people type), else by id prefix.
pub fn host<'a>(hosts: &'a [Host], query: &str) -> Result<&'a Host, ResolveError> {
    let query = query.trim();
    let named: Vec<&Host> = hosts.iter().filter(|h| h.name == query).collect();
    let matches = if named.is_empty() { by_prefix(hosts, |h| h.id, query) } else { named };
    let describe = |h: &Host| format!("{} ({}, {})", short_id(&h.id), h.name, h.state);
    one(matches, "host", query, describe, || hosts.iter().map(|h| h.name.clone()).collect())
}

/// A terminal by id prefix.
pub fn terminal<'a>(terminals: &'a [Terminal], query: &str) -> Result<&'a Terminal, ResolveError> {
    let query = query.trim();
    let matches = by_prefix(terminals, |t| t.id, query);
    let describe = |t: &Terminal| format!("{} ({})", short_id(&t.id), t.state);
    one(matches, "terminal", query, describe, Vec::new)
}

/// A run by id prefix.
pub fn run<'a>(runs: &'a [Run], query: &str) -> Result<&'a Run, ResolveError> {
    let query = query.trim();
    let matches = by_prefix(runs, |r| r.id, query);
    let describe = |r: &Run| format!("{} ({} {})", short_id(&r.id), r.state, r.argv.join(" "));
    one(matches, "run", query, describe, Vec::new)
}

fn one<'a, T>(
    matches: Vec<&'a T>,
    kind: &'static str,
    query: &str,
    describe: impl Fn(&T) -> String,
    known: impl FnOnce() -> Vec<String>,
) -> Result<&'a T, ResolveError> {
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(ResolveError::Unknown { kind, query: query.to_owned(), known: known() }),
        many => Err(ResolveError::Ambiguous {
            kind,
            query: query.to_owned(),
            candidates: many.iter().map(|m| describe(m)).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_named(name: &str, id: &str) -> Host {
        serde_json::from_value(serde_json::json!({
            "id": id, "name": name, "hostname": name, "platform": "linux", "arch": "x86_64",
            "state": "online", "dirs": [], "lastSeenAt": null
        }))
        .unwrap()
    }

    #[test]
    fn hosts_by_name_then_by_prefix() {
        let hosts = vec![
            host_named("laptop", "aa11aa11-0000-4000-8000-000000000001"),
            host_named("desk", "aa22aa22-0000-4000-8000-000000000002"),
            host_named("bb", "bbbbbbbb-0000-4000-8000-000000000003"),
        ];
        assert_eq!(host(&hosts, "laptop").unwrap().name, "laptop");
        assert_eq!(host(&hosts, "AA1").unwrap().name, "laptop");
        assert_eq!(host(&hosts, "aa22aa22-0").unwrap().name, "desk");
        // A name wins over a prefix it also happens to be.
        assert_eq!(host(&hosts, "bb").unwrap().name, "bb");
        match host(&hosts, "aa").unwrap_err() {
            ResolveError::Ambiguous { candidates, .. } => {
                assert_eq!(candidates, vec!["aa11aa11 (laptop, online)", "aa22aa22 (desk, online)"])
            }
            other => panic!("{other}"),
        }
        let unknown = host(&hosts, "phone").unwrap_err();
        assert_eq!(unknown.to_string(), "no host matches \"phone\" (known: laptop, desk, bb)");
        assert!(matches!(host(&hosts, "").unwrap_err(), ResolveError::Unknown { .. }));
    }

    #[test]
    fn ambiguity_message_names_every_candidate() {
        let err = ResolveError::Ambiguous {
            kind: "terminal",
            query: "ab".into(),
            candidates: vec!["ab1".into(), "ab2".into()],
        };
        assert_eq!(err.to_string(), "\"ab\" matches 2 terminals: ab1, ab2; type more of the id");
    }

    #[test]
    fn short_ids_are_eight_hex_digits() {
        let id = Uuid::parse_str("0B9F6A7E-2F55-4C1E-9D7B-1C2D3E4F5A6B").unwrap();
        assert_eq!(short_id(&id), "0b9f6a7e");
        assert_eq!(compact_prefix("0b9f-6a"), Some("0b9f6a".into()));
        assert_eq!(compact_prefix("laptop"), None);
    }
}
