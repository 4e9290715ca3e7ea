//! `/api/v1/hosts` (docs/REST.md, "Hosts" and "Daemon requests"): register
//! (upsert by user + hostname; a daemon token only its own host), list and get with live state, delete (409 while online), and
//! the requests answered by the daemon: dirs, limits, credentials.

use actix_web::{web, HttpResponse};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::json;

use super::page::{PageQuery, Position};
use super::{check_text, on_host, online_hosts, path_id};
use crate::audit::Subject;
use crate::auth::NotItsHost;
use crate::daemon::MAX_DIR_PATH_BYTES;
use crate::http::body::{null_is_default, Json, OptionalJson};
use crate::http::error::ApiError;
use crate::http::state::{AppState, AuthUser};
use crate::http::views::HostView;
use crate::relay::requests::{HostOp, OpAnswer};
use crate::store::{AuditAction, HostState, NewHost, Registered, TokenScope};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisterHost {
    #[serde(default)]
    name: Option<String>,
    hostname: String,
    #[serde(default, deserialize_with = "null_is_default")]
    platform: String,
    #[serde(default, deserialize_with = "null_is_default")]
    arch: String,
}

impl RegisterHost {
    /// Checks every field; returns the host's name (the hostname when no
    /// name is given).
    pub fn check(&self) -> Result<String, ApiError> {
        check_text("hostname", &self.hostname, 255, true)?;
        let name = self.name.clone().filter(|n| !n.trim().is_empty()).unwrap_or_else(|| self.hostname.clone());
        check_text("name", &name, 255, true)?;
        check_text("platform", &self.platform, 64, false)?;
        check_text("arch", &self.arch, 64, false)?;
        Ok(name)
    }
}

pub async fn register(
    state: web::Data<AppState>,
    user: AuthUser,
    body: Json<RegisterHost>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let name = body.check()?;
    // A daemon token registers only its own host, or binds to one nobody
    // else's token holds; checked and written in one transaction.
    let daemon_token = (user.0.scope == TokenScope::Daemon).then_some(user.0.token_id);
    let new = NewHost { user_id: user.id(), name, hostname: body.hostname, platform: body.platform, arch: body.arch };
    let host = match state.store.register_host(&new, daemon_token).await? {
        Registered::Host(host) => host,
        Registered::TokenBoundElsewhere => return Err(refused(NotItsHost::BoundElsewhere)),
        Registered::HostHasToken => return Err(refused(NotItsHost::HostHasToken)),
    };
    let subject = Subject::host(host.id).by(user.0.token_id);
    state.relay.audit.record(user.id(), AuditAction::HostRegistered, subject);
    let online = online_hosts(&state, &[host.id]).await?.contains(&host.id);
    Ok(HttpResponse::Created().json(json!({ "host": HostView::new(host, online) })))
}

fn refused(not: NotItsHost) -> ApiError {
    ApiError::new(actix_web::http::StatusCode::FORBIDDEN, not.code(), not.message())
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    state: Option<String>,
    #[serde(flatten)]
    page: PageQuery,
}

pub async fn list(
    state: web::Data<AppState>,
    user: AuthUser,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let wanted = match query.state.as_deref() {
        None => None,
        Some("online") => Some(HostState::Online),
        Some("offline") => Some(HostState::Offline),
        Some(_) => return Err(ApiError::bad_request("invalid_state", "`state` must be online or offline")),
    };
    let pager = query.page.pager()?;
    let online = wanted.map(|wanted| wanted == HostState::Online);
    let hosts = state.store.page_hosts(user.id(), online, &pager.read()).await?;
    let views: Vec<HostView> = hosts.into_iter().map(|(h, live)| HostView::new(h, live)).collect();
    let body = pager.body(views, "hosts", |h| Position { created_at: h.created_at, id: h.id });
    Ok(HttpResponse::Ok().json(body))
}

pub async fn get(state: web::Data<AppState>, user: AuthUser, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id, "host")?;
    let host = state.store.get_host(user.id(), id).await?.ok_or_else(|| ApiError::not_found("host"))?;
    let online = online_hosts(&state, &[id]).await?.contains(&id);
    Ok(HttpResponse::Ok().json(json!({ "host": HostView::new(host, online) })))
}

pub async fn delete(
    state: web::Data<AppState>,
    user: AuthUser,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id, "host")?;
    state.store.get_host(user.id(), id).await?.ok_or_else(|| ApiError::not_found("host"))?;
    if online_hosts(&state, &[id]).await?.contains(&id) {
        return Err(ApiError::conflict("host_online", "the host is online; stop its daemon first"));
    }
    if !state.store.delete_host(user.id(), id).await? {
        return Err(ApiError::not_found("host"));
    }
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Debug, Deserialize)]
pub struct DirBody {
    path: String,
}

#[derive(Debug, Deserialize)]
pub struct DirQuery {
    path: String,
}

impl DirBody {
    /// The dir must be an absolute path without `..`.
    pub fn check(&self) -> Result<(), ApiError> {
        check_path(&self.path)
    }
}

/// An absolute path without a `..` component or NUL (as a terminal's
/// `dir`), at most as long as a daemon takes
/// (docs/PROTOCOL.md, "DirsResult").
fn check_path(path: &str) -> Result<(), ApiError> {
    if path.len() > MAX_DIR_PATH_BYTES {
        return Err(ApiError::bad_request(
            "field_too_long",
            format!("`path` has {} bytes, more than {MAX_DIR_PATH_BYTES}", path.len()),
        ));
    }
    if !path.starts_with('/') || path.contains('\0') || path.split('/').any(|part| part == "..") {
        return Err(ApiError::bad_request("invalid_dir", "`path` must be an absolute path without `..` or NUL"));
    }
    Ok(())
}

async fn own_host(state: &AppState, user: &AuthUser, raw: &str) -> Result<uuid::Uuid, ApiError> {
    let id = path_id(raw, "host")?;
    state.store.get_host(user.id(), id).await?.ok_or_else(|| ApiError::not_found("host"))?;
    Ok(id)
}

fn dirs_response(answer: OpAnswer) -> Result<HttpResponse, ApiError> {
    match answer {
        OpAnswer::Dirs(dirs) => Ok(HttpResponse::Ok().json(json!({ "dirs": dirs }))),
        _ => Err(ApiError::internal()),
    }
}

/// `POST /hosts/{id}/dirs {path}`: the daemon adds an allowed dir (10 s).
pub async fn add_dir(
    state: web::Data<AppState>,
    user: AuthUser,
    id: web::Path<String>,
    body: Json<DirBody>,
) -> Result<HttpResponse, ApiError> {
    let id = own_host(&state, &user, &id).await?;
    body.check()?;
    dirs_response(on_host(&state, id, HostOp::Dirs { add: true, path: body.into_inner().path }).await?)
}

/// `DELETE /hosts/{id}/dirs?path=`: the daemon removes an allowed dir (10 s).
pub async fn remove_dir(
    state: web::Data<AppState>,
    user: AuthUser,
    id: web::Path<String>,
    query: web::Query<DirQuery>,
) -> Result<HttpResponse, ApiError> {
    let id = own_host(&state, &user, &id).await?;
    check_path(&query.path)?;
    dirs_response(on_host(&state, id, HostOp::Dirs { add: false, path: query.into_inner().path }).await?)
}

/// `POST /hosts/{id}/limits/refresh`: the daemon's resource limits (30 s).
/// It takes no fields, but a body that is there must be JSON.
pub async fn refresh_limits(
    state: web::Data<AppState>,
    user: AuthUser,
    id: web::Path<String>,
    _no_fields: OptionalJson<IgnoredAny>,
) -> Result<HttpResponse, ApiError> {
    let id = own_host(&state, &user, &id).await?;
    match on_host(&state, id, HostOp::RefreshLimits).await? {
        OpAnswer::Limits(limits) => Ok(HttpResponse::Ok().json(json!({ "limits": limits }))),
        _ => Err(ApiError::internal()),
    }
}

/// `POST /hosts/{id}/credentials/refresh`: the host's owner asks the daemon
/// for its credentials, checks they are a JSON object and stores them
/// encrypted (an owner task: only "ok" or an error crosses instances). The
/// credentials never appear in a response or a log line.
pub async fn refresh_credentials(
    state: web::Data<AppState>,
    user: AuthUser,
    id: web::Path<String>,
    _no_fields: OptionalJson<IgnoredAny>,
) -> Result<HttpResponse, ApiError> {
    let id = own_host(&state, &user, &id).await?;
    if state.settings.encryption_key().is_none() {
        return Err(ApiError::conflict("encryption_not_configured", "set encryption.key to store host credentials"));
    }
    match on_host(&state, id, HostOp::RefreshCredentials).await? {
        OpAnswer::CredentialsStored => Ok(HttpResponse::Ok().json(json!({ "ok": true, "hostId": id }))),
        _ => Err(ApiError::internal()),
    }
}
