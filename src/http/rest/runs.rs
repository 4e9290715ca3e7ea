//! `/api/v1/runs` (docs/REST.md, "Runs"): queue a batch command on a host, list
//! (by host and state, paged), get (exit code, usage, terminal id) and read its
//! captured output.

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::page::{PageQuery, Position};
use super::{check_argv, check_dir, field_id, path_id};
use crate::audit::Subject;
use crate::http::body::Json;
use crate::http::error::ApiError;
use crate::http::state::{AppState, AuthUser};
use crate::store::{AuditAction, NewRun, RunFilter, RunState, TerminalCaps};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateRun {
    host_id: String,
    argv: Vec<String>,
    #[serde(default)]
    dir: Option<String>,
}

impl CreateRun {
    /// The checks that need no store: the host id and a non-empty argv.
    /// Returns the host id.
    pub fn check(&self) -> Result<uuid::Uuid, ApiError> {
        let host_id = field_id(&self.host_id, "hostId")?;
        if self.argv.is_empty() {
            return Err(ApiError::bad_request("missing_field", "`argv` must name a command"));
        }
        check_argv(&self.argv)?;
        Ok(host_id)
    }

    /// The working directory asked for, if any.
    pub fn dir(&self) -> Option<&str> {
        self.dir.as_deref()
    }
}

pub async fn create(
    state: web::Data<AppState>,
    user: AuthUser,
    body: Json<CreateRun>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let host_id = body.check()?;
    let host = state.store.get_host(user.id(), host_id).await?.ok_or_else(|| ApiError::not_found("host"))?;
    if let Some(dir) = &body.dir {
        check_dir(dir, &host.dirs)?;
    }
    let new = NewRun { user_id: user.id(), host_id, argv: body.argv, dir: body.dir };
    let run = state.store.insert_run(&new, Some(TerminalCaps::of(&state.settings))).await?;
    // A run is a spawn by this token; its terminal is made when a worker
    // dispatches it, so the event names the run (whose resource names the
    // terminal).
    let subject = Subject::host(host_id).with_detail(format!("run {}", run.id)).by(user.0.token_id);
    state.relay.audit.record(user.id(), AuditAction::Spawn, subject);
    Ok(HttpResponse::Created().json(json!({ "run": run })))
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
    let host_id = query.host_id.as_deref().map(|h| field_id(h, "hostId")).transpose()?;
    let run_state = query
        .state
        .as_deref()
        .map(|s| {
            s.parse::<RunState>().map_err(|_| {
                ApiError::bad_request(
                    "invalid_state",
                    "`state` must be queued, dispatched, running, succeeded, failed or lost",
                )
            })
        })
        .transpose()?;
    let pager = query.page.pager()?;
    let filter = RunFilter { host_id, state: run_state };
    let runs = state.store.list_runs(user.id(), &filter, &pager.read()).await?;
    let body = pager.body(runs, "runs", |r| Position { created_at: r.created_at, id: r.id });
    Ok(HttpResponse::Ok().json(body))
}

pub async fn get(state: web::Data<AppState>, user: AuthUser, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id, "run")?;
    let run = state.store.get_run(user.id(), id).await?.ok_or_else(|| ApiError::not_found("run"))?;
    Ok(HttpResponse::Ok().json(json!({ "run": run })))
}

#[derive(Debug, Deserialize)]
pub struct LogQuery {
    /// A byte offset into the log: only the bytes from there are sent.
    from: Option<String>,
}

/// Offset after the last byte sent (the log's length so far).
pub const NEXT_OFFSET_HEADER: &str = "Tether-Next-Offset";
/// `true` once the log will not grow: the run is final, or the log is full.
pub const LOG_COMPLETE_HEADER: &str = "Tether-Log-Complete";

/// The captured output, as the terminal produced it (bytes, not
/// re-encoded), from byte `?from=N` (default 0); log offsets are the
/// terminal's stream offsets, so a follower stitches the log and the
/// viewer stream by them.
pub async fn log(
    state: web::Data<AppState>,
    user: AuthUser,
    id: web::Path<String>,
    query: web::Query<LogQuery>,
) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id, "run")?;
    let from = match query.from.as_deref() {
        None => 0,
        Some(text) => text.parse::<u64>().map_err(|_| {
            ApiError::bad_request("bad_offset", format!("`from` must be a byte offset (0 or more), not {text:?}"))
        })?,
    };
    // The run first: the last output is stored before the run is marked
    // final, so a log read after a final run is the whole log.
    let run = state.store.get_run(user.id(), id).await?.ok_or_else(|| ApiError::not_found("run"))?;
    let log = state.store.run_log(user.id(), id).await?.ok_or_else(|| ApiError::not_found("run"))?;
    let complete = run.state.is_final() || log.len() >= state.settings.runs.log_max_bytes;
    let start = usize::try_from(from).map_or(log.len(), |from| from.min(log.len()));
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        .insert_header((NEXT_OFFSET_HEADER, log.len().to_string()))
        .insert_header((LOG_COMPLETE_HEADER, complete.to_string()))
        .body(bytes::Bytes::from(log).slice(start..)))
}
