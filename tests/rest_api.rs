//! The REST API of docs/REST.md against both real store backends, in process:
//! each request goes through the same actix-web app `tether serve` runs.
//! Every error path asserts the status and the error code.

mod support;

use std::sync::Arc;

use actix_web::dev::ServiceResponse;
use actix_web::http::StatusCode;
use actix_web::test::{call_service, init_service, read_body, TestRequest};
use actix_web::{web, App};
use serde_json::{json, Value};
use tether::config::Settings;
use tether::http::state::{AppState, Instance, Role};
use tether::store::{self, host_lease_key, Store};

/// A store plus whatever must outlive it.
struct Fixture {
    state: web::Data<AppState>,
    _dir: Option<tempfile::TempDir>,
}

async fn fixture(postgres: bool) -> Fixture {
    fixture_with(postgres, |_| {}).await
}

/// A fixture whose settings `tweak` changes first.
async fn fixture_with(postgres: bool, tweak: impl FnOnce(&mut Settings)) -> Fixture {
    let mut settings = Settings::default();
    settings.http.max_body_bytes = 4096;
    tweak(&mut settings);
    let dir = if postgres {
        settings.database.url = Some(support::pg_database().await);
        None
    } else {
        let dir = tempfile::tempdir().expect("temp dir");
        settings.database.sqlite_path = dir.path().join("t.db");
        Some(dir)
    };
    let store: Arc<dyn Store> = store::open(&settings).await.expect("open store");
    let state =
        AppState::start(Arc::new(settings), store, Instance::new("cell-a".into(), Role::Combined)).expect("state");
    state.start_bus_subscriber();
    Fixture { state, _dir: dir }
}

macro_rules! app {
    ($fx:expr) => {
        init_service(App::new().app_data($fx.state.clone()).wrap_fn(tether::http::record_metrics).configure(|cfg| {
            tether::http::configure(cfg, 4096, tether::http::routes::Serving::of(Role::Combined, false))
        }))
        .await
    };
}

async fn token(state: &AppState, user: &str) -> String {
    let user = state.store.ensure_user(user).await.expect("user");
    let token = tether::auth::generate_token();
    state.store.insert_token(&store::NewToken::full(user.id, &tether::auth::hash_token(&token))).await.expect("token");
    token
}

async fn json_body(res: ServiceResponse) -> Value {
    let bytes = read_body(res).await;
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
}

/// Asserts an error response: status and `error.code`.
async fn expect_error(res: ServiceResponse, status: StatusCode, code: &str) {
    assert_eq!(res.status(), status, "status");
    let body = json_body(res).await;
    assert_eq!(body["error"]["code"], code, "error code in {body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "error message in {body}");
}

fn auth(req: TestRequest, token: &str) -> TestRequest {
    req.insert_header(("Authorization", format!("Bearer {token}")))
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite_backend {
            $(#[actix_rt::test] async fn $name() { super::$name(super::fixture(false).await).await })*
        }
        mod postgres_backend {
            $(#[actix_rt::test] async fn $name() { super::$name(super::fixture(true).await).await })*
        }
    };
}

both_backends!(
    hosts_register_list_get_delete,
    terminals_create_pending_list_get_delete,
    runs_create_list_get_log,
    unauthorized_is_401,
    other_users_resources_are_404,
    bad_input_is_400,
    oversized_body_is_413,
    conflicts_are_409,
    ops_endpoints,
    bad_optional_bodies_are_refused,
    audit_lists_the_callers_own_events,
);

/// At most 2 live terminals per host and 3 per user.
async fn capped_fixture(postgres: bool) -> Fixture {
    fixture_with(postgres, |s| {
        s.terminals.max_per_host = 2;
        s.terminals.max_per_user = 3;
    })
    .await
}

#[actix_rt::test]
async fn terminal_caps_sqlite() {
    terminals_and_runs_past_the_caps_are_429(capped_fixture(false).await).await
}

#[actix_rt::test]
async fn terminal_caps_postgres() {
    terminals_and_runs_past_the_caps_are_429(capped_fixture(true).await).await
}

#[actix_rt::test]
async fn terminal_caps_hold_under_concurrent_creates_sqlite() {
    concurrent_creates_never_pass_the_cap(capped_fixture(false).await).await
}

#[actix_rt::test]
async fn terminal_caps_hold_under_concurrent_creates_postgres() {
    concurrent_creates_never_pass_the_cap(capped_fixture(true).await).await
}

async fn register_host<S>(app: &S, token: &str, hostname: &str) -> Value
where
    S: actix_web::dev::Service<actix_http::Request, Response = ServiceResponse, Error = actix_web::Error>,
{
    let res = call_service(
        app,
        auth(TestRequest::post().uri("/api/v1/hosts"), token)
            .set_json(json!({"name": "n", "hostname": hostname, "platform": "linux", "arch": "x86_64"}))
            .to_request(),
    )
    .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    json_body(res).await["host"].clone()
}

async fn hosts_register_list_get_delete(fx: Fixture) {
    let app = app!(fx);
    let t = token(&fx.state, "ann").await;
    let host = register_host(&app, &t, "box").await;
    assert_eq!(host["state"], "offline");
    assert_eq!(host["hostname"], "box");
    assert!(host["capabilities"].is_object() && host["dirs"].is_array());
    assert!(host.get("lastSeenAt").is_some(), "camelCase field names");
    let again = register_host(&app, &t, "box").await;
    assert_eq!(again["id"], host["id"], "upsert by user + hostname");
    let id = host["id"].as_str().expect("id");

    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/hosts"), &t).to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(json_body(res).await["hosts"].as_array().map(Vec::len), Some(1));
    let res = call_service(&app, auth(TestRequest::get().uri(&format!("/api/v1/hosts/{id}")), &t).to_request()).await;
    assert_eq!(json_body(res).await["host"]["id"], id);

    let res =
        call_service(&app, auth(TestRequest::delete().uri(&format!("/api/v1/hosts/{id}")), &t).to_request()).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let res = call_service(&app, auth(TestRequest::get().uri(&format!("/api/v1/hosts/{id}")), &t).to_request()).await;
    expect_error(res, StatusCode::NOT_FOUND, "not_found").await;
}

async fn terminals_create_pending_list_get_delete(fx: Fixture) {
    let app = app!(fx);
    let t = token(&fx.state, "ann").await;
    let host = register_host(&app, &t, "box").await;
    let res = call_service(
        &app,
        auth(TestRequest::post().uri("/api/v1/terminals"), &t)
            .set_json(json!({"hostId": host["id"], "argv": ["sh"], "cols": 100, "rows": 30, "title": "build"}))
            .to_request(),
    )
    .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let term = json_body(res).await["terminal"].clone();
    assert_eq!(term["state"], "pending");
    assert_eq!(term["pendingReason"], "host_offline");
    assert_eq!((term["cols"].as_u64(), term["rows"].as_u64()), (Some(100), Some(30)));
    assert_eq!(term["hostId"], host["id"]);
    let id = term["id"].as_str().expect("id");

    let uri = format!("/api/v1/terminals?hostId={}&state=pending", host["id"].as_str().expect("id"));
    let res = call_service(&app, auth(TestRequest::get().uri(&uri), &t).to_request()).await;
    assert_eq!(json_body(res).await["terminals"].as_array().map(Vec::len), Some(1));
    let res =
        call_service(&app, auth(TestRequest::get().uri("/api/v1/terminals?state=running"), &t).to_request()).await;
    assert_eq!(json_body(res).await["terminals"].as_array().map(Vec::len), Some(0));
    let res =
        call_service(&app, auth(TestRequest::get().uri(&format!("/api/v1/terminals/{id}")), &t).to_request()).await;
    assert_eq!(json_body(res).await["terminal"]["id"], id);
    let res =
        call_service(&app, auth(TestRequest::delete().uri(&format!("/api/v1/terminals/{id}")), &t).to_request()).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let res =
        call_service(&app, auth(TestRequest::get().uri(&format!("/api/v1/terminals/{id}")), &t).to_request()).await;
    expect_error(res, StatusCode::NOT_FOUND, "not_found").await;
}

async fn runs_create_list_get_log(fx: Fixture) {
    let app = app!(fx);
    let t = token(&fx.state, "ann").await;
    let host = register_host(&app, &t, "box").await;
    let res = call_service(
        &app,
        auth(TestRequest::post().uri("/api/v1/runs"), &t)
            .set_json(json!({"hostId": host["id"], "argv": ["sh", "-c", "echo out"]}))
            .to_request(),
    )
    .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let run = json_body(res).await["run"].clone();
    assert_eq!(run["state"], "queued");
    assert_eq!(run["usage"], Value::Null);
    let id = run["id"].as_str().expect("id");
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/runs"), &t).to_request()).await;
    assert_eq!(json_body(res).await["runs"].as_array().map(Vec::len), Some(1));
    let res = call_service(&app, auth(TestRequest::get().uri(&format!("/api/v1/runs/{id}")), &t).to_request()).await;
    assert_eq!(json_body(res).await["run"]["argv"], json!(["sh", "-c", "echo out"]));
    let res =
        call_service(&app, auth(TestRequest::get().uri(&format!("/api/v1/runs/{id}/log")), &t).to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert!(read_body(res).await.is_empty());

    // `?state=` filters, with `?hostId=` and across pages.
    let other = register_host(&app, &t, "other").await;
    let mut ids = vec![id.to_string()];
    for on in [&host, &other] {
        let res = call_service(
            &app,
            auth(TestRequest::post().uri("/api/v1/runs"), &t)
                .set_json(json!({"hostId": on["id"], "argv": ["true"]}))
                .to_request(),
        )
        .await;
        assert_eq!(res.status(), StatusCode::CREATED);
        ids.push(json_body(res).await["run"]["id"].as_str().expect("id").to_string());
    }
    let run_id = uuid::Uuid::parse_str(&ids[0]).expect("uuid");
    assert!(fx.state.store.finish_run(run_id, store::RunState::Failed, Some(1)).await.expect("finish"));
    let listed = |uri: String| {
        let app = &app;
        let t = &t;
        async move {
            let res = call_service(app, auth(TestRequest::get().uri(&uri), t).to_request()).await;
            assert_eq!(res.status(), StatusCode::OK, "{uri}");
            let body = json_body(res).await;
            let ids: Vec<String> =
                body["runs"].as_array().expect("runs").iter().map(|r| r["id"].as_str().expect("id").into()).collect();
            (ids, body["nextCursor"].as_str().map(String::from))
        }
    };
    let hid = host["id"].as_str().expect("id");
    assert_eq!(listed("/api/v1/runs?state=failed".into()).await, (vec![ids[0].clone()], None));
    assert_eq!(listed("/api/v1/runs?state=queued".into()).await.0, ids[1..]);
    assert_eq!(listed("/api/v1/runs?state=running".into()).await, (vec![], None));
    assert_eq!(listed(format!("/api/v1/runs?hostId={hid}&state=queued")).await, (vec![ids[1].clone()], None));
    assert_eq!(listed(format!("/api/v1/runs?hostId={hid}&state=failed")).await, (vec![ids[0].clone()], None));
    let (first, cursor) = listed("/api/v1/runs?state=queued&limit=1".into()).await;
    assert_eq!(first, [ids[1].clone()]);
    let cursor = cursor.expect("a next page");
    assert_eq!(listed(format!("/api/v1/runs?state=queued&limit=1&after={cursor}")).await, (vec![ids[2].clone()], None));
}

async fn unauthorized_is_401(fx: Fixture) {
    let app = app!(fx);
    let res = call_service(&app, TestRequest::get().uri("/api/v1/hosts").to_request()).await;
    expect_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/hosts"), "tth_notarealtoken").to_request()).await;
    expect_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let res = call_service(
        &app,
        TestRequest::get().uri("/api/v1/hosts").insert_header(("Authorization", "Basic abc")).to_request(),
    )
    .await;
    expect_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let t = token(&fx.state, "ann").await;
    let res = call_service(&app, TestRequest::get().uri(&format!("/api/v1/hosts?token={t}")).to_request()).await;
    expect_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let res =
        call_service(&app, TestRequest::post().uri("/api/v1/terminals").set_json(json!({"hostId": "x"})).to_request())
            .await;
    expect_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
}

async fn other_users_resources_are_404(fx: Fixture) {
    let app = app!(fx);
    let ann = token(&fx.state, "ann").await;
    let bob = token(&fx.state, "bob").await;
    let host = register_host(&app, &ann, "box").await;
    let hid = host["id"].as_str().expect("id");
    let res = call_service(
        &app,
        auth(TestRequest::post().uri("/api/v1/terminals"), &ann).set_json(json!({"hostId": hid})).to_request(),
    )
    .await;
    let tid = json_body(res).await["terminal"]["id"].as_str().expect("id").to_string();
    let res = call_service(
        &app,
        auth(TestRequest::post().uri("/api/v1/runs"), &ann)
            .set_json(json!({"hostId": hid, "argv": ["true"]}))
            .to_request(),
    )
    .await;
    let rid = json_body(res).await["run"]["id"].as_str().expect("id").to_string();

    for uri in [
        format!("/api/v1/hosts/{hid}"),
        format!("/api/v1/terminals/{tid}"),
        format!("/api/v1/runs/{rid}"),
        format!("/api/v1/runs/{rid}/log"),
    ] {
        let res = call_service(&app, auth(TestRequest::get().uri(&uri), &bob).to_request()).await;
        expect_error(res, StatusCode::NOT_FOUND, "not_found").await;
    }
    let res =
        call_service(&app, auth(TestRequest::delete().uri(&format!("/api/v1/hosts/{hid}")), &bob).to_request()).await;
    expect_error(res, StatusCode::NOT_FOUND, "not_found").await;
    let res =
        call_service(&app, auth(TestRequest::delete().uri(&format!("/api/v1/terminals/{tid}")), &bob).to_request())
            .await;
    expect_error(res, StatusCode::NOT_FOUND, "not_found").await;
    let res = call_service(
        &app,
        auth(TestRequest::post().uri("/api/v1/terminals"), &bob).set_json(json!({"hostId": hid})).to_request(),
    )
    .await;
    expect_error(res, StatusCode::NOT_FOUND, "not_found").await;
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/hosts"), &bob).to_request()).await;
    assert_eq!(json_body(res).await["hosts"], json!([]));
    // Nothing of ann's changed.
    let res =
        call_service(&app, auth(TestRequest::get().uri(&format!("/api/v1/terminals/{tid}")), &ann).to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/no-such-route"), &ann).to_request()).await;
    expect_error(res, StatusCode::NOT_FOUND, "not_found").await;
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/hosts/not-a-uuid"), &ann).to_request()).await;
    expect_error(res, StatusCode::NOT_FOUND, "not_found").await;
}

async fn bad_input_is_400(fx: Fixture) {
    let app = app!(fx);
    let t = token(&fx.state, "ann").await;
    let host = register_host(&app, &t, "box").await;
    let hid = host["id"].as_str().expect("id").to_string();
    // Record an allowlist as a daemon hello would.
    let host_uuid = uuid::Uuid::parse_str(&hid).expect("uuid");
    fx.state.store.set_host_dirs(host_uuid, &["/home/ann".into()]).await.expect("dirs");

    let cases: Vec<(&str, Value, &str)> = vec![
        ("/api/v1/hosts", json!({"hostname": ""}), "missing_field"),
        ("/api/v1/hosts", json!({"platform": "linux"}), "bad_json"),
        ("/api/v1/hosts", json!({"hostname": "x".repeat(300)}), "field_too_long"),
        ("/api/v1/hosts", json!({"hostname": "a\u{7}b"}), "invalid_field"),
        ("/api/v1/terminals", json!({"hostId": "nope"}), "invalid_id"),
        ("/api/v1/terminals", json!({"hostId": hid, "cols": 0}), "invalid_grid"),
        ("/api/v1/terminals", json!({"hostId": hid, "rows": 1001}), "invalid_grid"),
        ("/api/v1/terminals", json!({"hostId": hid, "argv": "sh"}), "bad_json"),
        ("/api/v1/terminals", json!({"hostId": hid, "argv": ["a\u{0}b"]}), "invalid_argv"),
        ("/api/v1/terminals", json!({"hostId": hid, "dir": "/etc"}), "dir_not_allowed"),
        ("/api/v1/terminals", json!({"hostId": hid, "dir": "/home/ann/../bob"}), "invalid_dir"),
        ("/api/v1/terminals", json!({"hostId": hid, "dir": "relative"}), "invalid_dir"),
        ("/api/v1/runs", json!({"hostId": hid, "argv": []}), "missing_field"),
        ("/api/v1/runs", json!({"hostId": hid}), "bad_json"),
        ("/api/v1/runs", json!({"hostId": hid, "argv": ["ls"], "dir": "/root"}), "dir_not_allowed"),
    ];
    for (uri, body, code) in cases {
        let res = call_service(&app, auth(TestRequest::post().uri(uri), &t).set_json(&body).to_request()).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{uri} {body}");
        let got = json_body(res).await;
        assert_eq!(got["error"]["code"], code, "{uri} {body} -> {got}");
    }
    let res = call_service(
        &app,
        auth(TestRequest::post().uri("/api/v1/hosts"), &t)
            .insert_header(("Content-Type", "application/json"))
            .set_payload("{not json")
            .to_request(),
    )
    .await;
    expect_error(res, StatusCode::BAD_REQUEST, "bad_json").await;
    let res =
        call_service(&app, auth(TestRequest::get().uri("/api/v1/terminals?state=sleeping"), &t).to_request()).await;
    expect_error(res, StatusCode::BAD_REQUEST, "invalid_state").await;
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/terminals?hostId=zzz"), &t).to_request()).await;
    expect_error(res, StatusCode::BAD_REQUEST, "invalid_id").await;
    for state in ["sleeping", "QUEUED", "pending", ""] {
        let uri = format!("/api/v1/runs?state={state}");
        let res = call_service(&app, auth(TestRequest::get().uri(&uri), &t).to_request()).await;
        expect_error(res, StatusCode::BAD_REQUEST, "invalid_state").await;
    }
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/runs?hostId=zzz"), &t).to_request()).await;
    expect_error(res, StatusCode::BAD_REQUEST, "invalid_id").await;
    // Nothing was created by the refused requests.
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/terminals"), &t).to_request()).await;
    assert_eq!(json_body(res).await["terminals"], json!([]));
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/runs"), &t).to_request()).await;
    assert_eq!(json_body(res).await["runs"], json!([]));
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/hosts"), &t).to_request()).await;
    assert_eq!(json_body(res).await["hosts"].as_array().map(Vec::len), Some(1));
    // A dir inside the allowlist is accepted.
    let res = call_service(
        &app,
        auth(TestRequest::post().uri("/api/v1/terminals"), &t)
            .set_json(json!({"hostId": hid, "dir": "/home/ann/src"}))
            .to_request(),
    )
    .await;
    assert_eq!(res.status(), StatusCode::CREATED);
}

async fn oversized_body_is_413(fx: Fixture) {
    let app = app!(fx);
    let t = token(&fx.state, "ann").await;
    let res = call_service(
        &app,
        auth(TestRequest::post().uri("/api/v1/hosts"), &t)
            .set_json(json!({"hostname": "box", "name": "x".repeat(8000)}))
            .to_request(),
    )
    .await;
    expect_error(res, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/hosts"), &t).to_request()).await;
    assert_eq!(json_body(res).await["hosts"], json!([]), "nothing registered");
}

async fn conflicts_are_409(fx: Fixture) {
    let app = app!(fx);
    let t = token(&fx.state, "ann").await;
    let host = register_host(&app, &t, "box").await;
    let hid = host["id"].as_str().expect("id").to_string();
    let host_uuid = uuid::Uuid::parse_str(&hid).expect("uuid");
    // A live lease means a daemon holds the host somewhere in the cluster.
    fx.state
        .store
        .claim_lease(
            &host_lease_key(host_uuid),
            &tether::store::LeaseHolder::connection("other#abc123", 1),
            std::time::Duration::from_secs(30),
        )
        .await
        .expect("lease");
    let res = call_service(&app, auth(TestRequest::get().uri(&format!("/api/v1/hosts/{hid}")), &t).to_request()).await;
    assert_eq!(json_body(res).await["host"]["state"], "online", "state is live, from the lease");
    let res =
        call_service(&app, auth(TestRequest::delete().uri(&format!("/api/v1/hosts/{hid}")), &t).to_request()).await;
    expect_error(res, StatusCode::CONFLICT, "host_online").await;
    let res = call_service(&app, auth(TestRequest::get().uri(&format!("/api/v1/hosts/{hid}")), &t).to_request()).await;
    assert_eq!(res.status(), StatusCode::OK, "the host is still there");

    let res = call_service(
        &app,
        auth(TestRequest::post().uri("/api/v1/terminals"), &t).set_json(json!({"hostId": hid})).to_request(),
    )
    .await;
    let tid = json_body(res).await["terminal"]["id"].as_str().expect("id").to_string();
    let term_uuid = uuid::Uuid::parse_str(&tid).expect("uuid");
    assert!(fx.state.store.mark_started(host_uuid, term_uuid).await.expect("started"));
    let res =
        call_service(&app, auth(TestRequest::delete().uri(&format!("/api/v1/terminals/{tid}")), &t).to_request()).await;
    expect_error(res, StatusCode::CONFLICT, "terminal_live").await;
    let res =
        call_service(&app, auth(TestRequest::get().uri(&format!("/api/v1/terminals/{tid}")), &t).to_request()).await;
    assert_eq!(json_body(res).await["terminal"]["state"], "running");
}

async fn ops_endpoints(fx: Fixture) {
    let app = app!(fx);
    let res = call_service(&app, TestRequest::get().uri("/healthz").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = call_service(&app, TestRequest::get().uri("/readyz").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let body = json_body(res).await;
    assert_eq!(body["checks"]["database"], "ok");
    assert_eq!(body["checks"]["bus"], "not_configured");
    let res = call_service(&app, TestRequest::get().uri("/api/v1/instance").to_request()).await;
    let body = json_body(res).await;
    assert_eq!(body["cellId"], "cell-a");
    assert_eq!(body["role"], "combined");
    assert_eq!(body["admitMode"], "db");
    let id = body["instanceId"].as_str().expect("instanceId");
    let (cell, suffix) = id.rsplit_once('#').expect("cell#suffix");
    assert_eq!(cell, "cell-a");
    assert!(suffix.len() == 6 && suffix.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    let res = call_service(&app, TestRequest::get().uri("/metrics").to_request()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let text = String::from_utf8(read_body(res).await.to_vec()).expect("utf8");
    assert!(text.contains("tether_http_requests_total"), "{text}");
    assert!(text.contains("route=\"/api/v1/instance\""), "{text}");
    assert!(text.contains("tether_http_request_duration_seconds"), "{text}");
    assert!(text.contains("tether_store_pool_size"), "{text}");
    let queries = text
        .lines()
        .find(|l| l.starts_with("tether_store_queries_total{"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no tether_store_queries_total in {text}"));
    assert!(queries >= 2, "/readyz asked the database at least twice: {queries}");
}

/// A body that is present must parse and fit, also where the body is
/// optional: a malformed or oversized kill body is refused before anything
/// is sent (it used to be read as "no body" and the kill went ahead); a
/// token needs no body at all.
async fn bad_optional_bodies_are_refused(fx: Fixture) {
    let app = app!(fx);
    let t = token(&fx.state, "ann").await;
    let host = register_host(&app, &t, "box").await;
    let hid = host["id"].as_str().expect("id").to_string();
    let res = call_service(
        &app,
        auth(TestRequest::post().uri("/api/v1/terminals"), &t).set_json(json!({"hostId": hid})).to_request(),
    )
    .await;
    let tid = json_body(res).await["terminal"]["id"].as_str().expect("id").to_string();
    // Running, as far as the store knows, on a host that is not connected:
    // a kill that gets past its body is answered 409 host_offline.
    let (host_uuid, terminal_uuid) = (hid.parse().expect("uuid"), tid.parse().expect("uuid"));
    assert!(fx.state.store.claim_launch(host_uuid, terminal_uuid).await.expect("claim"));
    assert!(fx.state.store.mark_started(host_uuid, terminal_uuid).await.expect("start"));
    // null in an optional field is the field left out, whichever field.
    let (status, made) =
        post(&app, &t, "/api/v1/hosts", json!({"hostname": "nulls", "name": null, "platform": null, "arch": null}))
            .await;
    assert_eq!(
        (status, &made["host"]["name"], &made["host"]["platform"]),
        (StatusCode::CREATED, &json!("nulls"), &json!(""))
    );
    let body = json!({"hostId": hid, "argv": null, "dir": null, "cols": null, "title": null});
    let (status, made) = post(&app, &t, "/api/v1/terminals", body).await;
    assert_eq!((status, &made["terminal"]["argv"]), (StatusCode::CREATED, &json!([])), "{made}");
    let kill = format!("/api/v1/terminals/{tid}/kill");
    let post = |payload: String| {
        auth(TestRequest::post().uri(&kill), &t)
            .insert_header(("Content-Type", "application/json"))
            .set_payload(payload)
            .to_request()
    };
    expect_error(call_service(&app, post("{not json".into())).await, StatusCode::BAD_REQUEST, "bad_json").await;
    expect_error(call_service(&app, post("\"TERM\"".into())).await, StatusCode::BAD_REQUEST, "bad_json").await;
    // A struct is not read from an array, or anything but an object.
    for not_an_object in ["[]", "[\"TERM\"]", "null", " 9", " ", "\n\n"] {
        let res = call_service(&app, post(not_an_object.into())).await;
        expect_error(res, StatusCode::BAD_REQUEST, "bad_json").await;
    }
    let oversized = format!("{{\"signal\": \"TERM\", \"pad\": \"{}\"}}", "x".repeat(8000));
    expect_error(call_service(&app, post(oversized)).await, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    expect_error(
        call_service(&app, post(r#"{"signal": "NOPE"}"#.into())).await,
        StatusCode::BAD_REQUEST,
        "invalid_signal",
    )
    .await;
    // No body and a good body both get as far as the host, as does input.
    let res = call_service(&app, auth(TestRequest::post().uri(&kill), &t).to_request()).await;
    expect_error(res, StatusCode::CONFLICT, "host_offline").await;
    expect_error(call_service(&app, post(r#"{"signal": 9}"#.into())).await, StatusCode::CONFLICT, "host_offline").await;
    let input = auth(TestRequest::post().uri(&format!("/api/v1/terminals/{tid}/input")), &t)
        .set_json(json!({"data": "ls\n"}))
        .to_request();
    expect_error(call_service(&app, input).await, StatusCode::CONFLICT, "host_offline").await;

    // Every field of a new token is optional, so is the body: none makes
    // a full token; a malformed one is still refused.
    let res = call_service(&app, auth(TestRequest::post().uri("/api/v1/tokens"), &t).to_request()).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let made = json_body(res).await;
    assert_eq!(made["token"]["scope"], "full", "{made}");
    assert!(made["secret"].as_str().is_some_and(|s| !s.is_empty()), "{made}");
    let bad = auth(TestRequest::post().uri("/api/v1/tokens"), &t)
        .insert_header(("Content-Type", "application/json"))
        .set_payload("{not json")
        .to_request();
    expect_error(call_service(&app, bad).await, StatusCode::BAD_REQUEST, "bad_json").await;

    // A body that is there must say it is JSON (or say nothing), as a
    // required one must: a form post makes no token and kills nothing.
    for (uri, content_type) in [
        ("/api/v1/tokens", "application/x-www-form-urlencoded"),
        ("/api/v1/tokens", "text/plain"),
        (kill.as_str(), "text/plain"),
        // Not a media type at all is not "no Content-Type".
        ("/api/v1/tokens", "foo"),
        ("/api/v1/tokens", "json"),
        ("/api/v1/tokens", " "),
        (kill.as_str(), "text/plain, application/json"),
    ] {
        let res = call_service(
            &app,
            auth(TestRequest::post().uri(uri), &t)
                .insert_header(("Content-Type", content_type))
                .set_payload(r#"{"signal": "KILL"}"#)
                .to_request(),
        )
        .await;
        expect_error(res, StatusCode::BAD_REQUEST, "bad_content_type").await;
    }
    // Two Content-Types: which one holds is anyone's guess, so neither does.
    let two = auth(TestRequest::post().uri("/api/v1/tokens"), &t)
        .append_header(("Content-Type", "application/json"))
        .append_header(("Content-Type", "text/plain"))
        .set_payload("{}")
        .to_request();
    expect_error(call_service(&app, two).await, StatusCode::BAD_REQUEST, "bad_content_type").await;
    // Routes that take no fields hold a body that is there to the same rules.
    for refresh in ["limits", "credentials"] {
        let uri = format!("/api/v1/hosts/{hid}/{refresh}/refresh");
        for (payload, code) in [("{bad", "bad_json"), ("[]", "bad_json"), ("  ", "bad_json")] {
            let res = call_service(
                &app,
                auth(TestRequest::post().uri(&uri), &t)
                    .insert_header(("Content-Type", "application/json"))
                    .set_payload(payload)
                    .to_request(),
            )
            .await;
            expect_error(res, StatusCode::BAD_REQUEST, code).await;
        }
        let res = call_service(
            &app,
            auth(TestRequest::post().uri(&uri), &t)
                .insert_header(("Content-Type", "text/plain"))
                .set_payload("{}")
                .to_request(),
        )
        .await;
        expect_error(res, StatusCode::BAD_REQUEST, "bad_content_type").await;
    }
    let tokens =
        json_body(call_service(&app, auth(TestRequest::get().uri("/api/v1/tokens"), &t).to_request()).await).await;
    assert_eq!(tokens["tokens"].as_array().map(Vec::len), Some(2), "the fixture's and the one made above: {tokens}");
    // Events are written in the order they were recorded: by the time the
    // token's creation is there, a kill or input recorded before it would be.
    let events = wait_for_audit(&fx, &t, |events| events.iter().any(|e| e["action"] == "token_created")).await;
    let refused = events.iter().filter(|e| e["action"] == "kill" || e["action"] == "input").count();
    assert_eq!(refused, 0, "a request that never reached the daemon is not audited: {events:?}");
}

/// Polls `GET /api/v1/audit` (events are written in the background) until
/// `done` accepts them; returns them.
async fn wait_for_audit(fx: &Fixture, token: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let app = app!(fx);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/audit"), token).to_request()).await;
        assert_eq!(res.status(), StatusCode::OK);
        let events = json_body(res).await["events"].as_array().cloned().unwrap_or_default();
        if done(&events) {
            return events;
        }
        assert!(std::time::Instant::now() < deadline, "audit events never arrived: {events:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn audit_lists_the_callers_own_events(fx: Fixture) {
    let app = app!(fx);
    let ann = token(&fx.state, "ann").await;
    let bob = token(&fx.state, "bob").await;
    let before = chrono::Utc::now() - chrono::Duration::seconds(1);
    let host = register_host(&app, &ann, "box").await;
    let hid = host["id"].as_str().expect("id").to_string();
    let res = call_service(
        &app,
        auth(TestRequest::post().uri("/api/v1/terminals"), &ann).set_json(json!({"hostId": hid})).to_request(),
    )
    .await;
    let tid = json_body(res).await["terminal"]["id"].as_str().expect("id").to_string();
    let events = wait_for_audit(&fx, &ann, |events| events.len() >= 2).await;
    assert_eq!(events.len(), 2, "{events:?}");
    let (spawn, registered) = (&events[0], &events[1]);
    assert_eq!(spawn["action"], "spawn", "newest first: {events:?}");
    assert_eq!(spawn["terminalId"], tid.as_str());
    assert_eq!(spawn["hostId"], hid.as_str());
    assert_eq!(registered["action"], "host_registered");
    assert_eq!(registered["hostId"], hid.as_str());
    assert!(registered.get("terminalId").is_none(), "{registered}");
    for event in &events {
        assert!(event["id"].as_str().is_some_and(|id| uuid::Uuid::parse_str(id).is_ok()), "{event}");
        assert!(event["at"].as_str().is_some(), "{event}");
        assert_eq!(event["instanceId"], fx.state.instance.instance_id.as_str());
        assert!(event["userId"].as_str().is_some(), "{event}");
        assert!(event.as_object().expect("object").contains_key("tokenId"), "{event}");
    }
    // Another user sees none of them.
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/audit"), &bob).to_request()).await;
    assert_eq!(json_body(res).await["events"], json!([]));
    // since and limit.
    let get = |uri: String| call_service(&app, auth(TestRequest::get().uri(&uri), &ann).to_request());
    let since = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let res = get(format!("/api/v1/audit?since={}", since(before))).await;
    assert_eq!(json_body(res).await["events"].as_array().map(Vec::len), Some(2));
    let later = chrono::Utc::now() + chrono::Duration::seconds(60);
    let res = get(format!("/api/v1/audit?since={}", since(later))).await;
    assert_eq!(json_body(res).await["events"], json!([]));
    let res = get("/api/v1/audit?limit=1".into()).await;
    let limited = json_body(res).await;
    assert_eq!(limited["events"].as_array().map(Vec::len), Some(1));
    assert_eq!(limited["events"][0]["action"], "spawn");
    expect_error(get("/api/v1/audit?since=yesterday".into()).await, StatusCode::BAD_REQUEST, "invalid_since").await;
    expect_error(get("/api/v1/audit?limit=0".into()).await, StatusCode::BAD_REQUEST, "invalid_limit").await;
    expect_error(get("/api/v1/audit?limit=5001".into()).await, StatusCode::BAD_REQUEST, "invalid_limit").await;
    for not_a_number in ["x", "-1", "1.0", ""] {
        let res = get(format!("/api/v1/audit?limit={not_a_number}")).await;
        expect_error(res, StatusCode::BAD_REQUEST, "invalid_limit").await;
    }
    let res = call_service(&app, TestRequest::get().uri("/api/v1/audit").to_request()).await;
    expect_error(res, StatusCode::UNAUTHORIZED, "unauthorized").await;
}

/// POSTs `body` to `uri`; returns the status and the JSON answer.
async fn post<S>(app: &S, token: &str, uri: &str, body: Value) -> (StatusCode, Value)
where
    S: actix_web::dev::Service<actix_http::Request, Response = ServiceResponse, Error = actix_web::Error>,
{
    let res = call_service(app, auth(TestRequest::post().uri(uri), token).set_json(&body).to_request()).await;
    (res.status(), json_body(res).await)
}

/// Live terminals count against `terminals.max_per_host` and
/// `terminals.max_per_user`, queued runs with them; one more is 429
/// `too_many_terminals` and creates nothing; an exited terminal frees its
/// place.
async fn terminals_and_runs_past_the_caps_are_429(fx: Fixture) {
    let app = app!(fx);
    let t = token(&fx.state, "ann").await;
    let a = register_host(&app, &t, "a").await["id"].clone();
    let b = register_host(&app, &t, "b").await["id"].clone();
    let (status, first) = post(&app, &t, "/api/v1/terminals", json!({"hostId": a})).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, body) = post(&app, &t, "/api/v1/runs", json!({"hostId": a, "argv": ["true"]})).await;
    assert_eq!(status, StatusCode::CREATED, "a queued run takes the host's second place: {body}");
    for (uri, body) in
        [("/api/v1/terminals", json!({"hostId": a})), ("/api/v1/runs", json!({"hostId": a, "argv": ["true"]}))]
    {
        let (status, got) = post(&app, &t, uri, body).await;
        assert_eq!(
            (status, got["error"]["code"].as_str()),
            (StatusCode::TOO_MANY_REQUESTS, Some("too_many_terminals"))
        );
        let message = got["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("terminals.max_per_host"), "{got}");
    }
    let (status, body) = post(&app, &t, "/api/v1/terminals", json!({"hostId": b})).await;
    assert_eq!(status, StatusCode::CREATED, "another host has room: {body}");
    let (status, got) = post(&app, &t, "/api/v1/terminals", json!({"hostId": b})).await;
    assert_eq!((status, got["error"]["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("too_many_terminals")));
    assert!(got["error"]["message"].as_str().unwrap_or_default().contains("terminals.max_per_user"), "{got}");
    // The refusals created nothing.
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/terminals"), &t).to_request()).await;
    assert_eq!(json_body(res).await["terminals"].as_array().map(Vec::len), Some(2));
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/runs"), &t).to_request()).await;
    assert_eq!(json_body(res).await["runs"].as_array().map(Vec::len), Some(1));
    // Another user is not counted with ann.
    let bob = token(&fx.state, "bob").await;
    let bobs = register_host(&app, &bob, "a").await["id"].clone();
    let (status, body) = post(&app, &bob, "/api/v1/terminals", json!({"hostId": bobs})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // An exited terminal no longer counts.
    let host_id = uuid::Uuid::parse_str(a.as_str().expect("id")).expect("uuid");
    let id = uuid::Uuid::parse_str(first["terminal"]["id"].as_str().expect("id")).expect("uuid");
    assert!(fx.state.store.claim_launch(host_id, id).await.expect("launch"));
    assert!(fx.state.store.mark_exited(host_id, id, Default::default()).await.expect("exit"));
    let (status, body) = post(&app, &t, "/api/v1/terminals", json!({"hostId": b})).await;
    assert_eq!(status, StatusCode::CREATED, "the exited terminal's place is free: {body}");
}

/// Many creates at once for one host: exactly the cap's worth are made.
async fn concurrent_creates_never_pass_the_cap(fx: Fixture) {
    let app = app!(fx);
    let t = token(&fx.state, "ann").await;
    let host = register_host(&app, &t, "box").await["id"].clone();
    let creates = (0..8).map(|_| post(&app, &t, "/api/v1/terminals", json!({"hostId": host})));
    let statuses: Vec<StatusCode> = futures_util::future::join_all(creates).await.into_iter().map(|(s, _)| s).collect();
    let created = statuses.iter().filter(|s| **s == StatusCode::CREATED).count();
    let refused = statuses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count();
    assert_eq!((created, refused), (2, 6), "{statuses:?}");
    let res = call_service(&app, auth(TestRequest::get().uri("/api/v1/terminals"), &t).to_request()).await;
    assert_eq!(json_body(res).await["terminals"].as_array().map(Vec::len), Some(2));
}
