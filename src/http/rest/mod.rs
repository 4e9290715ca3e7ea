//! The REST API under `/api/v1` (docs/REST.md): hosts, terminals, runs and
//! tokens; the routes and who may call them are `super::routes`. Handlers
//! validate input, scope every read and write to the caller's user, and
//! answer errors in the shape of `http::error`.

pub mod assign;
pub mod audit;
pub mod cell_seats;
pub mod cells;
pub mod hosts;
mod page;
pub mod runs;
pub mod terminals;
pub mod tokens;

use std::collections::HashSet;

use actix_web::http::StatusCode;
use uuid::Uuid;

use super::error::ApiError;
use super::state::AppState;
use crate::relay::requests::{deliver, HostOp, OpAnswer};
use crate::relay::RequestError;
use crate::store::host_lease_key;

/// A resource id from the path; a malformed id names nothing, so 404.
fn path_id(raw: &str, what: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::not_found(what))
}

/// A resource id from a body or query field; malformed is bad input.
fn field_id(raw: &str, field: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::bad_request("invalid_id", format!("`{field}` is not a valid id")))
}

/// Which of `hosts` are online: their lease is live (docs/CLUSTER.md,
/// "Ownership: the host lease").
async fn online_hosts(state: &AppState, hosts: &[Uuid]) -> Result<HashSet<Uuid>, ApiError> {
    let keys: Vec<String> = hosts.iter().map(|h| host_lease_key(*h)).collect();
    let live = state.store.lease_holders(&keys).await?;
    let live: HashSet<&str> = live.iter().map(|(k, _)| k.as_str()).collect();
    Ok(hosts.iter().copied().filter(|h| live.contains(host_lease_key(*h).as_str())).collect())
}

/// Maps a daemon request failure to the REST statuses (docs/REST.md,
/// "Daemon requests").
fn request_error(err: RequestError) -> ApiError {
    match err {
        RequestError::Offline => ApiError::conflict("host_offline", "the host is offline"),
        RequestError::Timeout => {
            ApiError::new(StatusCode::GATEWAY_TIMEOUT, "daemon_timeout", "the daemon did not answer in time")
        }
        RequestError::Unacknowledged => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "daemon_timeout",
            "the instance holding the host did not acknowledge the request in time; it may still be carried out",
        ),
        RequestError::BusAway => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "daemon_timeout",
            "the instance holding the host cannot be reached (the bus is away); the request was not sent",
        ),
        RequestError::Unheard => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "daemon_timeout",
            "the instance holding the host is not listening now (it may be subscribing again); the request was not sent",
        ),
        RequestError::Refused(message) => ApiError::new(StatusCode::BAD_GATEWAY, "daemon_refused", message),
        RequestError::Unsupported => {
            ApiError::new(StatusCode::BAD_GATEWAY, "daemon_unsupported", "the daemon does not support this")
        }
        RequestError::EncryptionNotConfigured => {
            ApiError::conflict("encryption_not_configured", "set encryption.key to store host credentials")
        }
        RequestError::Busy => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_requests",
            "too many requests are waiting for this daemon's answers; retry later",
        ),
        RequestError::InputBacklog => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "input_backlog",
            "the daemon has not read the input it was sent; retry later",
        ),
        RequestError::Internal => ApiError::internal(),
    }
}

/// Runs an operation on the host's daemon, wherever it is connected.
async fn on_host(state: &AppState, host_id: Uuid, op: HostOp) -> Result<OpAnswer, ApiError> {
    deliver(&state.relay, host_id, op).await.map_err(request_error)
}

/// [`on_host`] for an operation the audit log records: `record` runs once
/// the operation was carried out or may have been (docs/REST.md, "Audit"),
/// so a request refused before it reached the daemon leaves no event.
async fn on_host_audited(
    state: &AppState,
    host_id: Uuid,
    op: HostOp,
    record: impl FnOnce(),
) -> Result<OpAnswer, ApiError> {
    let answer = deliver(&state.relay, host_id, op).await;
    if answer.as_ref().map_or_else(RequestError::may_have_run, |_| true) {
        record();
    }
    answer.map_err(request_error)
}

/// Checks a short free-text field.
fn check_text(field: &str, value: &str, max: usize, required: bool) -> Result<(), ApiError> {
    if required && value.trim().is_empty() {
        return Err(ApiError::bad_request("missing_field", format!("`{field}` must not be empty")));
    }
    if value.chars().count() > max {
        return Err(ApiError::bad_request("field_too_long", format!("`{field}` is longer than {max} characters")));
    }
    if value.chars().any(char::is_control) {
        return Err(ApiError::bad_request("invalid_field", format!("`{field}` contains control characters")));
    }
    Ok(())
}

/// Limits on a command line given to a terminal or run (docs/REST.md,
/// "Terminals"): entries, bytes of one entry, and bytes in all. Linux takes
/// far more, but a command line this long is not typed by a person, and
/// each Spawn frame and terminal row carries it.
pub const MAX_ARGS: usize = 256;
pub const MAX_ARG_BYTES: usize = 8192;
pub const MAX_ARGV_BYTES: usize = 65536;

fn check_argv(argv: &[String]) -> Result<(), ApiError> {
    let refuse = |message: String| Err(ApiError::bad_request("invalid_argv", message));
    if argv.len() > MAX_ARGS {
        return refuse(format!("`argv` has {} entries, more than {MAX_ARGS}", argv.len()));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return refuse("`argv` entries must not contain NUL".into());
    }
    if argv.first().is_some_and(|program| program.trim().is_empty()) {
        return refuse("`argv[0]`, the program, must not be empty".into());
    }
    if let Some(long) = argv.iter().find(|a| a.len() > MAX_ARG_BYTES) {
        return refuse(format!("an `argv` entry has {} bytes, more than {MAX_ARG_BYTES}", long.len()));
    }
    let total: usize = argv.iter().map(String::len).sum();
    if total > MAX_ARGV_BYTES {
        return refuse(format!("`argv` has {total} bytes in all, more than {MAX_ARGV_BYTES}"));
    }
    Ok(())
}

/// Checks a working directory against the host's allowlist (when the host
/// has reported one): the dir must be an allowed dir or inside one.
pub fn check_dir(dir: &str, allowed: &[String]) -> Result<(), ApiError> {
    if !dir.starts_with('/') || dir.contains('\0') || dir.split('/').any(|part| part == "..") {
        return Err(ApiError::bad_request("invalid_dir", "`dir` must be an absolute path without `..` or NUL"));
    }
    if allowed.is_empty() {
        return Ok(());
    }
    let inside = allowed.iter().any(|a| {
        let a = a.trim_end_matches('/');
        dir == a || a.is_empty() || dir.strip_prefix(a).is_some_and(|rest| rest.starts_with('/'))
    });
    if inside {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "dir_not_allowed",
            format!("`{dir}` is outside the host's allowed dirs: {}", allowed.join(", ")),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirs_must_be_inside_the_allowlist() {
        let allowed = vec!["/home/ann".to_string(), "/srv/".to_string()];
        assert!(check_dir("/home/ann", &allowed).is_ok());
        assert!(check_dir("/home/ann/src", &allowed).is_ok());
        assert!(check_dir("/srv/x", &allowed).is_ok());
        assert_eq!(check_dir("/home/annie", &allowed).unwrap_err().code, "dir_not_allowed");
        let refused = check_dir("/etc", &allowed).unwrap_err();
        assert_eq!(refused.code, "dir_not_allowed");
        assert!(refused.message.ends_with(&format!("allowed dirs: {}", allowed.join(", "))), "{}", refused.message);
        assert_eq!(check_dir("/home/ann/../bob", &allowed).unwrap_err().code, "invalid_dir");
        assert_eq!(check_dir("relative", &allowed).unwrap_err().code, "invalid_dir");
        assert!(check_dir("/anything", &[]).is_ok());
    }

    #[test]
    fn argv_is_capped_in_entries_entry_bytes_and_bytes_in_all() {
        let entries = |n: usize, len: usize| vec!["x".repeat(len); n];
        assert!(check_argv(&entries(MAX_ARGS, 1)).is_ok());
        assert!(check_argv(&entries(1, MAX_ARG_BYTES)).is_ok());
        assert!(check_argv(&entries(MAX_ARGV_BYTES / MAX_ARG_BYTES, MAX_ARG_BYTES)).is_ok());
        for (argv, says) in [
            (entries(MAX_ARGS + 1, 1), "257 entries"),
            (entries(1, MAX_ARG_BYTES + 1), "8193 bytes"),
            (entries(MAX_ARGV_BYTES / MAX_ARG_BYTES + 1, MAX_ARG_BYTES), "73728 bytes in all"),
            (vec!["a\0b".to_string()], "NUL"),
            (vec![String::new(), "x".to_string()], "the program"),
            (vec![" ".to_string()], "the program"),
        ] {
            let refused = check_argv(&argv).unwrap_err();
            assert_eq!((refused.status.as_u16(), refused.code), (400, "invalid_argv"));
            assert!(refused.message.contains(says), "{}", refused.message);
        }
    }
}
