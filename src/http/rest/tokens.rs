//! `/api/v1/tokens` (docs/REST.md, "Tokens"): the caller's user's tokens.
//! List (never a secret), create (the secret is in that one answer only;
//! `terminalId` makes a read-only share token for one terminal, expiring),
//! revoke (its open sockets are closed 4401 by `relay::token_watch`).
//! Only a `full` token gets here (`super::super::routes`).

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use super::{check_text, field_id, path_id};
use crate::audit::Subject;
use crate::auth;
use crate::http::body::OptionalJson;
use crate::http::error::ApiError;
use crate::http::state::{AppState, AuthUser};
use crate::store::{AuditAction, NewToken, Revocation, TokenScope};

/// A share token lives this long unless `ttlSeconds` says otherwise.
pub const SHARE_TTL_SECONDS: u64 = 24 * 3600;
/// The longest `ttlSeconds` accepted (ten years).
pub const MAX_TTL_SECONDS: u64 = 10 * 365 * 24 * 3600;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateToken {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    ttl_seconds: Option<u64>,
    #[serde(default)]
    terminal_id: Option<String>,
}

/// When a token made now with `ttl_seconds` expires; 400 outside 1..=ten years.
pub fn expiry(ttl_seconds: Option<u64>) -> Result<Option<DateTime<Utc>>, ApiError> {
    let Some(ttl) = ttl_seconds else { return Ok(None) };
    if !(1..=MAX_TTL_SECONDS).contains(&ttl) {
        return Err(ApiError::bad_request("invalid_ttl", format!("`ttlSeconds` must be 1..={MAX_TTL_SECONDS}")));
    }
    Ok(Some(Utc::now() + chrono::Duration::seconds(ttl as i64)))
}

/// What a checked `CreateToken` asks for: the scope, the expiry and the
/// shared terminal.
pub type TokenRequest = (TokenScope, Option<DateTime<Utc>>, Option<uuid::Uuid>);

impl CreateToken {
    /// The checks that need no store: the label, the scope, a share
    /// token's terminal id (always `read`) and the lifetime.
    pub fn check(&self) -> Result<TokenRequest, ApiError> {
        if let Some(name) = &self.name {
            check_text("name", name, 128, false)?;
        }
        let scope = match self.scope.as_deref() {
            None => None,
            Some(s) => Some(
                s.parse::<TokenScope>()
                    .map_err(|_| ApiError::bad_request("invalid_scope", "`scope` must be full, daemon or read"))?,
            ),
        };
        let terminal_id = self.terminal_id.as_deref().map(|t| field_id(t, "terminalId")).transpose()?;
        let (scope, ttl) = match terminal_id {
            None => (scope.unwrap_or(TokenScope::Full), self.ttl_seconds),
            Some(_) if scope.is_some_and(|s| s != TokenScope::Read) => {
                return Err(ApiError::bad_request("invalid_scope", "a share token (`terminalId`) is always `read`"));
            }
            Some(_) => (TokenScope::Read, Some(self.ttl_seconds.unwrap_or(SHARE_TTL_SECONDS))),
        };
        Ok((scope, expiry(ttl)?, terminal_id))
    }
}

pub async fn list(state: web::Data<AppState>, user: AuthUser) -> Result<HttpResponse, ApiError> {
    let tokens = state.store.list_tokens(user.id()).await?;
    Ok(HttpResponse::Ok().json(json!({ "tokens": tokens })))
}

pub async fn create(
    state: web::Data<AppState>,
    user: AuthUser,
    body: OptionalJson<CreateToken>,
) -> Result<HttpResponse, ApiError> {
    // Every field is optional, so is the body: none is `{}`.
    let body = body.0.unwrap_or_default();
    let (scope, expires_at, terminal_id) = body.check()?;
    if let Some(terminal_id) = terminal_id {
        state.store.get_terminal(user.id(), terminal_id).await?.ok_or_else(|| ApiError::not_found("terminal"))?;
    }
    let secret = auth::generate_token();
    let token = state
        .store
        .insert_token(&NewToken {
            user_id: user.id(),
            token_hash: auth::hash_token(&secret),
            name: body.name.filter(|n| !n.trim().is_empty()),
            scope,
            expires_at,
            host_id: None,
            terminal_id,
        })
        .await?;
    let subject = Subject::default().with_detail(format!("token {}", token.id)).by(user.0.token_id);
    state.relay.audit.record(user.id(), AuditAction::TokenCreated, subject);
    Ok(HttpResponse::Created().json(json!({ "token": token, "secret": secret })))
}

/// Revokes one of the caller's tokens; another user's token id is 404.
pub async fn revoke(
    state: web::Data<AppState>,
    user: AuthUser,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = path_id(&id, "token")?;
    match state.store.revoke_token(Some(user.id()), id).await? {
        None => return Err(ApiError::not_found("token")),
        // Recorded once, by the call that revoked it.
        Some(Revocation::Now { .. }) => {
            let subject = Subject::default().with_detail(format!("token {id}")).by(user.0.token_id);
            state.relay.audit.record(user.id(), AuditAction::TokenRevoked, subject);
        }
        Some(Revocation::Earlier) => {}
    }
    Ok(HttpResponse::NoContent().finish())
}
