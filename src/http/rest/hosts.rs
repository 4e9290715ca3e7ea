//! `/api/v1/hosts` (SPEC §6.1): register (upsert by user + hostname), list
//! and get with live state, delete (409 while online).

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::json;

use super::{check_text, online_hosts, path_id};
use crate::http::error::ApiError;
use crate::http::state::{AppState, AuthUser};
use crate::http::views::HostView;
use crate::store::NewHost;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisterHost {
    #[serde(default)]
    name: Option<String>,
    hostname: String,
    #[serde(default)]
    platform: String,
    #[serde(default)]
    arch: String,
}

pub async fn register(
    state: web::Data<AppState>,
    user: AuthUser,
    body: web::Json<RegisterHost>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    check_text("hostname", &body.hostname, 255, true)?;
    let name = body.name.filter(|n| !n.trim().is_empty()).unwrap_or_else(|| body.hostname.clone());
    check_text("name", &name, 255, true)?;
    check_text("platform", &body.platform, 64, false)?;
    check_text("arch", &body.arch, 64, false)?;
    let host = state
        .store
        .upsert_host(&NewHost {
            user_id: user.id(),
            name,
            hostname: body.hostname,
            platform: body.platform,
            arch: body.arch,
        })
        .await?;
    let online = online_hosts(&state, &[host.id]).await?.contains(&host.id);
    Ok(HttpResponse::Created().json(json!({ "host": HostView::new(host, online) })))
}

pub async fn list(state: web::Data<AppState>, user: AuthUser) -> Result<HttpResponse, ApiError> {
    let hosts = state.store.list_hosts(user.id()).await?;
    let ids: Vec<_> = hosts.iter().map(|h| h.id).collect();
    let online = online_hosts(&state, &ids).await?;
    let views: Vec<HostView> = hosts
        .into_iter()
        .map(|h| {
            let is_online = online.contains(&h.id);
            HostView::new(h, is_online)
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "hosts": views })))
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
