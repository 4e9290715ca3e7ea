//! The web page (docs/WEB.md) against a real `tether serve` and
//! a real `tether daemon`: how it is served (types, caching, CSP, the
//! Origin rule), and the page itself in Debian's Chromium, one case of
//! web/tests/cases.mjs per test (tests/support/browser.rs).

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::balancer::Balancer;
use support::browser::{run_case, run_unit_tests, screenshot_dir};
use support::client::{create_token, viewer_url, Api};
use support::daemon::DaemonProcess;
use support::e2e::{start, terminal, wait_online, E2e};
use support::TetherServer;

/// The bound on the page's JS heap while `seq 1 2000000` runs (docs/WEB.md,
/// "Large output"): xterm.js keeps 5000 lines of scrollback (about 5 MiB at
/// 100 columns); measured peaks are near 11 MiB, so 32 MiB leaves room
/// without hiding a leak of the output itself (15 MB of it).
const HEAP_BOUND_BYTES: u64 = 32 * 1024 * 1024;
/// What the page may hold of the output at once (web/src/output-queue.js):
/// 4 MiB queued + 256 KiB in flight + the frame that passes the limit.
const PAGE_BUFFER_BOUND_BYTES: u64 = 4 * 1024 * 1024 + 256 * 1024 + 1024 * 1024;

fn case_env(e: &E2e) -> Value {
    json!({
        "url": e.server.url(),
        "token": e.api.token,
        "hostId": e.host,
        "screenshots": screenshot_dir(),
        "heapBoundBytes": HEAP_BOUND_BYTES,
        "pageBufferBoundBytes": PAGE_BUFFER_BOUND_BYTES,
    })
}

/// Starts a server and a daemon and runs browser case `name` against them.
async fn browser_case(name: &str) -> Value {
    let e = start(false, &[]).await;
    run_case(name, case_env(&e), &[]).await
}

macro_rules! browser_cases {
    ($($name:ident),* $(,)?) => {
        $(#[actix_rt::test] async fn $name() { browser_case(stringify!($name)).await; })*
    };
}

browser_cases!(
    sign_in_echo_and_exit,
    resize_window_changes_stty_size,
    second_viewer_sees_held_bar_and_takes_over,
    hidden_holder_yields_the_grid,
    phone_ctrl_c_interrupts_sleep,
    phone_held_bar_keeps_the_top_row,
    font_buttons_leave_the_keys_to_the_terminal,
    a_larger_held_grid_keeps_the_cursor_in_view,
    bad_token_and_sign_out,
    failed_start_shows_error_and_stops,
    start_error_stays_until_the_user_acts,
    lists_refresh_in_place,
    pending_terminal_says_why,
    keys_typed_while_reconnecting_are_sent,
    holder_leaving_hands_the_grid_over,
    phone_touch_scrolls_back,
    read_and_share_tokens_home,
    phone_lists_fit_long_names,
    idle_viewers_do_not_bounce_the_grid,
    kill_and_delete_from_the_list,
    killed_terminal_header_names_the_signal,
    repaint_keeps_the_scrollback,
);

#[actix_rt::test]
async fn seq_two_million_bounded() {
    let result = browser_case("seq_two_million_bounded").await;
    eprintln!("seq 1 2000000 in the page: {result}");
    assert!(result["heapPeak"].as_u64().expect("heapPeak") < HEAP_BOUND_BYTES, "{result}");
    assert!(result["pageBufferPeakBytes"].as_u64().expect("buffer peak") <= PAGE_BUFFER_BOUND_BYTES, "{result}");
}

#[actix_rt::test]
async fn dropped_socket_resumes_without_duplicates() {
    let e = start(false, &[]).await;
    let balancer = Balancer::start(e.server.listen_addr()).await;
    let mut env = case_env(&e);
    env["balancerUrl"] = json!(balancer.url());
    let backend = e.server.listen_addr().to_string();
    // Same backend: every connection through the balancer is cut, as a
    // network drop would, and the redial reaches the same server.
    let cut = || balancer.switch(&backend);
    run_case("dropped_socket_resumes_without_duplicates", env, &[("cut", &cut)]).await;
}

/// The page's socket goes through a balancer that freezes it (open, nothing
/// forwarded): the page's liveness check finds no answer and redials from
/// its offset (docs/WEB.md, "Liveness").
#[actix_rt::test]
async fn a_frozen_connection_is_dropped_and_resumed() {
    let e = start(false, &[]).await;
    let balancer = Balancer::start(e.server.listen_addr()).await;
    let mut env = case_env(&e);
    env["balancerUrl"] = json!(balancer.url());
    let stall = || balancer.stall();
    run_case("a_frozen_connection_is_dropped_and_resumed", env, &[("stall", &stall)]).await;
}

/// Two instances on PostgreSQL and Redis; the daemon dials A through a
/// balancer, the page uses B. Moving the daemon to B closes the page's
/// socket 4503 (host moved); the page redials at once and continues.
#[actix_rt::test]
async fn host_moved_redials_at_once() {
    let (a, b) = support::instance_pair().await;
    let api = Api::new(b.url(), create_token(&a, "ann"));
    let balancer = Balancer::start(a.listen_addr()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let _daemon = DaemonProcess::start_url(&balancer.url(), &api.token, &dir.path().join("state"));
    let host = wait_online(&api).await;
    let env = json!({
        "url": b.url(),
        "token": api.token,
        "hostId": host,
        "screenshots": screenshot_dir(),
    });
    let move_to_b = || balancer.switch(b.listen_addr());
    run_case("host_moved_redials_at_once", env, &[("move", &move_to_b)]).await;
}

#[actix_rt::test]
async fn runs_list_and_log() {
    let e = start(false, &[]).await;
    let (status, body) = e
        .api
        .post(
            "/api/v1/runs",
            json!({"hostId": e.host, "argv": ["sh", "-c", "echo run-output-$((5*5)); exit 4"], "dir": "/tmp"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let mut env = case_env(&e);
    env["runId"] = body["run"]["id"].clone();
    run_case("runs_list_and_log", env, &[]).await;
}

/// A share token (`POST /tokens {terminalId}`, what `tether share` makes)
/// opens its terminal's address read-only, and says so before anyone types.
#[actix_rt::test]
async fn share_token_watches_read_only() {
    let e = start(false, &[]).await;
    let id = terminal(&e, &["sh"]).await;
    let (status, body) = e.api.post("/api/v1/tokens", json!({"terminalId": id})).await;
    assert_eq!(status, 201, "{body}");
    let mut env = case_env(&e);
    env["terminalId"] = json!(id);
    env["shareToken"] = body["secret"].clone();
    run_case("share_token_watches_read_only", env, &[]).await;
}

/// The daemon goes away while a terminal runs: the page's Kill is refused
/// (`409 host_offline`) and the page shows the server's reason.
#[actix_rt::test]
async fn kill_refused_shows_the_server_error() {
    let mut e = start(false, &[]).await;
    let env = case_env(&e);
    let daemon = std::cell::RefCell::new(&mut e.daemon);
    let stop_daemon = || daemon.borrow_mut().kill();
    run_case("kill_refused_shows_the_server_error", env, &[("stop-daemon", &stop_daemon)]).await;
}

#[test]
fn page_logic_unit_tests() {
    run_unit_tests();
}

fn client() -> awc::Client {
    awc::Client::builder().timeout(Duration::from_secs(30)).finish()
}

async fn get(url: &str, headers: &[(&str, &str)]) -> (u16, awc::http::header::HeaderMap, Vec<u8>) {
    let mut req = client().get(url);
    for (k, v) in headers {
        req = req.insert_header((*k, *v));
    }
    let mut res = req.send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let body = res.body().limit(8 * 1024 * 1024).await.expect("body").to_vec();
    (res.status().as_u16(), res.headers().clone(), body)
}

fn header<'a>(headers: &'a awc::http::header::HeaderMap, name: &str) -> &'a str {
    headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

#[actix_rt::test]
async fn page_is_served_with_types_cache_and_csp() {
    let server = TetherServer::start(&[], &[]).await;
    let base = server.url();
    let (status, headers, body) = get(&format!("{base}/"), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "content-type"), "text/html; charset=utf-8");
    assert_eq!(header(&headers, "cache-control"), "no-cache");
    let csp = header(&headers, "content-security-policy");
    for part in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
        assert!(csp.contains(part), "CSP {csp:?} lacks {part:?}");
    }
    assert!(
        !csp.contains("unsafe-eval")
            && !csp.split(';').any(|d| d.contains("script-src") && d.contains("unsafe-inline"))
    );
    let html = String::from_utf8(body).expect("utf8");
    assert!(!html.contains("<script>") && !html.contains(" on"), "no inline script or handler:\n{html}");

    // Revalidation: the ETag answers 304.
    let etag = header(&headers, "etag").to_string();
    assert!(!etag.is_empty());
    let (status, _, _) = get(&format!("{base}/"), &[("If-None-Match", &etag)]).await;
    assert_eq!(status, 304);

    // Hashed assets: immutable, the right types, compressed when asked.
    let assets: Vec<&str> = html.split('"').filter(|part| part.starts_with("/assets/")).collect();
    let asset = |ext: &str| {
        assets.iter().find(|a| a.ends_with(ext)).unwrap_or_else(|| panic!("no {ext} in {html}")).to_string()
    };
    for (ext, ty) in [(".js", "text/javascript; charset=utf-8"), (".css", "text/css; charset=utf-8")] {
        let path = asset(ext);
        let (status, headers, body) = get(&format!("{base}{path}"), &[("Accept-Encoding", "gzip")]).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(header(&headers, "content-type"), ty, "{path}");
        assert_eq!(header(&headers, "cache-control"), "public, max-age=31536000, immutable", "{path}");
        assert_eq!(header(&headers, "content-encoding"), "gzip", "{path}");
        assert!(body.len() > 1000);
    }
    let (status, headers, body) = get(&format!("{base}/manifest.webmanifest"), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "content-type"), "application/manifest+json");
    let manifest: Value = serde_json::from_slice(&body).expect("manifest JSON");
    for icon in manifest["icons"].as_array().expect("icons") {
        let (status, headers, _) = get(&format!("{base}{}", icon["src"].as_str().expect("src")), &[]).await;
        assert_eq!(status, 200, "{icon}");
        assert_eq!(header(&headers, "content-type"), icon["type"].as_str().expect("type"));
    }
    let (status, _, _) = get(&format!("{base}/assets/main-NOPE.js"), &[]).await;
    assert_eq!(status, 404);
    let (status, _, _) = get(&format!("{base}/assets/..%2fCargo.toml"), &[]).await;
    assert_eq!(status, 404);

    // --web-dir serves the page from disk instead.
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("index.html"), "<!doctype html>from-disk").expect("write");
    let dir_arg = dir.path().display().to_string();
    let dev = TetherServer::start(&[], &["--web-dir", &dir_arg]).await;
    let (status, _, body) = get(&format!("{}/", dev.url()), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(body, b"<!doctype html>from-disk");
}

/// The status of a viewer upgrade sent with `origin`: 101 or the refusal.
async fn upgrade_status(url: &str, token: &str, origin: Option<&str>) -> u16 {
    upgrade_status_with(url, token, origin, &[]).await
}

/// [`upgrade_status`] with more request headers.
async fn upgrade_status_with(url: &str, token: &str, origin: Option<&str>, headers: &[(&str, &str)]) -> u16 {
    let mut req = client().ws(url).protocols(["tether.v1", &format!("tether.auth.{token}")]);
    if let Some(origin) = origin {
        req = req.origin(origin);
    }
    for (name, value) in headers {
        req = req.set_header(*name, *value);
    }
    match req.connect().await {
        Ok((res, _)) => res.status().as_u16(),
        Err(awc::error::WsClientError::InvalidResponseStatus(status)) => status.as_u16(),
        Err(e) => panic!("ws {url}: {e}"),
    }
}

#[actix_rt::test]
async fn websocket_from_another_origin_gets_403() {
    let e = start(false, &[("TETHER_HTTP__ALLOWED_ORIGINS", "https://friend.example")]).await;
    let id = terminal(&e, &["sh"]).await;
    let url = viewer_url(&e.server, &id);
    let token = &e.api.token;
    assert_eq!(upgrade_status(&url, token, Some("http://evil.example")).await, 403);
    assert_eq!(upgrade_status(&url, token, Some("null")).await, 403);
    assert_eq!(upgrade_status(&url, token, Some(&e.server.url())).await, 101, "own origin");
    assert_eq!(upgrade_status(&url, token, Some("https://friend.example")).await, 101, "http.allowed_origins");
    assert_eq!(upgrade_status(&url, token, None).await, 101, "no Origin: not a browser");
    let daemon = format!("{}/ws/v1/daemon", e.server.ws_url());
    assert_eq!(upgrade_status(&daemon, token, Some("http://evil.example")).await, 403, "daemon socket too");

    // What a proxy says the request's own origin is, is not believed from
    // a peer outside http.trusted_proxies (here: none)...
    let proxied = "https://tether.example";
    let named: [&[(&str, &str)]; 2] = [
        &[("X-Forwarded-Host", "tether.example"), ("X-Forwarded-Proto", "https")],
        &[("Forwarded", "host=tether.example;proto=https")],
    ];
    for headers in named {
        assert_eq!(upgrade_status_with(&url, token, Some(proxied), headers).await, 403, "{headers:?}");
    }
    // ... and is from a trusted proxy: the page is served under its name.
    let behind = start(false, &[("TETHER_HTTP__TRUSTED_PROXIES", "127.0.0.0/8")]).await;
    let id = terminal(&behind, &["sh"]).await;
    let (url, token) = (viewer_url(&behind.server, &id), &behind.api.token);
    for headers in named {
        assert_eq!(upgrade_status_with(&url, token, Some(proxied), headers).await, 101, "{headers:?}");
    }
}
