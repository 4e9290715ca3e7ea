//! JSON request bodies (docs/REST.md, "Conventions"): `Json<T>`, a body a
//! route needs, and `OptionalJson<T>`, one it may go without.
//!
//! Both read the whole body (decompressed as its `Content-Encoding` says,
//! at most `http.max_body_bytes`, else 413 `payload_too_large`), refuse
//! JSON nested deeper than `json_input::MAX_JSON_DEPTH` before parsing,
//! and answer every failure in the API's error shape before the handler
//! runs. `Json<T>` stands in for actix's `web::Json`, whose parser skips
//! unknown fields however deep they nest. For `OptionalJson<T>` an empty
//! body is "no body"; anything else, white space too, must parse (400
//! `bad_json`). actix's
//! `Option<Json<T>>` would swallow those errors as "no body".

use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;

use actix_web::dev::{Decompress, Payload};
use actix_web::http::header;
use actix_web::{mime, FromRequest, HttpRequest};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The body size limit of the app (`http.max_body_bytes`), as app data.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// A JSON body a route needs.
pub struct Json<T>(pub T);

impl<T> Json<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> Deref for Json<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A JSON body that may be absent (empty).
pub struct OptionalJson<T>(pub Option<T>);

fn too_large(limit: usize) -> ApiError {
    ApiError::payload_too_large(format!("request body over {limit} bytes"))
}

fn bad_json(err: crate::json_input::JsonError) -> ApiError {
    ApiError::bad_request("bad_json", err.to_string())
}

/// A whole body as a JSON value (400 `bad_json` when it is not one). Every
/// body of the API is an object: serde would read a struct from an array
/// too (`[]` as a body of optional fields, say), so anything else is
/// refused first.
pub fn parse_required<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad_request("bad_json", "the body must be a JSON object"));
    }
    crate::json_input::parse(body).map_err(bad_json)
}

/// For an optional field: `null` is taken as the field left out (its
/// default), as it is for the fields that are `Option`s.
pub fn null_is_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de> + Default,
{
    Ok(<Option<T> as serde::Deserialize>::deserialize(deserializer)?.unwrap_or_default())
}

/// A whole body as an optional JSON value: empty is `None`, anything else
/// (white space included) must parse (400 `bad_json`).
pub fn parse_optional<T: DeserializeOwned>(body: &[u8]) -> Result<Option<T>, ApiError> {
    if body.is_empty() {
        return Ok(None);
    }
    parse_required(body).map(Some)
}

/// A body may say it is JSON or say nothing. Anything else is refused: a
/// type of another kind, a value that is not a media type at all, or more
/// than one Content-Type header.
fn json_content_type(req: &HttpRequest) -> Result<(), ApiError> {
    let mut values = req.headers().get_all(header::CONTENT_TYPE);
    let Some(value) = values.next() else { return Ok(()) };
    let json = values.next().is_none()
        && value
            .to_str()
            .ok()
            .and_then(|v| v.parse::<mime::Mime>().ok())
            .is_some_and(|m| m.subtype() == mime::JSON || m.suffix() == Some(mime::JSON));
    if json {
        Ok(())
    } else {
        Err(ApiError::bad_request("bad_content_type", "the body must be JSON (Content-Type: application/json)"))
    }
}

/// The whole body, decompressed, of at most the app's [`BodyLimit`].
fn read_body(req: &HttpRequest, payload: &mut Payload) -> impl Future<Output = Result<Vec<u8>, ApiError>> {
    let limit = req.app_data::<BodyLimit>().map_or(256 * 1024, |l| l.0);
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let mut payload = Decompress::from_headers(payload.take(), req.headers());
    async move {
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
        Ok(body)
    }
}

impl<T: DeserializeOwned + 'static> FromRequest for Json<T> {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let content_type = json_content_type(req);
        let body = read_body(req, payload);
        Box::pin(async move {
            content_type?;
            parse_required(&body.await?).map(Json)
        })
    }
}

impl<T: DeserializeOwned + 'static> FromRequest for OptionalJson<T> {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let content_type = json_content_type(req);
        let body = read_body(req, payload);
        Box::pin(async move {
            let body = body.await?;
            // A body that is there is held to a required one's rules.
            if !body.is_empty() {
                content_type?;
            }
            parse_optional(&body).map(OptionalJson)
        })
    }
}
