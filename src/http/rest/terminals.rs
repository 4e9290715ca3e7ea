//! `/api/v1/terminals` (SPEC §6.4): create (inserted `pending` with reason
//! `host_offline` until a daemon takes it), list with filters, get, and
//! delete (409 while the terminal is live).

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::{check_argv, check_dir, check_text, field_id, path_id};
use crate::http::error::ApiError;
use crate::http::state::{AppState, AuthUser};
use crate::http::views::TerminalView;
use crate::store::{DeleteOutcome, NewTerminal, TerminalFilter, TerminalState};

/// Grids are clamped to 1..=1000 everywhere (SPEC §5); the API refuses
/// anything outside rather than guess.
pub const MAX_GRID: u16 = 1000;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateTerminal {
    host_id: String,
    #[serde(default)]
    dir: Option<String>,
    #[serde(default)]
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

pub async fn create(
    state: web::Data<AppState>,
    user: AuthUser,
    body: web::Json<CreateTerminal>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let host_id = field_id(&body.host_id, "hostId")?;
    let cols = grid("cols", body.cols, 80)?;
    let rows = grid("rows", body.rows, 24)?;
    check_argv(&body.argv)?;
    if let Some(title) = &body.title {
        check_text("title", title, 256, false)?;
    }
    let host = state.store.get_host(user.id(), host_id).await?.ok_or_else(|| ApiError::not_found("host"))?;
    if let Some(dir) = &body.dir {
        check_dir(dir, &host.dirs)?;
    }
    let terminal = state
        .store
        .insert_terminal(&NewTerminal {
            user_id: user.id(),
            host_id,
            title: body.title,
            dir: body.dir,
            argv: body.argv,
            cols,
            rows,
            run_id: None,
        })
        .await?;
    Ok(HttpResponse::Created().json(json!({ "terminal": TerminalView::from(terminal) })))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    host_id: Option<String>,
    state: Option<String>,
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
    let terminals =
        state.store.list_terminals(user.id(), &TerminalFilter { host_id, state: terminal_state }).await?;
    let views: Vec<TerminalView> = terminals.into_iter().map(TerminalView::from).collect();
    Ok(HttpResponse::Ok().json(json!({ "terminals": views })))
}

pub async fn get(state: web::Data<AppState>, user: AuthUser, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id, "terminal")?;
    let terminal = state.store.get_terminal(user.id(), id).await?.ok_or_else(|| ApiError::not_found("terminal"))?;
    Ok(HttpResponse::Ok().json(json!({ "terminal": TerminalView::from(terminal) })))
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
