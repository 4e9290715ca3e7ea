//! `OptionalJson<T>`: a JSON body a route may go without (docs/REST.md,
//! "Errors"). An empty body is "no body"; anything else must parse and
//! fit `http.max_body_bytes`, or the request is refused with its error
//! (400 `bad_json`, 413 `payload_too_large`) before the handler runs.
//! actix's `Option<Json<T>>` would swallow those errors as "no body".

use std::future::Future;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{FromRequest, HttpRequest};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The body size limit of the app (`http.max_body_bytes`), as app data.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// A JSON body that may be absent (empty).
pub struct OptionalJson<T>(pub Option<T>);

fn too_large(limit: usize) -> ApiError {
    ApiError::payload_too_large(format!("request body over {limit} bytes"))
}

/// A whole body as an optional JSON value: blank is `None`, anything else
/// must parse (400 `bad_json`).
pub fn parse_optional<T: DeserializeOwned>(body: &[u8]) -> Result<Option<T>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(body).map(Some).map_err(|e| ApiError::bad_request("bad_json", e.to_string()))
}

impl<T: DeserializeOwned + 'static> FromRequest for OptionalJson<T> {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let limit = req.app_data::<BodyLimit>().map_or(256 * 1024, |l| l.0);
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let mut payload = payload.take();
        Box::pin(async move {
            if declared.is_some_and(|n| n > limit as u64) {
                return Err(too_large(limit));
            }
            let mut body = Vec::new();
            while let Some(chunk) = payload.next().await {
                let chunk = chunk.map_err(|e| ApiError::bad_request("bad_body", e.to_string()))?;
                if body.len() + chunk.len() > limit {
                    return Err(too_large(limit));
                }
                body.extend_from_slice(&chunk);
            }
            parse_optional(&body).map(OptionalJson)
        })
    }
}
