//! The JSON error body of docs/REST.md ("Errors"): `{"error":{"code":"snake_case","message":"..."}}`
//! with a fitting status, and the handler that maps bad query strings onto
//! it (JSON bodies are read by `super::body`).

use actix_web::error::QueryPayloadError;
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use serde_json::json;

use crate::store::StoreError;

/// An error answered to an API client.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into() }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid API token is required (Authorization: Bearer TOKEN)",
        )
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", format!("{what} not found"))
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }

    pub fn internal() -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error; see the server log")
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status).json(json!({"error": {"code": self.code, "message": self.message}}))
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Invalid(message) => return Self::bad_request("invalid_field", message),
            StoreError::CapReached(cap) => {
                return Self::new(StatusCode::TOO_MANY_REQUESTS, "too_many_terminals", cap.to_string())
            }
            _ => {}
        }
        if err.is_storage_full() {
            tracing::error!(error = %err, "tether_storage_full");
            return Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "storage_full",
                "the database's disk is full (or its file reached a size limit); nothing was changed",
            );
        }
        tracing::error!(error = %err, "tether_store_error");
        if let Some(waited) = err.unanswered() {
            return Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "database_unavailable",
                format!(
                    "the database did not answer within {} ms; retry later (a change this request asked for \
                     may still be made when the database answers again)",
                    waited.as_millis()
                ),
            );
        }
        if err.is_transient() {
            return Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "database_unavailable",
                "the database cannot be reached or written now; retry later",
            );
        }
        Self::internal()
    }
}

/// Maps query-string errors to 400.
pub fn query_error(err: QueryPayloadError, _req: &HttpRequest) -> actix_web::Error {
    ApiError::bad_request("bad_query", err.to_string()).into()
}
