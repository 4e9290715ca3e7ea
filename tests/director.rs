//! The director (docs/CELLS.md, "Running a director"): a real
//! `tether serve --role director` on PostgreSQL, placing hosts on cells
//! that share its database. The placement rules are shown against scripted
//! cells (`support::cell_peer`: a seat feed and a reserve call answered as
//! a cell would, with what they answer set by the test); the daemon's side
//! against real `tether serve --role cell` processes and a real
//! `tether daemon` pointed at the director.
//!
//! Time is short settings (`director.poll_ms` 200 ms, `director.fresh_ms`
//! 1 s), and every wait is for an event (a count of polls a cell saw, a
//! lease holder), never for a duration.

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::cell_peer::CellPeer;
use support::client::{create_token, Api};
use support::daemon::DaemonProcess;
use support::TetherServer;
use tether::cell::bookings::ReserveAnswer;
use tether::cell::feed::AssignAnswer;
use tether::cell::AdmitMode;
use tether::director::ticket::{TicketKey, TicketSubject};
use tether::store::postgres::PgStore;
use tether::store::{host_lease_key, CellRow, LeaseHolder, Store};
use uuid::Uuid;

const SECRET: &str = "director-test-cluster-secret-0123";
/// Polls of a cell that stopped answering before the director surely
/// counts it stale: `director.fresh_ms` / `director.poll_ms`, and margin.
const POLLS_TO_GO_STALE: u32 = 1_000 / 200 + 3;
/// Polls after a write to the registry before the director surely read it:
/// the third poll's registry read started after the write (each cell's
/// poll waits for its previous one, and registry reads do not overlap).
const POLLS_TO_RELIST: u32 = 3;

async fn director(database_url: &str) -> TetherServer {
    let env = [
        ("TETHER_DATABASE__URL", database_url),
        ("TETHER_CLUSTER__SECRET", SECRET),
        ("TETHER_DIRECTOR__POLL_MS", "200"),
        ("TETHER_DIRECTOR__FRESH_MS", "1000"),
    ];
    TetherServer::start(&env, &["--role", "director"]).await
}

async fn register_cell(store: &PgStore, cell_id: &str, url: &str, switch: AdmitMode, row: Option<AdmitMode>) {
    let cell = CellRow {
        cell_id: cell_id.into(),
        url: url.into(),
        region: "test".into(),
        pool_size: 10,
        reserve_pool_size: 4,
    };
    store.register_cell(&cell).await.expect("register the cell");
    store.set_cell_switch(cell_id, Some(switch), None).await.expect("the cell's switch");
    if let Some(mode) = row {
        store.write_cell_effective(cell_id, mode, "boot-1").await.expect("the cell's effective row");
    }
}

/// Registers a host of the token's user through the director.
async fn new_host(api: &Api, name: &str) -> Uuid {
    let (status, body) = api.post("/api/v1/hosts", json!({"name": name, "hostname": name, "platform": "linux"})).await;
    assert_eq!(status, 201, "{body}");
    body["host"]["id"].as_str().and_then(|id| id.parse().ok()).expect("host id")
}

async fn assign(api: &Api, host: Uuid) -> (u16, Value) {
    api.post("/v1/assign", json!({"hostId": host})).await
}

async fn assigned(api: &Api, host: Uuid) -> AssignAnswer {
    let (status, body) = assign(api, host).await;
    assert_eq!(status, 200, "assign {host}: {body}");
    serde_json::from_value(body).expect("an AssignAnswer")
}

#[actix_rt::test]
async fn reserve_placement_books_only_fresh_reserve_cells_then_falls_back_to_the_database() {
    let url = support::pg_database().await;
    let store = PgStore::connect(&url, 4).await.expect("store");
    store.migrate().await.expect("migrate");
    let light = CellPeer::start("light", SECRET, 0).await;
    let busy = CellPeer::start("busy", SECRET, 10).await;
    let switched = CellPeer::start("switched", SECRET, 0).await;
    let tripped = CellPeer::start("tripped", SECRET, 0).await;
    register_cell(&store, "light", &light.url, AdmitMode::Reserve, Some(AdmitMode::Reserve)).await;
    register_cell(&store, "busy", &busy.url, AdmitMode::Reserve, Some(AdmitMode::Reserve)).await;
    register_cell(&store, "switched", &switched.url, AdmitMode::Db, None).await;
    register_cell(&store, "tripped", &tripped.url, AdmitMode::Reserve, Some(AdmitMode::Db)).await;
    let director = director(&url).await;
    let ann = Api::new(director.url(), create_token(&director, "ann"));
    let first = new_host(&ann, "first").await;
    light.wait_polls(2).await;
    busy.wait_polls(2).await;

    // Two fresh reserve cells: the lighter is booked, with a ticket the
    // cells can check with the cluster secret alone.
    let answer = assigned(&ann, first).await;
    assert_eq!((answer.cell_id.as_str(), answer.cell_url.as_str(), answer.epoch), ("light", light.url.as_str(), 1));
    let key = TicketKey::new(SECRET.as_bytes()).expect("key");
    let ann_id = store.user_by_name("ann").await.expect("read").expect("ann").id;
    let subject = TicketSubject { host_id: first, user_id: ann_id, cell_id: "light", epoch: 1 };
    let now = chrono::Utc::now().timestamp_millis();
    assert_eq!(key.verify(&answer.ticket, &subject, now), Ok(answer.expires_at.timestamp_millis()));
    let booked = light.reserves();
    assert_eq!(booked.len(), 1, "{booked:?}");
    assert_eq!((booked[0].host_id, booked[0].epoch), (first, 1));
    assert!(booked[0].ttl_ms > 0 && booked[0].ttl_ms <= 30_000, "{booked:?}");

    // The light cell stops answering its feed: once it is stale, every
    // host goes to the busy one.
    light.set_answering(false);
    light.wait_polls(POLLS_TO_GO_STALE).await;
    for n in 0..5 {
        let host = new_host(&ann, &format!("host-{n}")).await;
        let answer = assigned(&ann, host).await;
        assert_eq!((answer.cell_id.as_str(), answer.epoch), ("busy", 1), "{answer:?}");
        assert!(!answer.ticket.is_empty());
    }
    assert_eq!(light.reserves().len(), 1, "a stale cell was booked");
    assert_eq!(busy.reserves().len(), 5);

    // The busy cell refuses: after it, the database path, on a db cell or
    // a tripped one (its own row says db), never a reserve row; each
    // assignment writes the epoch + 1, with no ticket.
    busy.set_reserve_answer(ReserveAnswer::Full);
    let late = new_host(&ann, "late").await;
    for epoch in 1..=3 {
        let answer = assigned(&ann, late).await;
        assert!(["switched", "tripped"].contains(&answer.cell_id.as_str()), "{answer:?}");
        assert_eq!((answer.epoch, answer.ticket.as_str()), (epoch, ""), "{answer:?}");
        assert_eq!(store.assignment(late).await.expect("assignment"), Some((answer.cell_id.clone(), epoch)));
    }
    assert!(switched.reserves().is_empty() && tripped.reserves().is_empty(), "a non-reserve cell was booked");
    for peer in [&light, &busy, &switched, &tripped] {
        assert_eq!(peer.unauthorized(), 0, "the director called a cell without the cluster secret");
    }

    // Only the host's owner, and a daemon token only for its own host.
    let bob = Api::new(director.url(), create_token(&director, "bob"));
    let (status, body) = assign(&bob, late).await;
    assert_eq!((status, &body["error"]["code"]), (404, &json!("not_found")), "{body}");
    let bound =
        director.run(&["token", "create", "--user", "ann", "--scope", "daemon", "--host", &first.to_string()], &[]);
    assert!(bound.status.success(), "{}", String::from_utf8_lossy(&bound.stderr));
    let bound = Api::new(director.url(), String::from_utf8_lossy(&bound.stdout).trim());
    let (status, body) = assign(&bound, late).await;
    assert_eq!((status, &body["error"]["code"]), (403, &json!("token_bound_to_other_host")), "{body}");
    assert_eq!(assign(&bound, first).await.0, 200, "a daemon token assigns its own host");
    // Its body follows the API's conventions: unknown fields are ignored,
    // a malformed id is invalid_id.
    let (status, body) = bound.post("/v1/assign", json!({"hostId": first, "extra": 1})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = bound.post("/v1/assign", json!({"hostId": "nope"})).await;
    assert_eq!((status, &body["error"]["code"]), (400, &json!("invalid_id")), "{body}");
    // A director serves placement, not the relay; its card says so.
    assert_eq!(ann.get("/api/v1/terminals").await.0, 404);
    let (status, card) = ann.get("/api/v1/instance").await;
    assert_eq!(status, 200, "{card}");
    assert_eq!((&card["role"], &card["admitMode"], &card["cell"]), (&json!("director"), &json!("db"), &Value::Null));
    // Nor does it export a cell's metrics: count(tether_cell_held) counts cells.
    let (status, metrics) = ann.get_bytes("/metrics").await;
    let metrics = String::from_utf8_lossy(&metrics);
    assert_eq!(status, 200);
    assert!(metrics.contains("tether_viewer_connections"), "{metrics}");
    assert!(!metrics.contains("tether_cell_"), "{metrics}");
}

#[actix_rt::test]
async fn the_database_path_never_places_on_a_held_cell_but_takes_it_once_it_trips() {
    let url = support::pg_database().await;
    let store = PgStore::connect(&url, 4).await.expect("store");
    store.migrate().await.expect("migrate");
    // Held: its switch and its row say reserve, and its feed is quiet.
    let held = CellPeer::start("held", SECRET, 0).await;
    held.set_answering(false);
    let db = CellPeer::start("db", SECRET, 0).await;
    register_cell(&store, "held", &held.url, AdmitMode::Reserve, Some(AdmitMode::Reserve)).await;
    register_cell(&store, "db", &db.url, AdmitMode::Db, None).await;
    let director = director(&url).await;
    let ann = Api::new(director.url(), create_token(&director, "ann"));
    held.wait_polls(POLLS_TO_RELIST).await;
    db.wait_polls(POLLS_TO_RELIST).await;

    // A host connected to the held cell (its lease holder is an instance
    // of that cell) at epoch 4.
    let connected = new_host(&ann, "connected").await;
    store.record_assignments("held", &[(connected, 4)]).await.expect("assignment");
    let holder = LeaseHolder::connection("held#a1b2c3", 1);
    assert!(store.claim_lease(&host_lease_key(connected), &holder, Duration::from_secs(600)).await.expect("lease"));

    for n in 0..10 {
        let host = new_host(&ann, &format!("new-{n}")).await;
        let answer = assigned(&ann, host).await;
        assert_eq!((answer.cell_id.as_str(), answer.epoch, answer.ticket.as_str()), ("db", 1, ""), "{answer:?}");
    }
    // The connected host stays where it is, at its epoch, though a db cell
    // could take it.
    let answer = assigned(&ann, connected).await;
    assert_eq!((answer.cell_id.as_str(), answer.cell_url.as_str(), answer.epoch), ("held", held.url.as_str(), 4));
    assert_eq!(store.assignment(connected).await.expect("assignment"), Some(("held".into(), 4)));
    // A host connected to the held cell whose row names another cell (it
    // was booked there, and a trip elsewhere wrote the row): it stays, and
    // the row is made to say so, at the next epoch. With the stale row, the
    // held cell's database check sent the daemon to the other cell (4409),
    // which sent it back to the director: round and round.
    let moved = new_host(&ann, "moved").await;
    store.record_assignments("db", &[(moved, 6)]).await.expect("assignment");
    let holder = LeaseHolder::connection("held#a1b2c3", 2);
    assert!(store.claim_lease(&host_lease_key(moved), &holder, Duration::from_secs(600)).await.expect("lease"));
    let answer = assigned(&ann, moved).await;
    assert_eq!((answer.cell_id.as_str(), answer.epoch, answer.ticket.as_str()), ("held", 7, ""), "{answer:?}");
    assert_eq!(store.assignment(moved).await.expect("assignment"), Some(("held".into(), 7)));

    // The db cell goes: its switch says reserve, its feed is quiet and it
    // writes no row. With only the held cell left, a new host has no cell.
    db.set_answering(false);
    store.set_cell_switch("db", Some(AdmitMode::Reserve), None).await.expect("switch");
    db.wait_polls(POLLS_TO_GO_STALE).await;
    let waiting = new_host(&ann, "waiting").await;
    for _ in 0..3 {
        let (status, body) = assign(&ann, waiting).await;
        assert_eq!((status, &body["error"]["code"]), (503, &json!("no_cell")), "{body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("no cell can take")), "{body}");
    }
    assert_eq!(store.assignment(waiting).await.expect("assignment"), None);

    // The held cell trips (its own row says db): it takes database
    // placements from the director's next registry read on.
    store.write_cell_effective("held", AdmitMode::Db, "boot-1").await.expect("trip");
    held.wait_polls(POLLS_TO_RELIST).await;
    for epoch in 1..=2 {
        let answer = assigned(&ann, waiting).await;
        assert_eq!((answer.cell_id.as_str(), answer.epoch, answer.ticket.as_str()), ("held", epoch, ""), "{answer:?}");
        assert_eq!(store.assignment(waiting).await.expect("assignment"), Some(("held".into(), epoch)));
    }
    assert!(held.reserves().is_empty() && db.reserves().is_empty(), "nothing was booked");

    let (status, text) = ann.get_bytes("/metrics").await;
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&text);
    for line in [
        "tether_director_assignments_total{path=\"database\"} 12",
        "tether_director_assignments_total{path=\"stay\"} 2",
        "tether_director_assignments_total{path=\"none\"} 3",
    ] {
        assert!(text.contains(line), "no {line:?} in /metrics:\n{text}");
    }
}

/// A real cell process for `cell_id` on a port chosen here, so its
/// `cell.url` can name it.
async fn cell_process(database_url: &str, cell_id: &str) -> TetherServer {
    let listen = format!("127.0.0.1:{}", support::free_port());
    let url = format!("http://{listen}");
    let env = [
        ("TETHER_DATABASE__URL", database_url),
        ("TETHER_CLUSTER__SECRET", SECRET),
        ("TETHER_HTTP__LISTEN", listen.as_str()),
        ("TETHER_CELL__ID", cell_id),
        ("TETHER_CELL__URL", url.as_str()),
    ];
    TetherServer::start(&env, &["--role", "cell"]).await
}

/// A real `tether daemon` of user ann, with a daemon token, pointed at the
/// director.
fn daemon_of_ann(director: &TetherServer, state: &std::path::Path) -> DaemonProcess {
    DaemonProcess::start_url(&director.url(), &daemon_token_of_ann(director), state)
}

/// A new daemon token of user ann.
fn daemon_token_of_ann(director: &TetherServer) -> String {
    let token = director.run(&["token", "create", "--user", "ann", "--scope", "daemon"], &[]);
    assert!(token.status.success(), "{}", String::from_utf8_lossy(&token.stderr));
    String::from_utf8_lossy(&token.stdout).trim().to_string()
}

/// A director and a db cell `cell-a` on a fresh database (its URL), with a
/// store on it.
async fn director_and_cell_a() -> (String, Arc<PgStore>, TetherServer, TetherServer) {
    let url = support::pg_database().await;
    let store: Arc<PgStore> = Arc::new(PgStore::connect(&url, 4).await.expect("store"));
    let director = director(&url).await;
    let cell_a = cell_process(&url, "cell-a").await;
    register_cell(&store, "cell-a", &cell_a.url(), AdmitMode::Db, None).await;
    (url, store, director, cell_a)
}

/// The host ann's daemon registered (through the director), once it did.
async fn registered_host(store: &PgStore, daemon: &DaemonProcess) -> Uuid {
    let ann = store.ensure_user("ann").await.expect("ann");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(host) = store.list_hosts(ann.id).await.expect("hosts").first() {
            return host.id;
        }
        assert!(tokio::time::Instant::now() < deadline, "no host registered; the daemon's log:\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The cell whose instance holds the host's lease, once it is `cell_id`.
async fn wait_connected_on(store: &PgStore, host: Uuid, cell_id: &str, daemon: &DaemonProcess) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let holder = store.lease_holder(&host_lease_key(host)).await.expect("lease holder");
        if holder.as_ref().is_some_and(|h| tether::director::assign::cell_of_instance(&h.instance) == cell_id) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the daemon did not connect to {cell_id} (lease holder {holder:?}); its log:\n{}",
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[actix_rt::test]
async fn a_daemon_pointed_at_the_director_connects_to_its_cell_and_asks_again_when_the_cell_goes() {
    let (url, store, director, cell_a) = director_and_cell_a().await;
    let state = tempfile::tempdir().expect("state dir");
    let daemon = daemon_of_ann(&director, state.path());

    // It registers through the director, asks where to dial, and dials cell-a.
    let host = registered_host(&store, &daemon).await;
    wait_connected_on(&store, host, "cell-a", &daemon).await;
    let (cell, first_epoch) = store.assignment(host).await.expect("assignment").expect("the host was placed");
    assert_eq!(cell, "cell-a");

    // cell-a goes away and may take no more hosts; cell-b comes. The
    // daemon's redial of cell-a fails, so it asks the director again.
    store.set_cell_switch("cell-a", Some(AdmitMode::Reserve), None).await.expect("switch");
    drop(cell_a);
    let cell_b = cell_process(&url, "cell-b").await;
    register_cell(&store, "cell-b", &cell_b.url(), AdmitMode::Db, None).await;
    wait_connected_on(&store, host, "cell-b", &daemon).await;
    let (cell, epoch) = store.assignment(host).await.expect("assignment").expect("placed");
    assert_eq!(cell, "cell-b");
    assert!(epoch > first_epoch, "{epoch} after {first_epoch}");
}

/// A daemon that starts while its director is away dials the cell it last
/// reached (kept in its state dir), which admits it by the database. It
/// used to ask the director alone, failing until the director returned,
/// while its cell was up and would have taken it.
#[actix_rt::test]
async fn a_daemon_restarted_while_the_director_is_away_dials_its_last_cell() {
    let (_, store, director, _cell_a) = director_and_cell_a().await;
    let state = tempfile::tempdir().expect("state dir");
    let token = daemon_token_of_ann(&director);
    let mut daemon = DaemonProcess::start_url(&director.url(), &token, state.path());
    let host = registered_host(&store, &daemon).await;
    wait_connected_on(&store, host, "cell-a", &daemon).await;

    daemon.kill();
    let director_url = director.url();
    drop(director);
    let daemon = DaemonProcess::start_url(&director_url, &token, state.path());
    // The killed daemon's lease may still name cell-a: wait for this one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while !daemon.log().contains("tether_daemon_connected") {
        assert!(tokio::time::Instant::now() < deadline, "the daemon did not connect; its log:\n{}", daemon.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(daemon.log().contains("tether_daemon_assign_failed_dialing_last_cell"), "{}", daemon.log());
    wait_connected_on(&store, host, "cell-a", &daemon).await;
}

/// While the director is away, a cell that refuses the daemon with 4409
/// names the cell its host is assigned to, and the daemon dials that one.
/// It used to forget its last cell and ask only the director, so the host
/// stayed offline for the whole outage while its cell would take it.
#[actix_rt::test]
async fn a_daemon_sent_to_another_cell_while_the_director_is_away_dials_it() {
    let (url, store, director, _cell_a) = director_and_cell_a().await;
    let state = tempfile::tempdir().expect("state dir");
    let token = daemon_token_of_ann(&director);
    let mut daemon = DaemonProcess::start_url(&director.url(), &token, state.path());
    let host = registered_host(&store, &daemon).await;
    wait_connected_on(&store, host, "cell-a", &daemon).await;
    let cell_b = cell_process(&url, "cell-b").await;
    register_cell(&store, "cell-b", &cell_b.url(), AdmitMode::Db, None).await;

    // The host is placed on cell-b while its daemon is down, then the
    // director goes: the daemon's last cell (cell-a) sends it on.
    daemon.kill();
    store.assign_host(host, "cell-b").await.expect("placed on cell-b");
    let director_url = director.url();
    drop(director);
    let daemon = DaemonProcess::start_url(&director_url, &token, state.path());
    wait_connected_on(&store, host, "cell-b", &daemon).await;
    let log = daemon.log();
    assert!(log.contains("tether_daemon_wrong_cell") && log.contains(&cell_b.url()), "{log}");
}

/// A daemon pointed at a cell, not a director: that cell's 4409 names the
/// cell the host is assigned to, and with no director to ask (the cell's
/// `/v1/assign` is 404) the daemon dials the named cell. It used to dial
/// the refusing cell again, for ever, the host offline.
#[actix_rt::test]
async fn a_daemon_of_a_cell_without_a_director_follows_its_4409() {
    let (url, store, director, cell_a) = director_and_cell_a().await;
    let cell_b = cell_process(&url, "cell-b").await;
    register_cell(&store, "cell-b", &cell_b.url(), AdmitMode::Db, None).await;
    let state = tempfile::tempdir().expect("state dir");
    let token = daemon_token_of_ann(&director);
    drop(director);
    let mut daemon = DaemonProcess::start_url(&cell_a.url(), &token, state.path());
    let host = registered_host(&store, &daemon).await;
    wait_connected_on(&store, host, "cell-a", &daemon).await;

    daemon.kill();
    store.assign_host(host, "cell-b").await.expect("placed on cell-b");
    let daemon = DaemonProcess::start_url(&cell_a.url(), &token, state.path());
    wait_connected_on(&store, host, "cell-b", &daemon).await;
    assert!(daemon.log().contains("tether_daemon_no_director_dialing_named_cell"), "{}", daemon.log());
}

/// The whole booked path with real processes: a reserve cell that the
/// director polls, and a real daemon pointed at the director. The director
/// books the host on the cell, the daemon presents the booking in its
/// hello, and the cell admits it by the booking: no database admission,
/// and no assignment row (a booking is not a database placement).
#[actix_rt::test]
async fn a_booked_daemon_is_admitted_by_its_reserve_cell_without_the_database() {
    let url = support::pg_database().await;
    let store: Arc<PgStore> = Arc::new(PgStore::connect(&url, 4).await.expect("store"));
    // The switch says reserve before the cell starts, so it boots reserve.
    store.migrate().await.expect("migrate");
    store.set_cell_switch("cell-r", Some(AdmitMode::Reserve), None).await.expect("switch");
    let director = director(&url).await;
    let cell = cell_process(&url, "cell-r").await;
    let cell_api = Api::new(cell.url(), String::new());
    let state = tempfile::tempdir().expect("state dir");
    let daemon = daemon_of_ann(&director, state.path());
    let host = registered_host(&store, &daemon).await;
    wait_connected_on(&store, host, "cell-r", &daemon).await;
    let booked = support::e2e::metric(&cell_api, "tether_cell_admissions_total{path=\"booking\"}").await;
    assert_eq!(booked, Some(1.0), "the cell admitted the hello by its booking; the daemon's log:\n{}", daemon.log());
    let by_database = support::e2e::metric(&cell_api, "tether_cell_admissions_total{path=\"database\"}").await;
    assert_eq!(by_database, None, "no hello went to the database check");
    assert_eq!(store.assignment(host).await.expect("assignment"), None, "a booking writes no assignment row");
}
