//! The browser and phone viewer (docs/WEB.md; docs/REST.md, "Instance and operations"): the built page
//! of web/dist, embedded in the binary by build.rs, or read from
//! `http.web_dir` (`serve --web-dir`) while developing it.
//!
//! Routes: `/` (index.html), `/manifest.webmanifest`, `/icons/{name}` and
//! `/assets/{name}`. Assets carry a content hash in their name, so they
//! are cached for a year as immutable; the HTML, the manifest and the
//! icons are revalidated on every load (`no-cache` with an ETag), so a new
//! build reaches browsers at once. Every answer carries the page's
//! Content-Security-Policy: scripts only from this origin and never
//! inline, no third-party origin for anything.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use actix_web::http::header::{self, HeaderValue};
use actix_web::middleware::Compress;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use sha2::{Digest, Sha256};

use super::state::AppState;

include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));

/// `style-src` allows inline styles because xterm.js sizes its rows and
/// cells with `<style>` elements it creates at run time; scripts get no
/// such leeway. `connect-src 'self'` covers the same-origin WebSocket.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self'; font-src 'self'; connect-src 'self'; manifest-src 'self'; base-uri 'none'; \
     form-action 'self'; frame-ancestors 'none'";

const IMMUTABLE: &str = "public, max-age=31536000, immutable";
const REVALIDATE: &str = "no-cache";

/// Registers the page's routes. Each answers GET and HEAD (a GET without
/// its body, as every GET route of the API), and any other method with the
/// API's 405.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(page_resource("/", index).wrap(Compress::default()))
        .service(page_resource("/manifest.webmanifest", manifest).wrap(Compress::default()))
        .service(page_resource("/icons/{name}", icon))
        .service(page_resource("/assets/{name}", asset).wrap(Compress::default()));
}

fn page_resource<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::resource(path)
        .route(web::get().to(handler.clone()))
        .route(web::head().to(handler))
        .default_service(web::to(method_not_allowed))
}

async fn method_not_allowed() -> HttpResponse {
    let mut res = super::error::ApiError::new(
        actix_web::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed",
    )
    .error_response();
    res.headers_mut().insert(header::ALLOW, HeaderValue::from_static("HEAD, GET"));
    res
}

async fn index(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    serve(&req, &state, "index.html")
}

async fn manifest(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    serve(&req, &state, "manifest.webmanifest")
}

async fn icon(req: HttpRequest, state: web::Data<AppState>, name: web::Path<String>) -> HttpResponse {
    serve(&req, &state, &format!("icons/{name}"))
}

async fn asset(req: HttpRequest, state: web::Data<AppState>, name: web::Path<String>) -> HttpResponse {
    serve(&req, &state, &format!("assets/{name}"))
}

fn serve(req: &HttpRequest, state: &AppState, path: &str) -> HttpResponse {
    let Some(body) = load(state.settings.http.web_dir.as_deref(), path) else {
        return not_found();
    };
    let cache = if path.starts_with("assets/") { IMMUTABLE } else { REVALIDATE };
    let mut res = HttpResponse::Ok();
    res.insert_header((header::CONTENT_TYPE, content_type(path)))
        .insert_header((header::CACHE_CONTROL, cache))
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"));
    if cache == REVALIDATE {
        let etag = format!("\"{}\"", hex_prefix(&Sha256::digest(&body)));
        if if_none_match(req, &etag) {
            return HttpResponse::NotModified().insert_header((header::ETAG, etag)).finish();
        }
        res.insert_header((header::ETAG, etag));
    }
    match body {
        Cow::Borrowed(bytes) => res.body(bytes),
        Cow::Owned(bytes) => res.body(bytes),
    }
}

/// The file at `path` (relative to web/dist): from `dir` when set, else
/// the embedded build. Only plain names are served from disk.
pub fn load(dir: Option<&Path>, path: &str) -> Option<Cow<'static, [u8]>> {
    let safe = path.split('/').all(|part| {
        !part.is_empty()
            && !part.starts_with('.')
            && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
    });
    if !safe {
        return None;
    }
    match dir {
        Some(dir) => std::fs::read(dir.join(path)).ok().map(Cow::Owned),
        None => WEB_ASSETS.iter().find(|(name, _)| *name == path).map(|(_, bytes)| Cow::Borrowed(*bytes)),
    }
}

/// Checks `http.web_dir` at start: it must hold a built page.
pub fn check_web_dir(dir: &Path) -> Result<PathBuf, String> {
    let index = dir.join("index.html");
    if index.is_file() {
        Ok(dir.to_path_buf())
    } else {
        Err(format!("{} has no index.html (point it at a built page, e.g. web/dist)", dir.display()))
    }
}

fn content_type(path: &str) -> HeaderValue {
    let ext = path.rsplit_once('.').map(|(_, ext)| ext).unwrap_or("");
    HeaderValue::from_static(match ext {
        "html" => "text/html; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "webmanifest" => "application/manifest+json",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        "json" => "application/json",
        _ => "application/octet-stream",
    })
}

fn if_none_match(req: &HttpRequest, etag: &str) -> bool {
    req.headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|tag| tag.trim() == etag || tag.trim() == "*"))
}

fn hex_prefix(digest: &[u8]) -> String {
    digest.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

fn not_found() -> HttpResponse {
    HttpResponse::NotFound()
        .insert_header((header::CACHE_CONTROL, REVALIDATE))
        .json(serde_json::json!({"error": {"code": "not_found", "message": "no such file"}}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_build_has_the_page_and_hashed_assets() {
        let index = load(None, "index.html").expect("index.html embedded");
        let html = String::from_utf8_lossy(&index);
        for (name, _) in WEB_ASSETS.iter().filter(|(name, _)| name.starts_with("assets/")) {
            assert!(html.contains(&format!("/{name}")), "index.html does not name {name}");
        }
        assert!(!html.contains("<script>"), "no inline script");
        assert!(load(None, "manifest.webmanifest").is_some());
        assert!(load(None, "icons/icon-192.png").is_some());
    }

    #[test]
    fn only_plain_names_are_served() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.html"), "x").unwrap();
        assert!(load(Some(dir.path()), "index.html").is_some());
        assert!(load(Some(dir.path()), "../index.html").is_none());
        assert!(load(Some(dir.path()), "assets/.hidden").is_none());
        assert!(load(Some(dir.path()), "assets//x").is_none());
        assert!(load(None, "assets/%2e%2e").is_none());
    }
}
