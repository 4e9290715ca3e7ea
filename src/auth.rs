//! API tokens (docs/REST.md, "Conventions"; docs/PROTOCOL.md, "Connecting"):
//! `tth_` + 32 random bytes (base64url), stored only as a SHA-256 hash,
//! presented as `Authorization: Bearer TOKEN` or, for browsers' WebSockets,
//! as the subprotocol `tether.auth.TOKEN`.
//!
//! Tokens in query strings are never read.

use actix_web::http::header;
use actix_web::HttpRequest;
use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Prefix of every API token.
pub const TOKEN_PREFIX: &str = "tth_";
/// Subprotocol prefix that carries a token for browser WebSockets.
pub const SUBPROTOCOL_AUTH_PREFIX: &str = "tether.auth.";

/// A new random token (shown once, never stored).
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The stored form of a token: lowercase hex SHA-256.
pub fn hash_token(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// True when `token` has the shape of a tether token (cheap pre-check before
/// a database lookup).
pub fn looks_like_token(token: &str) -> bool {
    token.len() > TOKEN_PREFIX.len()
        && token.len() <= 128
        && token.starts_with(TOKEN_PREFIX)
        && token[TOKEN_PREFIX.len()..].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The token of an HTTP request: `Authorization: Bearer TOKEN`.
pub fn bearer_token(req: &HttpRequest) -> Option<String> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim().to_string())
}

/// The token of a WebSocket upgrade: the Bearer header, else a
/// `tether.auth.TOKEN` entry of `Sec-WebSocket-Protocol`.
pub fn websocket_token(req: &HttpRequest) -> Option<String> {
    bearer_token(req).or_else(|| {
        offered_subprotocols(req).into_iter().find_map(|p| p.strip_prefix(SUBPROTOCOL_AUTH_PREFIX).map(str::to_string))
    })
}

/// Subprotocols the client offered, in order.
pub fn offered_subprotocols(req: &HttpRequest) -> Vec<String> {
    req.headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn tokens_have_prefix_and_hash_is_stable() {
        let t = generate_token();
        assert!(looks_like_token(&t), "{t}");
        assert_eq!(t.len(), 4 + 43);
        assert_ne!(t, generate_token());
        assert_eq!(hash_token("tth_x"), hash_token("tth_x"));
        assert_eq!(hash_token("tth_x").len(), 64);
        assert!(!looks_like_token("tth_"));
        assert!(!looks_like_token("abc"));
        assert!(!looks_like_token("tth_a b"));
    }

    #[test]
    fn websocket_token_from_header_or_subprotocol() {
        let req = TestRequest::default().insert_header((header::AUTHORIZATION, "Bearer tth_abc")).to_http_request();
        assert_eq!(websocket_token(&req).as_deref(), Some("tth_abc"));
        let req = TestRequest::default()
            .insert_header((header::SEC_WEBSOCKET_PROTOCOL, "tether.v1, tether.auth.tth_def"))
            .to_http_request();
        assert_eq!(websocket_token(&req).as_deref(), Some("tth_def"));
        let req = TestRequest::with_uri("/ws?token=tth_zzz").to_http_request();
        assert_eq!(websocket_token(&req), None);
    }
}
