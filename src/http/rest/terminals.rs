//! `/api/v1/terminals` (docs/REST.md, "Terminals"): create (inserted `pending`, claimed
//! `launching` by compare-and-set before Spawn is sent, or parked with
//! reason `host_offline`), list with filters, get, delete (409 while live),
//! and input, resize and kill for a running terminal (409 when its host is
//! offline).

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::page::{PageQuery, Position};
use super::{check_argv, check_dir, check_text, field_id, on_host_audited, path_id};
use crate::audit::Subject;
use crate::http::body::{null_is_default, Json, OptionalJson};
use crate::http::error::ApiError;
use crate::http::state::{AppState, AuthUser};
use crate::relay::requests::{deliver, HostOp, OpAnswer};
use crate::relay::RequestError;
use crate::store::{AuditAction, DeleteOutcome, NewTerminal, Terminal, TerminalCaps, TerminalFilter, TerminalState};

/// Grids are clamped to 1..=1000 everywhere (docs/PROTOCOL.md, "Client ->
/// server"); the API refuses
/// anything outside rather than guess.
pub const MAX_GRID: u16 = 1000;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateTerminal {
    host_id: String,
    #[serde(default)]
    dir: Option<String>,
    #[serde(default, deserialize_with = "null_is_default")]
    argv: Vec<String>,
    #[serde(default)]
    cols: Option<u32>,
    #[serde(default)]
    rows: Option<u32>,
    #[serde(default)]
    title: Option<String>,
}

fn grid(field: &str, value: Option<u32>, default: u16) -> Result<u16, ApiError> {
    match value {
        None => Ok(default),
        Some(v) if (1..=u32::from(MAX_GRID)).contains(&v) => Ok(v as u16),
        Some(_) => Err(ApiError::bad_request("invalid_grid", format!("`{field}` must be between 1 and {MAX_GRID}"))),
    }
}

impl CreateTerminal {
    /// The checks that need no store: the host id, the grid (defaults
    /// 80x24), argv and title. Returns the host id and the grid.
    pub fn check(&self) -> Result<(uuid::Uuid, u16, u16), ApiError> {
        let host_id = field_id(&self.host_id, "hostId")?;
        let cols = grid("cols", self.cols, 80)?;
        let rows = grid("rows", self.rows, 24)?;
        check_argv(&self.argv)?;
        if let Some(title) = &self.title {
            check_text("title", title, 256, false)?;
        }
        Ok((host_id, cols, rows))
    }

    /// The working directory asked for, if any (checked against the host's
    /// allowlist with `check_dir`).
    pub fn dir(&self) -> Option<&str> {
        self.dir.as_deref()
    }
}

pub async fn create(
    state: web::Data<AppState>,
    user: AuthUser,
    body: Json<CreateTerminal>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let (host_id, cols, rows) = body.check()?;
    let host = state.store.get_host(user.id(), host_id).await?.ok_or_else(|| ApiError::not_found("host"))?;
    if let Some(dir) = &body.dir {
        check_dir(dir, &host.dirs)?;
    }
    let terminal = state
        .store
        .insert_terminal(
            &NewTerminal {
                user_id: user.id(),
                host_id,
                title: body.title,
                dir: body.dir,
                argv: body.argv,
                cols,
                rows,
                run_id: None,
            },
            Some(TerminalCaps::of(&state.settings)),
        )
        .await?;
    state.relay.audit.record(
        user.id(),
        AuditAction::Spawn,
        Subject::terminal(host_id, terminal.id).by(user.0.token_id),
    );
    // Spawn at once through the host's owner, wherever it is; with the
    // host offline it stays parked (`pending`, `host_offline`) and is
    // spawned when the host connects. An unacknowledged spawn is never
    // re-sent: the row says what the owner did.
    let mut terminal = terminal;
    match deliver(&state.relay, host_id, HostOp::Spawn(terminal.id)).await {
        Ok(OpAnswer::Spawned(false)) | Err(RequestError::Offline) => {}
        Ok(_) | Err(_) => {
            terminal = state.store.get_terminal(user.id(), terminal.id).await?.unwrap_or(terminal);
        }
    }
    Ok(HttpResponse::Created().json(json!({ "terminal": terminal })))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    host_id: Option<String>,
    state: Option<String>,
    #[serde(flatten)]
    page: PageQuery,
}

pub async fn list(
    state: web::Data<AppState>,
    user: AuthUser,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let query = query.into_inner();
    let host_id = query.host_id.as_deref().map(|h| field_id(h, "hostId")).transpose()?;
    let terminal_state = query
        .state
        .as_deref()
        .map(|s| {
            s.parse::<TerminalState>().map_err(|_| {
                ApiError::bad_request("invalid_state", "`state` must be pending, launching, running, exited or error")
            })
        })
        .transpose()?;
    let pager = query.page.pager()?;
    let filter = TerminalFilter { host_id, state: terminal_state };
    let terminals = state.store.page_terminals(user.id(), &filter, &pager.read()).await?;
    let body = pager.body(terminals, "terminals", |t| Position { created_at: t.created_at, id: t.id });
    Ok(HttpResponse::Ok().json(body))
}

pub async fn get(state: web::Data<AppState>, user: AuthUser, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id, "terminal")?;
    let terminal = state.store.get_terminal(user.id(), id).await?.ok_or_else(|| ApiError::not_found("terminal"))?;
    Ok(HttpResponse::Ok().json(json!({ "terminal": terminal })))
}

pub async fn delete(
    state: web::Data<AppState>,
    user: AuthUser,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id, "terminal")?;
    match state.store.delete_terminal(user.id(), id).await? {
        DeleteOutcome::Deleted => Ok(HttpResponse::NoContent().finish()),
        DeleteOutcome::NotFound => Err(ApiError::not_found("terminal")),
        DeleteOutcome::Conflict => {
            Err(ApiError::conflict("terminal_live", "the terminal is live; kill it and wait for its exit first"))
        }
    }
}

/// Largest input accepted by `POST /terminals/{id}/input`.
pub const MAX_INPUT_BYTES: usize = 64 * 1024;

/// A live terminal of this user.
async fn running_terminal(state: &AppState, user: &AuthUser, raw: &str) -> Result<Terminal, ApiError> {
    let id = path_id(raw, "terminal")?;
    let terminal = state.store.get_terminal(user.id(), id).await?.ok_or_else(|| ApiError::not_found("terminal"))?;
    if !terminal.state.is_live() {
        return Err(ApiError::conflict("terminal_not_running", format!("the terminal is {}", terminal.state)));
    }
    Ok(terminal)
}

#[derive(Debug, Deserialize)]
pub struct InputBody {
    data: String,
}

impl InputBody {
    /// At most `MAX_INPUT_BYTES` of input (413 otherwise).
    pub fn check(&self) -> Result<(), ApiError> {
        if self.data.len() > MAX_INPUT_BYTES {
            return Err(ApiError::payload_too_large(format!("input over {MAX_INPUT_BYTES} bytes")));
        }
        Ok(())
    }
}

pub async fn input(
    state: web::Data<AppState>,
    user: AuthUser,
    id: web::Path<String>,
    body: Json<InputBody>,
) -> Result<HttpResponse, ApiError> {
    body.check()?;
    let terminal = running_terminal(&state, &user, &id).await?;
    let data = body.into_inner().data.into_bytes().into();
    let op = HostOp::Input { terminal_id: terminal.id, data };
    on_host_audited(&state, terminal.host_id, op, || {
        state.relay.audit.rest_input(user.id(), user.0.token_id, terminal.host_id, terminal.id)
    })
    .await?;
    Ok(HttpResponse::Accepted().json(json!({ "terminal": terminal })))
}

#[derive(Debug, Deserialize)]
pub struct ResizeBody {
    cols: u32,
    rows: u32,
}

impl ResizeBody {
    /// The grid asked for, each dimension checked.
    pub fn grid(&self) -> Result<(u16, u16), ApiError> {
        Ok((grid("cols", Some(self.cols), 80)?, grid("rows", Some(self.rows), 24)?))
    }
}

pub async fn resize(
    state: web::Data<AppState>,
    user: AuthUser,
    id: web::Path<String>,
    body: Json<ResizeBody>,
) -> Result<HttpResponse, ApiError> {
    let (cols, rows) = body.grid()?;
    let terminal = running_terminal(&state, &user, &id).await?;
    let subject =
        Subject::terminal(terminal.host_id, terminal.id).with_detail(format!("{cols}x{rows}")).by(user.0.token_id);
    let op = HostOp::Resize { terminal_id: terminal.id, cols, rows };
    on_host_audited(&state, terminal.host_id, op, || state.relay.audit.record(user.id(), AuditAction::Resize, subject))
        .await?;
    Ok(HttpResponse::Accepted().json(json!({ "terminal": terminal })))
}

#[derive(Debug, Deserialize)]
pub struct KillBody {
    #[serde(default)]
    signal: Option<serde_json::Value>,
}

impl KillBody {
    /// The signal a kill body (or its absence) asks for: HUP by default.
    pub fn signal(body: Option<&Self>) -> Result<i32, ApiError> {
        signal_number(body.and_then(|b| b.signal.as_ref()))
    }
}

/// A signal by number (1..=64) or name (`TERM`, `SIGKILL`, ...).
fn signal_number(value: Option<&serde_json::Value>) -> Result<i32, ApiError> {
    const NAMES: &[(&str, i32)] = &[
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("KILL", 9),
        ("USR1", 10),
        ("USR2", 12),
        ("TERM", 15),
        ("CONT", 18),
        ("STOP", 19),
        ("TSTP", 20),
        ("WINCH", 28),
    ];
    let bad = || ApiError::bad_request("invalid_signal", "`signal` must be 1..64 or a name such as TERM or KILL");
    match value {
        // HUP, as closing a terminal does: an interactive shell ignores TERM.
        None | Some(serde_json::Value::Null) => Ok(1),
        Some(serde_json::Value::Number(n)) => {
            n.as_i64().filter(|n| (1..=64).contains(n)).map(|n| n as i32).ok_or_else(bad)
        }
        Some(serde_json::Value::String(name)) => {
            let upper = name.to_ascii_uppercase();
            let name = upper.strip_prefix("SIG").unwrap_or(&upper);
            NAMES.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).ok_or_else(bad)
        }
        Some(_) => Err(bad()),
    }
}

/// Sends a signal; the row stays `running` until the daemon reports the exit.
pub async fn kill(
    state: web::Data<AppState>,
    user: AuthUser,
    id: web::Path<String>,
    body: OptionalJson<KillBody>,
) -> Result<HttpResponse, ApiError> {
    let signal = KillBody::signal(body.0.as_ref())?;
    let terminal = running_terminal(&state, &user, &id).await?;
    let subject =
        Subject::terminal(terminal.host_id, terminal.id).with_detail(format!("signal {signal}")).by(user.0.token_id);
    let op = HostOp::Kill { terminal_id: terminal.id, signal };
    on_host_audited(&state, terminal.host_id, op, || state.relay.audit.record(user.id(), AuditAction::Kill, subject))
        .await?;
    Ok(HttpResponse::Accepted().json(json!({ "terminal": terminal })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_without_a_signal_hangs_up() {
        assert_eq!(KillBody::signal(None).ok(), Some(1));
        let body = |signal: serde_json::Value| KillBody { signal: Some(signal) };
        assert_eq!(KillBody::signal(Some(&body(serde_json::Value::Null))).ok(), Some(1));
        assert_eq!(KillBody::signal(Some(&body(serde_json::json!(9)))).ok(), Some(9));
        assert_eq!(KillBody::signal(Some(&body(serde_json::json!("sigterm")))).ok(), Some(15));
        for bad in [serde_json::json!(0), serde_json::json!(65), serde_json::json!("NOPE"), serde_json::json!([])] {
            assert!(KillBody::signal(Some(&body(bad))).is_err());
        }
    }
}
