//! The Origin rule for WebSocket upgrades (docs/WEB.md; docs/CONFIG.md
//! `http.allowed_origins`): a browser's socket is accepted only from this
//! instance's own origin or an origin the operator allowed; anything else
//! is refused with 403 before the upgrade, so a page on another site
//! cannot ride a user's token. Clients that send no Origin (the daemon,
//! `tether attach`) are not browsers and pass.
//!
//! The instance's own origin is the request's scheme and `Host`; what a
//! proxy says instead (`Forwarded`, `X-Forwarded-Proto`,
//! `X-Forwarded-Host`) is believed only from a peer in
//! `http.trusted_proxies`, as `X-Forwarded-For` is: anyone can send one.

use actix_web::http::header;
use actix_web::HttpRequest;

use super::client_addr::{peer_is_trusted, Cidr};

/// Whether the upgrade request may proceed.
pub fn allowed(req: &HttpRequest, allowed_origins: &[String], proxies: &[Cidr]) -> bool {
    let Some(origin) = req.headers().get(header::ORIGIN) else { return true };
    let Ok(origin) = origin.to_str() else { return false };
    if peer_is_trusted(req, proxies) {
        let info = req.connection_info();
        return origin_matches(origin, info.scheme(), info.host(), allowed_origins);
    }
    let scheme = if req.app_config().secure() { "https" } else { "http" };
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
        .unwrap_or_else(|| req.app_config().host());
    origin_matches(origin, scheme, host, allowed_origins)
}

/// `origin` against `scheme://host` (the request's own origin, as the
/// client or a proxy in front named it) and the allowed list.
pub fn origin_matches(origin: &str, scheme: &str, host: &str, allowed_origins: &[String]) -> bool {
    let Some(origin) = normalize(origin) else { return false };
    let own = normalize(&format!("{scheme}://{host}"));
    own.as_deref() == Some(origin.as_str())
        || allowed_origins.iter().any(|a| normalize(a).as_deref() == Some(origin.as_str()))
}

/// `scheme://host[:port]` in lower case without a default port, or None
/// when `origin` is not of that shape (`null`, a path, another scheme).
pub fn normalize(origin: &str) -> Option<String> {
    let origin = origin.trim().to_ascii_lowercase();
    let (scheme, rest) = origin.split_once("://")?;
    if !matches!(scheme, "http" | "https") || rest.is_empty() || rest.contains(['/', '?', '#', '@', ' ']) {
        return None;
    }
    let default_port = if scheme == "http" { ":80" } else { ":443" };
    let host = rest.strip_suffix(default_port).unwrap_or(rest);
    Some(format!("{scheme}://{host}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_origin_passes_others_do_not() {
        let none: Vec<String> = Vec::new();
        assert!(origin_matches("http://127.0.0.1:8080", "http", "127.0.0.1:8080", &none));
        assert!(origin_matches("https://Tether.Example", "https", "tether.example:443", &none));
        assert!(!origin_matches("http://evil.example", "http", "127.0.0.1:8080", &none));
        assert!(!origin_matches("http://127.0.0.1:8081", "http", "127.0.0.1:8080", &none));
        assert!(!origin_matches("https://127.0.0.1:8080", "http", "127.0.0.1:8080", &none));
        assert!(!origin_matches("null", "http", "127.0.0.1:8080", &none));
    }

    #[test]
    fn allowed_origins_are_added() {
        let allowed = vec!["https://app.example".to_string()];
        assert!(origin_matches("https://app.example", "http", "127.0.0.1:8080", &allowed));
        assert!(origin_matches("https://app.example:443", "http", "127.0.0.1:8080", &allowed));
        assert!(!origin_matches("http://app.example", "http", "127.0.0.1:8080", &allowed));
    }

    #[test]
    fn only_plain_origins_normalize() {
        assert_eq!(normalize("HTTP://A:80").as_deref(), Some("http://a"));
        assert_eq!(normalize("http://a/path"), None);
        assert_eq!(normalize("ftp://a"), None);
        assert_eq!(normalize("http://"), None);
    }
}
