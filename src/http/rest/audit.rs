//! `GET /api/v1/audit?since=&limit=` (docs/REST.md, "Audit"): the caller's
//! user's own audit events, newest first.

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use crate::http::error::ApiError;
use crate::http::state::{AppState, AuthUser};

/// Events answered when `limit` is not given, and at most (docs/REST.md,
/// "Conventions").
const DEFAULT_LIMIT: usize = 500;
const MAX_LIMIT: usize = 5000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    since: Option<String>,
    /// Text, so that one that is not a number is `invalid_limit` too.
    limit: Option<String>,
}

pub async fn list(
    state: web::Data<AppState>,
    user: AuthUser,
    query: web::Query<AuditQuery>,
) -> Result<HttpResponse, ApiError> {
    let query = query.into_inner();
    let since = query
        .since
        .as_deref()
        .map(|s| {
            DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&Utc)).map_err(|_| {
                ApiError::bad_request("invalid_since", "`since` must be an RFC 3339 time such as 2026-12-01T00:00:00Z")
            })
        })
        .transpose()?;
    let limit = match query.limit.as_deref().map(str::parse::<usize>) {
        None => DEFAULT_LIMIT,
        Some(Ok(n)) if (1..=MAX_LIMIT).contains(&n) => n,
        Some(_) => return Err(ApiError::bad_request("invalid_limit", format!("`limit` must be 1..{MAX_LIMIT}"))),
    };
    let events = state.store.list_audit_events(user.id(), since, limit).await?;
    Ok(HttpResponse::Ok().json(json!({ "events": events })))
}
