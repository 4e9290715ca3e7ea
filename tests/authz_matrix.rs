//! The authorization matrix (docs/REST.md, "Scopes"), generated from the
//! route table `tether::http::routes::ROUTES`: for every REST route and both
//! sockets, a request without a token, with a revoked token, with an
//! expired token, with another user's token and with each scope that does
//! not reach the route is refused (401/404/403, or 4401/4403 on a socket),
//! and the database holds exactly what it held before. The cluster's
//! `/internal` routes take no user token at all: each of those, ann's
//! `full` token too, is 401.
//!
//! A route added to the table without a case here fails
//! `every_route_is_refused_to_whoever_it_does_not_reach` with its name.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::client::{create_token, hello, Api, Event, Socket};
use support::TetherServer;
use tether::auth::Access;
use tether::http::routes::{RouteSpec, ROUTES};
use tether::store::postgres::PgStore;
use tether::store::{NewToken, PageAfter, Store};

/// Who knocks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Who {
    NoToken,
    Revoked,
    Expired,
    OtherUser,
    Read,
    Daemon,
    /// A share token of ann's second terminal (every case names the first).
    ShareOfOther,
}

impl Who {
    const ALL: [Who; 7] =
        [Who::NoToken, Who::Revoked, Who::Expired, Who::OtherUser, Who::Read, Who::Daemon, Who::ShareOfOther];

    /// The scopes' reach, written out here independently of the server's
    /// own check (`Principal::may`).
    fn reaches(self, access: Access) -> bool {
        match self {
            Who::Read => matches!(access, Access::Read | Access::ReadTerminal | Access::ViewerSocket),
            Who::Daemon => matches!(access, Access::RegisterHost | Access::DaemonSocket | Access::Assign),
            _ => false,
        }
    }
}

/// Ann's resources the cases name.
struct World {
    host: String,
    terminal: String,
    run: String,
    read_token_id: String,
}

/// A concrete request for a table row: path, body, and whether it names
/// one of ann's resources (only then does another user's token get 404;
/// on a list or create route it acts on its own user).
fn case_for(spec: &RouteSpec, w: &World) -> (String, Option<Value>, bool) {
    let id = |path: &str, id: &str| path.replace("{id}", id);
    let host_body = json!({"hostId": w.host});
    match (spec.method, spec.path) {
        ("GET", "/ws/v1/daemon") => (spec.path.into(), None, true),
        ("GET", "/ws/v1/terminals/{id}") => (id(spec.path, &w.terminal), None, true),
        ("POST", "/api/v1/hosts") => {
            (spec.path.into(), Some(json!({"name": "new", "hostname": "new-box", "platform": "linux"})), false)
        }
        ("GET", "/api/v1/hosts" | "/api/v1/terminals" | "/api/v1/runs" | "/api/v1/tokens" | "/api/v1/audit") => {
            (spec.path.into(), None, false)
        }
        ("GET" | "DELETE", "/api/v1/hosts/{id}") => (id(spec.path, &w.host), None, true),
        ("POST", "/api/v1/hosts/{id}/dirs") => (id(spec.path, &w.host), Some(json!({"path": "/srv"})), true),
        ("DELETE", "/api/v1/hosts/{id}/dirs") => (format!("{}?path=/tmp", id(spec.path, &w.host)), None, true),
        ("POST", "/api/v1/hosts/{id}/limits/refresh" | "/api/v1/hosts/{id}/credentials/refresh") => {
            (id(spec.path, &w.host), Some(json!({})), true)
        }
        ("POST", "/api/v1/terminals") => (spec.path.into(), Some(host_body), true),
        ("GET" | "DELETE", "/api/v1/terminals/{id}") => (id(spec.path, &w.terminal), None, true),
        ("POST", "/api/v1/terminals/{id}/input") => {
            (id(spec.path, &w.terminal), Some(json!({"data": "rm -rf ~\r"})), true)
        }
        ("POST", "/api/v1/terminals/{id}/resize") => {
            (id(spec.path, &w.terminal), Some(json!({"cols": 100, "rows": 30})), true)
        }
        ("POST", "/api/v1/terminals/{id}/kill") => (id(spec.path, &w.terminal), Some(json!({"signal": "KILL"})), true),
        ("POST", "/api/v1/runs") => (spec.path.into(), Some(json!({"hostId": w.host, "argv": ["true"]})), true),
        ("GET", "/api/v1/runs/{id}" | "/api/v1/runs/{id}/log") => (id(spec.path, &w.run), None, true),
        ("POST", "/api/v1/tokens") => (spec.path.into(), Some(json!({"scope": "full"})), false),
        ("DELETE", "/api/v1/tokens/{id}") => (id(spec.path, &w.read_token_id), None, true),
        ("GET", "/internal/v1/cells") => (spec.path.into(), None, false),
        ("PUT", "/internal/v1/cells/{cellId}/admit-mode") => (
            spec.path.replace("{cellId}", MATRIX_CELL),
            Some(json!({"admitMode": "reserve", "deadManTripSlots": 2})),
            false,
        ),
        ("POST", "/v1/assign") => (spec.path.into(), Some(host_body), true),
        ("GET", "/internal/v1/seats") => (spec.path.into(), None, false),
        ("POST", "/internal/v1/reserve") => {
            (spec.path.into(), Some(json!({"items": [{"hostId": w.host, "epoch": 1, "ttlMs": 1000}]})), false)
        }
        (method, path) => panic!("no authorization matrix case for {method} {path}: add one to tests/authz_matrix.rs"),
    }
}

/// The cell the matrix's cluster-route cases name.
const MATRIX_CELL: &str = "relay-matrix";

/// Everything the requests could have changed, as text: ann's and bob's
/// hosts with their cell assignments, terminals, runs and tokens (a
/// token's last use aside), and the cell switch the cluster-route cases
/// would write.
async fn database_state(store: &PgStore) -> String {
    let mut state = format!("{:?}\n", store.cell_switch(MATRIX_CELL).await.expect("switch"));
    for name in ["ann", "bob"] {
        let user = store.ensure_user(name).await.expect("user");
        let hosts = store.list_hosts(user.id).await.expect("hosts");
        for host in &hosts {
            let assignment = store.assignment(host.id).await.expect("assignment");
            state.push_str(&format!("{} assigned to {assignment:?}\n", host.id));
        }
        let terminals =
            store.page_terminals(user.id, &Default::default(), &PageAfter::first(usize::MAX)).await.expect("terminals");
        let runs = store.list_runs(user.id, &Default::default(), &PageAfter::first(100)).await.expect("runs");
        let mut tokens = store.list_tokens(user.id).await.expect("tokens");
        for t in &mut tokens {
            t.last_used_at = None;
        }
        state.push_str(&format!("{name}:\n{hosts:?}\n{terminals:?}\n{runs:?}\n{tokens:?}\n"));
    }
    state
}

/// The close code a socket gets right after connecting (and, on the daemon
/// socket, saying hello for ann's host).
async fn socket_close(
    server: &TetherServer,
    spec: &RouteSpec,
    path: &str,
    token: Option<&str>,
    host: &str,
) -> Option<u16> {
    let url = format!("{}{}", server.ws_url(), path);
    let daemon = spec.access == Access::DaemonSocket;
    let protocol = if daemon { "tether.daemon.v1" } else { "tether.v1" };
    let mut sock = Socket::connect(&url, token, &[protocol]).await;
    if daemon {
        sock.send_frame(hello(host)).await;
    }
    loop {
        match sock.next_within(Duration::from_secs(10)).await {
            Some(Event::Close(code)) => return code,
            Some(Event::Ping) => continue,
            Some(other) => panic!("{} {path}: expected a close, got {other:?}", spec.method),
            None => panic!("{} {path}: the socket stayed open", spec.method),
        }
    }
}

/// Sends a case's request.
async fn send(api: &Api, spec: &RouteSpec, path: &str, body: &Option<Value>) -> (u16, Value) {
    match (spec.method, body) {
        ("GET", _) => api.get(path).await,
        ("DELETE", _) => api.delete(path).await,
        ("POST", Some(body)) => api.post(path, body.clone()).await,
        ("PUT", Some(body)) => api.put(path, body.clone()).await,
        // The cluster-secret probes send no body: 400, past the secret check, and nothing written.
        ("PUT", None) => api.put(path, Value::Null).await,
        ("POST", None) => api.post(path, Value::Null).await,
        (method, _) => panic!("{method} {path}: no way to send it"),
    }
}

#[actix_rt::test]
async fn every_route_is_refused_to_whoever_it_does_not_reach() {
    let url = support::pg_database().await;
    let cluster_secret = "matrix-cluster-secret-0123456789";
    // With the director enabled, the combined instance serves every route of the table.
    let env = [
        ("TETHER_DATABASE__URL", url.as_str()),
        ("TETHER_CLUSTER__SECRET", cluster_secret),
        ("TETHER_DIRECTOR__ENABLED", "true"),
    ];
    let server = TetherServer::start(&env, &[]).await;
    let store = PgStore::connect(&url, 4).await.expect("connect");
    let ann_token = create_token(&server, "ann");
    let ann = Api::new(server.url(), ann_token.clone());
    let bob = create_token(&server, "bob");

    let (status, host) =
        ann.post("/api/v1/hosts", json!({"name": "box", "hostname": "box", "platform": "linux"})).await;
    assert_eq!(status, 201, "{host}");
    let host = host["host"]["id"].as_str().expect("host id").to_string();
    let mut terminals = Vec::new();
    for _ in 0..2 {
        let (status, t) = ann.post("/api/v1/terminals", json!({"hostId": host})).await;
        assert_eq!(status, 201, "{t}");
        terminals.push(t["terminal"]["id"].as_str().expect("terminal id").to_string());
    }
    let (status, run) = ann.post("/api/v1/runs", json!({"hostId": host, "argv": ["true"]})).await;
    assert_eq!(status, 201, "{run}");
    let run = run["run"]["id"].as_str().expect("run id").to_string();
    let token = |body: Value| {
        let ann = &ann;
        async move {
            let (status, made) = ann.post("/api/v1/tokens", body).await;
            assert_eq!(status, 201, "{made}");
            (
                made["token"]["id"].as_str().expect("id").to_string(),
                made["secret"].as_str().expect("secret").to_string(),
            )
        }
    };
    let (read_id, read) = token(json!({"scope": "read"})).await;
    let (_, daemon) = token(json!({"scope": "daemon"})).await;
    let (_, share_other) = token(json!({"terminalId": terminals[1]})).await;
    let (revoked_id, revoked) = token(json!({})).await;
    assert_eq!(ann.delete(&format!("/api/v1/tokens/{revoked_id}")).await.0, 204);
    let expired = tether::auth::generate_token();
    let ann_user = store.ensure_user("ann").await.expect("ann");
    store
        .insert_token(&NewToken {
            expires_at: Some(chrono::Utc::now() - chrono::Duration::minutes(1)),
            ..NewToken::full(ann_user.id, &tether::auth::hash_token(&expired))
        })
        .await
        .expect("expired token");
    let world = World { host: host.clone(), terminal: terminals[0].clone(), run, read_token_id: read_id };
    let secret = |who: Who| -> Option<&str> {
        match who {
            Who::NoToken => None,
            Who::Revoked => Some(&revoked),
            Who::Expired => Some(&expired),
            Who::OtherUser => Some(&bob),
            Who::Read => Some(&read),
            Who::Daemon => Some(&daemon),
            Who::ShareOfOther => Some(&share_other),
        }
    };

    let before = database_state(&store).await;
    let mut checked = 0;
    for spec in ROUTES {
        // Writes are for full tokens only (a daemon token may register its
        // host and ask where it dials) and for the cluster.
        if spec.method != "GET" {
            assert!(
                matches!(spec.access, Access::Control | Access::RegisterHost | Access::Assign | Access::ClusterSecret),
                "{} {} changes state but is open to {:?}",
                spec.method,
                spec.path,
                spec.access
            );
        }
        if spec.access == Access::Public {
            assert!(
                ["/healthz", "/readyz", "/metrics", "/api/v1/instance"].contains(&spec.path),
                "{} is public: say so in this list and in docs/REST.md",
                spec.path
            );
            continue;
        }
        let (path, body, names_ann_resource) = case_for(spec, &world);
        if spec.access == Access::ClusterSecret {
            assert!(spec.path.starts_with("/internal/"), "{} takes the cluster secret outside /internal", spec.path);
            // No user token reaches the cluster's routes, not even a full one.
            let full = Some(ann_token.as_str());
            for token in Who::ALL.iter().map(|who| secret(*who)).chain([full, Some("not-the-cluster-secret")]) {
                let (status, answer) = send(&Api::new(server.url(), token.unwrap_or("")), spec, &path, &body).await;
                assert_eq!(status, 401, "{token:?} on {} {path}: {answer}", spec.method);
                assert_eq!(answer["error"]["code"], "unauthorized", "{} {path}: {answer}", spec.method);
                checked += 1;
            }
            let (status, answer) = send(&Api::new(server.url(), cluster_secret), spec, &path, &None).await;
            assert_ne!(status, 401, "the cluster secret itself is let through {} {path}: {answer}", spec.method);
            continue;
        }
        for who in Who::ALL {
            let expected = match who {
                Who::NoToken | Who::Revoked | Who::Expired => (401, 4401),
                Who::OtherUser if names_ann_resource => (404, 4403),
                Who::OtherUser => continue,
                _ if who.reaches(spec.access) => continue,
                _ => (403, 4403),
            };
            if spec.is_socket() {
                let code = socket_close(&server, spec, &path, secret(who), &host).await;
                assert_eq!(code, Some(expected.1), "{who:?} on {} {path}", spec.method);
            } else {
                let api = Api::new(server.url(), secret(who).unwrap_or(""));
                let (status, answer) = send(&api, spec, &path, &body).await;
                assert_eq!(status, expected.0, "{who:?} on {} {path}: {answer}", spec.method);
                let code = match expected.0 {
                    401 => "unauthorized",
                    403 => "insufficient_scope",
                    _ => "not_found",
                };
                assert_eq!(answer["error"]["code"], code, "{who:?} on {} {path}: {answer}", spec.method);
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} refusals checked");
    assert_eq!(database_state(&store).await, before, "a refused request changed the database");

    // The reads a read token reaches do answer it (the matrix is not
    // passing because everything is refused).
    let reader = Api::new(server.url(), read.as_str());
    for path in ["/api/v1/hosts", &format!("/api/v1/terminals/{}", terminals[0]), "/api/v1/runs"] {
        assert_eq!(reader.get(path).await.0, 200, "read token on {path}");
    }
}
