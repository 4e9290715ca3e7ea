//! `/api/v1/runs` (docs/REST.md, "Runs"): queue a batch command on a host, list, get
//! (exit code, usage, terminal id) and read its captured output.

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::{check_argv, check_dir, field_id, path_id};
use crate::http::error::ApiError;
use crate::http::state::{AppState, AuthUser};
use crate::store::NewRun;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateRun {
    host_id: String,
    argv: Vec<String>,
    #[serde(default)]
    dir: Option<String>,
}

pub async fn create(
    state: web::Data<AppState>,
    user: AuthUser,
    body: web::Json<CreateRun>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let host_id = field_id(&body.host_id, "hostId")?;
    if body.argv.is_empty() {
        return Err(ApiError::bad_request("missing_field", "`argv` must name a command"));
    }
    check_argv(&body.argv)?;
    let host = state.store.get_host(user.id(), host_id).await?.ok_or_else(|| ApiError::not_found("host"))?;
    if let Some(dir) = &body.dir {
        check_dir(dir, &host.dirs)?;
    }
    let run = state.store.insert_run(&NewRun { user_id: user.id(), host_id, argv: body.argv, dir: body.dir }).await?;
    Ok(HttpResponse::Created().json(json!({ "run": run })))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    host_id: Option<String>,
}

pub async fn list(
    state: web::Data<AppState>,
    user: AuthUser,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let host_id = query.host_id.as_deref().map(|h| field_id(h, "hostId")).transpose()?;
    let runs = state.store.list_runs(user.id(), host_id).await?;
    Ok(HttpResponse::Ok().json(json!({ "runs": runs })))
}

pub async fn get(state: web::Data<AppState>, user: AuthUser, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id, "run")?;
    let run = state.store.get_run(user.id(), id).await?.ok_or_else(|| ApiError::not_found("run"))?;
    Ok(HttpResponse::Ok().json(json!({ "run": run })))
}

/// The captured output, as the terminal produced it (bytes, not re-encoded).
pub async fn log(state: web::Data<AppState>, user: AuthUser, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id, "run")?;
    let log = state.store.run_log(user.id(), id).await?.ok_or_else(|| ApiError::not_found("run"))?;
    Ok(HttpResponse::Ok().content_type("application/octet-stream").body(log))
}
