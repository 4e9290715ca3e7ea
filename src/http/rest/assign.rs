//! `POST /v1/assign` (docs/REST.md, "Placement"; docs/CELLS.md, "The assign
//! call"): a daemon asks the director where to dial. Served by directors
//! (and combined instances with `director.enabled`); the placement itself
//! is `crate::director::assign`.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;

use crate::auth;
use crate::director::{AssignError, Director};
use crate::http::body::Json;
use crate::http::error::ApiError;
use crate::http::state::{AppState, AuthUser};

/// As every API body: unknown fields are ignored, a malformed id is
/// `invalid_id` (docs/REST.md, "Conventions").
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssignRequest {
    host_id: String,
}

pub async fn assign(
    state: web::Data<AppState>,
    director: Option<web::Data<Director>>,
    user: AuthUser,
    body: Json<AssignRequest>,
) -> Result<HttpResponse, ApiError> {
    // The route is registered only where the director runs.
    let director = director.ok_or_else(ApiError::internal)?;
    let host_id = super::field_id(&body.host_id, "hostId")?;
    if state.store.get_host(user.id(), host_id).await?.is_none() {
        return Err(ApiError::not_found("host"));
    }
    if let Err(not) = auth::speaks_for(state.store.as_ref(), &user.0, host_id).await? {
        return Err(ApiError::new(StatusCode::FORBIDDEN, not.code(), not.message()));
    }
    match director.assign(user.id(), host_id).await {
        Ok(answer) => Ok(HttpResponse::Ok().json(answer)),
        Err(e @ AssignError::NoCell) => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "no_cell", e.to_string())),
        Err(AssignError::Store(e)) => Err(e.into()),
        Err(e @ AssignError::PollerGone) => {
            tracing::error!(error = %e, "tether_director_unavailable");
            Err(ApiError::internal())
        }
    }
}
