//! One real `tether serve --role cell` process on SQLite (docs/CELLS.md):
//! the dead-man controller and the effective writer run with real time,
//! shortened by settings, while the test plays the director (reserve calls
//! and tickets signed with the cluster secret, seat-feed polls as contact)
//! and the other cells (their rows written straight into the SQLite file).
//!
//! - A director outage with the only slot held by another cell: the cell
//!   stays reserve across several claims, re-registers nothing, keeps its
//!   daemons, and lets a redialing daemon back in from memory; once the
//!   peer writes `reserve`, it trips and re-registers its hosts.
//! - A cap of 0 rides out many windows without tripping; no cap trips at
//!   once, and a new switch generation re-arms the tripped cell.
//! - The seat feed and the reserve call answer only the cluster secret.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use support::client::{create_token, daemon_url, Api, Event, Socket};
use support::TetherServer;
use tether::director::ticket::{TicketKey, TicketSubject};
use tether::proto::v1::{daemon_frame, server_frame, Booking};

const SECRET: &str = "cell-runtime-cluster-secret-01";
const CELL: &str = "cell-a";
const PROTOCOL: &[&str] = &["tether.daemon.v1"];
/// The longest the test waits for any one event (the machine is loaded).
const PATIENCE: Duration = Duration::from_secs(60);

/// A cell on its own SQLite file, with a dead-man window of `window_ms`.
struct Cell {
    server: TetherServer,
    db: PathBuf,
    _dir: tempfile::TempDir,
}

async fn cell(window_ms: u64) -> Cell {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("cell.db");
    let window = window_ms.to_string();
    let env = [
        ("TETHER_DATABASE__SQLITE_PATH", db.to_str().expect("utf8 path")),
        ("TETHER_CELL__ID", CELL),
        ("TETHER_CLUSTER__SECRET", SECRET),
        ("TETHER_CELL__DEAD_MAN_BASE_MS", window.as_str()),
        ("TETHER_CELL__DEAD_MAN_SPREAD_MS", "0"),
        ("TETHER_CELL__HELD_RETRY_MS", "300"),
        ("TETHER_CELL__SWITCH_POLL_MS", "100"),
        ("TETHER_CELL__EFFECTIVE_REFRESH_MS", "300"),
        ("TETHER_CELL__REGION", "eu-1"),
        ("RUST_LOG", "info"),
    ];
    let server = TetherServer::start(&env, &["--role", "cell"]).await;
    Cell { server, db, _dir: dir }
}

impl Cell {
    fn sql(&self) -> rusqlite::Connection {
        let db = rusqlite::Connection::open(&self.db).expect("open the cell's SQLite file");
        db.busy_timeout(Duration::from_secs(10)).expect("busy timeout");
        db
    }

    /// `tether cell set --cell cell-a ARGS`, as an operator runs it.
    fn set_switch(&self, args: &[&str]) {
        let mut all = vec!["cell", "set", "--cell", CELL];
        all.extend_from_slice(args);
        let out = self.server.run(&all, &[]);
        assert!(out.status.success(), "cell set: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The instance card's `cell` object.
    async fn card(&self) -> Value {
        let (status, body) = Api::new(self.server.url(), "").get("/api/v1/instance").await;
        assert_eq!(status, 200, "{body}");
        body["cell"].clone()
    }

    async fn wait_card(&self, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let card = self.card().await;
            if check(&card) {
                return card;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; card: {card}\n{}",
                self.server.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A counter or gauge from `/metrics` (0 when absent).
    async fn metric(&self, series: &str) -> f64 {
        let (_, text) = Api::new(self.server.url(), "").get_bytes("/metrics").await;
        let text = String::from_utf8_lossy(&text);
        text.lines()
            .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
            .map_or(0.0, |value| value.trim().parse().unwrap_or(0.0))
    }

    async fn wait_metric(&self, series: &str, at_least: f64) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while self.metric(series).await < at_least {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {series} >= {at_least}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// relay_assignments as (host, cell, epoch).
    fn assignments(&self) -> Vec<(String, String, i64)> {
        let db = self.sql();
        let mut stmt =
            db.prepare("SELECT host_id, cell_id, epoch FROM relay_assignments ORDER BY host_id").expect("sql");
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).expect("query").map(|r| r.expect("row")).collect()
    }

    /// This cell's effective row: (mode, updated_at ms).
    fn effective(&self) -> Option<(String, i64)> {
        self.sql()
            .query_row("SELECT mode, updated_at FROM relay_cell_admit_effective WHERE cell_id = ?1", [CELL], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .ok()
    }

    /// Another cell that holds a trip slot: its switch says reserve (cap
    /// 1), its own row says db and is fresh. It writes nothing else.
    fn peer_holds_a_slot(&self) {
        let now = chrono::Utc::now().timestamp_millis();
        self.sql()
            .execute_batch(&format!(
                "INSERT INTO relay_cells (cell_id, url, pool_size, reserve_pool_size) \
                   VALUES ('cell-b', 'http://cell-b:8080', 16, 4); \
                 INSERT INTO relay_cell_admit_modes (cell_id, admit_mode, dead_man_trip_slots, generation, updated_at) \
                   VALUES ('cell-b', 'reserve', 1, 1, {now}); \
                 INSERT INTO relay_cell_admit_effective (cell_id, mode, cell_incarnation, updated_at) \
                   VALUES ('cell-b', 'db', 'cell-b#peer01', {now});"
            ))
            .expect("the peer's rows");
    }

    fn log_count(&self, event: &str) -> usize {
        self.server.log().matches(event).count()
    }

    fn director(&self) -> Api {
        Api::new(self.server.url(), SECRET)
    }
}

/// A user with `n` registered hosts.
async fn hosts(cell: &Cell, n: usize) -> (Api, Vec<String>) {
    let api = Api::new(cell.server.url(), create_token(&cell.server, "ann"));
    let mut ids = Vec::new();
    for i in 0..n {
        let (status, body) = api.post("/api/v1/hosts", json!({"hostname": format!("box-{i}")})).await;
        assert_eq!(status, 201, "{body}");
        ids.push(body["host"]["id"].as_str().expect("host id").to_string());
    }
    (api, ids)
}

/// Books `host` at `epoch` as the director does; returns its ticket.
async fn book(cell: &Cell, host: &str, epoch: i64) -> Booking {
    let (status, body) = cell
        .director()
        .post("/internal/v1/reserve", json!({"items": [{"hostId": host, "epoch": epoch, "ttlMs": 30000}]}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["status"], "ok", "{body}");
    let key = TicketKey::new(SECRET.as_bytes()).expect("key");
    let host_id = host.parse().expect("uuid");
    let owner: String = cell
        .sql()
        .query_row("SELECT user_id FROM hosts WHERE id = ?1", [host], |r| r.get(0))
        .expect("the host's owner");
    let user_id = owner.parse().expect("uuid");
    let expires = chrono::Utc::now().timestamp_millis() + 30_000;
    let ticket = key.sign(&TicketSubject { host_id, user_id, cell_id: CELL, epoch }, expires);
    Booking { epoch: epoch as u64, ticket }
}

/// A scripted daemon that says hello with `booking` and is acknowledged.
async fn dial(cell: &Cell, api: &Api, host: &str, booking: &Booking) -> Socket {
    let mut sock = Socket::connect(&daemon_url(&cell.server), Some(&api.token), PROTOCOL).await;
    let daemon_frame::Frame::Hello(mut hello) = support::client::hello(host) else { unreachable!() };
    hello.booking = Some(booking.clone());
    sock.send_frame(daemon_frame::Frame::Hello(hello)).await;
    match sock.next_server_frame().await {
        server_frame::Frame::HelloAck(_) => sock,
        other => panic!("expected HelloAck, got {other:?}"),
    }
}

/// Still connected: nothing but pings for a moment, and no close.
async fn assert_connected(sock: &mut Socket, who: &str) {
    sock.send_frame(daemon_frame::Frame::Ping(Default::default())).await;
    loop {
        match sock.next_within(Duration::from_millis(300)).await {
            None => return,
            Some(Event::Close(code)) => panic!("{who} was disconnected ({code:?})"),
            Some(_) => continue,
        }
    }
}

/// Polls the seat feed every 100 ms, as a director does, until dropped.
fn director_polls(cell: &Cell) -> tokio::task::JoinHandle<()> {
    let director = cell.director();
    actix_rt::spawn(async move {
        loop {
            director.get("/internal/v1/seats").await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

#[actix_rt::test]
async fn an_outage_with_the_only_slot_taken_holds_the_cell_until_the_peer_lets_go() {
    let cell = cell(1500).await;
    let (api, hosts) = hosts(&cell, 2).await;
    cell.peer_holds_a_slot();
    cell.set_switch(&["--admit-mode", "reserve", "--dead-man-trip-slots", "1"]);
    cell.wait_card("the switch read", |c| c["switchAdmitMode"] == "reserve").await;

    // The director polls while the daemons dial, then goes quiet.
    let polls = director_polls(&cell);
    let first = book(&cell, &hosts[0], 1).await;
    let second = book(&cell, &hosts[1], 1).await;
    let mut d1 = dial(&cell, &api, &hosts[0], &first).await;
    let mut d2 = dial(&cell, &api, &hosts[1], &second).await;
    polls.abort();
    assert_eq!(cell.metric("tether_cell_admissions_total{path=\"booking\"}").await, 2.0);

    // The window passes without contact; the claim is refused.
    let card = cell.wait_card("held", |c| c["held"] == true).await;
    assert_eq!((&card["tripped"], &card["effectiveAdmitMode"]), (&json!(false), &json!("reserve")), "{card}");
    cell.wait_metric("tether_cell_slot_claims_total{outcome=\"refused\"}", 3.0).await;
    let card = cell.card().await;
    assert_eq!(
        (&card["held"], &card["tripped"], &card["effectiveAdmitMode"]),
        (&json!(true), &json!(false), &json!("reserve"))
    );
    assert_eq!(cell.metric("tether_cell_slot_claims_total{outcome=\"won\"}").await, 0.0);
    assert!(cell.assignments().is_empty(), "a held cell re-registers nothing: {:?}", cell.assignments());
    assert_eq!(cell.effective().map(|(mode, _)| mode).as_deref(), Some("reserve"), "it keeps writing reserve");
    assert_eq!(cell.log_count("tether_cell_dead_man_held"), 1, "held is logged once");
    assert_connected(&mut d1, "the first daemon").await;
    assert_connected(&mut d2, "the second daemon").await;

    // A daemon that redials at the same epoch is let back in from memory.
    d1.close().await;
    d1.expect_close().await;
    let mut d1 = dial(&cell, &api, &hosts[0], &first).await;
    assert_eq!(cell.metric("tether_cell_admissions_total{path=\"memory\"}").await, 1.0);
    assert_eq!(cell.metric("tether_cell_admissions_total{path=\"database\"}").await, 0.0);
    assert!(cell.assignments().is_empty());

    // The peer writes reserve: its slot is free, the next claim wins.
    cell.sql()
        .execute("UPDATE relay_cell_admit_effective SET mode = 'reserve' WHERE cell_id = 'cell-b'", [])
        .expect("peer");
    let card = cell.wait_card("the trip", |c| c["tripped"] == true).await;
    assert_eq!(
        (&card["held"], &card["effectiveAdmitMode"], &card["switchAdmitMode"]),
        (&json!(false), &json!("db"), &json!("reserve"))
    );
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut expected: Vec<(String, String, i64)> = hosts.iter().map(|h| (h.clone(), CELL.to_string(), 1)).collect();
    expected.sort();
    while cell.assignments() != expected {
        assert!(tokio::time::Instant::now() < deadline, "re-registration: {:?}", cell.assignments());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cell.metric("tether_cell_slot_claims_total{outcome=\"won\"}").await, 1.0);
    assert_connected(&mut d1, "the redialed daemon").await;
    assert_connected(&mut d2, "the second daemon").await;
}

#[actix_rt::test]
async fn slot_zero_rides_out_many_windows_without_tripping() {
    let cell = cell(300).await;
    // It registered itself with its region.
    let region: String = cell
        .sql()
        .query_row("SELECT region FROM relay_cells WHERE cell_id = ?1", [CELL], |r| r.get(0))
        .expect("the cell's row");
    assert_eq!(region, "eu-1");
    cell.set_switch(&["--admit-mode", "reserve", "--dead-man-trip-slots", "0"]);
    cell.wait_card("held", |c| c["held"] == true).await;
    let (_, held_since) = cell.effective().expect("the effective row");
    // Twenty windows by the database's clock (the row is refreshed every 300 ms).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let card = cell.card().await;
        assert_eq!(
            (&card["tripped"], &card["held"], &card["effectiveAdmitMode"]),
            (&json!(false), &json!(true), &json!("reserve")),
            "{card}"
        );
        let (mode, at) = cell.effective().expect("the effective row");
        assert_eq!(mode, "reserve");
        if at - held_since >= 20 * 300 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the row stopped being refreshed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let claims = cell.metric("tether_cell_slot_claims_total{outcome=\"won\"}").await
        + cell.metric("tether_cell_slot_claims_total{outcome=\"refused\"}").await;
    assert_eq!(claims, 0.0, "a cap of 0 never claims");
    assert_eq!(cell.log_count("tether_cell_dead_man_held"), 1);
    assert_eq!(cell.log_count("tether_cell_dead_man_tripped"), 0);
}

#[actix_rt::test]
async fn without_a_cap_the_cell_trips_and_a_new_generation_re_arms_it() {
    let cell = cell(1500).await;
    let (api, hosts) = hosts(&cell, 1).await;
    cell.set_switch(&["--admit-mode", "reserve"]);
    cell.wait_card("the switch read", |c| c["switchAdmitMode"] == "reserve").await;
    let polls = director_polls(&cell);
    let booking = book(&cell, &hosts[0], 4).await;
    let mut daemon = dial(&cell, &api, &hosts[0], &booking).await;
    polls.abort();

    let card = cell.wait_card("the trip", |c| c["tripped"] == true).await;
    assert_eq!((&card["held"], &card["effectiveAdmitMode"]), (&json!(false), &json!("db")), "{card}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while cell.assignments() != vec![(hosts[0].clone(), CELL.to_string(), 4)] {
        assert!(tokio::time::Instant::now() < deadline, "re-registration: {:?}", cell.assignments());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cell.metric("tether_cell_slot_claims_total{outcome=\"won\"}").await, 0.0, "no cap, no claim");
    assert_connected(&mut daemon, "the daemon").await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while cell.effective().map(|(mode, _)| mode).as_deref() != Some("db") {
        assert!(tokio::time::Instant::now() < deadline, "the row says db after the trip");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The director is back: the trip stays latched...
    let polls = director_polls(&cell);
    cell.wait_card("contact", |c| !c["directorHeardAt"].is_null()).await;
    assert_eq!(cell.card().await["tripped"], true, "contact does not undo a trip");
    // ...until the operator writes the switch again (a new generation).
    cell.set_switch(&[]);
    let card = cell.wait_card("the re-arm", |c| c["tripped"] == false).await;
    assert_eq!(card["effectiveAdmitMode"], "reserve", "{card}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while cell.effective().map(|(mode, _)| mode).as_deref() != Some("reserve") {
        assert!(tokio::time::Instant::now() < deadline, "the re-armed row says reserve");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    polls.abort();
}

#[actix_rt::test]
async fn the_seat_feed_and_the_reserve_call_answer_the_cluster_secret_only() {
    let cell = cell(60_000).await;
    let (_, hosts) = hosts(&cell, 2).await;
    let director = cell.director();

    let (status, feed) = director.get("/internal/v1/seats").await;
    assert_eq!(status, 200, "{feed}");
    assert_eq!(
        (&feed["cellId"], &feed["mode"], &feed["tripped"], &feed["held"], &feed["seats"], &feed["bookings"]),
        (&json!(CELL), &json!("db"), &json!(false), &json!(false), &json!(0), &json!(0)),
        "{feed}"
    );
    assert!(!cell.card().await["directorHeardAt"].is_null(), "a poll is contact");
    let items = json!({"items": [{"hostId": hosts[0], "epoch": 1, "ttlMs": 30000}]});
    let (status, body) = director.post("/internal/v1/reserve", items.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"], json!([{"hostId": hosts[0], "status": "off"}]), "a db cell books nothing");

    cell.set_switch(&["--admit-mode", "reserve"]);
    cell.wait_card("the switch read", |c| c["effectiveAdmitMode"] == "reserve").await;
    let (_, body) = director
        .post(
            "/internal/v1/reserve",
            json!({"items": [
                {"hostId": hosts[0], "epoch": 2, "ttlMs": 30000},
                {"hostId": hosts[1], "epoch": 1, "ttlMs": 30000}
            ]}),
        )
        .await;
    assert_eq!(body["results"], json!([{"hostId": hosts[0], "status": "ok"}, {"hostId": hosts[1], "status": "ok"}]));
    let (_, body) = director.post("/internal/v1/reserve", items.clone()).await;
    assert_eq!(body["results"], json!([{"hostId": hosts[0], "status": "seated-newer", "epoch": 2}]), "{body}");
    let (_, feed) = director.get("/internal/v1/seats").await;
    assert_eq!((&feed["mode"], &feed["bookings"]), (&json!("reserve"), &json!(2)), "{feed}");

    for (bad, code) in [
        (json!({"items": [{"hostId": "nope", "epoch": 1, "ttlMs": 1}]}), "bad_json"),
        (json!({"items": [{"hostId": hosts[0], "epoch": 0, "ttlMs": 1}]}), "invalid_epoch"),
        (json!({"items": [{"hostId": hosts[0], "epoch": i64::MAX, "ttlMs": 1}]}), "invalid_epoch"),
        (json!({"items": [{"hostId": hosts[0], "epoch": 3, "ttlMs": 0}]}), "invalid_ttl"),
        (json!({}), "bad_json"),
    ] {
        let (status, body) = director.post("/internal/v1/reserve", bad.clone()).await;
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some(code)), "{bad}: {body}");
    }
    for token in ["", "cell-runtime-cluster-secret-02"] {
        let api = Api::new(cell.server.url(), token);
        assert_eq!(api.get("/internal/v1/seats").await.0, 401, "{token:?}");
        assert_eq!(api.post("/internal/v1/reserve", items.clone()).await.0, 401, "{token:?}");
    }
    let (_, feed) = director.get("/internal/v1/seats").await;
    assert_eq!(feed["bookings"], 2, "refused calls booked nothing: {feed}");
}

/// The operator switches a reserve cell to db while the director is up: as
/// a trip does, the cell writes the relay_assignments rows of the hosts it
/// admitted by booking, so their redial (now checked in the database) is
/// admitted here. It used to write none, and a stale row sent the daemon
/// to another cell with 4409.
#[actix_rt::test]
async fn a_switch_to_db_registers_the_hosts_admitted_without_the_database() {
    let cell = cell(60_000).await;
    let (api, hosts) = hosts(&cell, 1).await;
    cell.set_switch(&["--admit-mode", "reserve"]);
    cell.wait_card("the switch read", |c| c["switchAdmitMode"] == "reserve").await;
    let polls = director_polls(&cell);
    let booking = book(&cell, &hosts[0], 3).await;
    let mut daemon = dial(&cell, &api, &hosts[0], &booking).await;
    // A stale row names another cell (a trip there wrote it).
    cell.sql()
        .execute(
            "INSERT INTO relay_assignments (host_id, cell_id, epoch, updated_at) VALUES (?1, 'cell-gone', 2, 0)",
            [&hosts[0]],
        )
        .expect("stale row");

    cell.set_switch(&["--admit-mode", "db"]);
    cell.wait_card("db mode", |c| c["effectiveAdmitMode"] == "db").await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while cell.assignments() != vec![(hosts[0].clone(), CELL.to_string(), 3)] {
        assert!(tokio::time::Instant::now() < deadline, "registration: {:?}", cell.assignments());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_connected(&mut daemon, "the daemon").await;
    // Its redial is checked in the database and admitted here.
    daemon.close().await;
    daemon.expect_close().await;
    let _daemon = dial(&cell, &api, &hosts[0], &booking).await;
    assert_eq!(cell.metric("tether_cell_admissions_total{path=\"database\"}").await, 1.0);
    polls.abort();
}

/// A tripped cell whose slot another cell holds now (it took the slot
/// while this cell's row was stale: the process was frozen past
/// `cell.slot_stale_ms`) gives the slot up at its next refresh: held, back
/// in reserve at its reserve pool, asking again. It used to stay tripped at
/// its full pool, two cells tripped under a cap of one.
#[actix_rt::test]
async fn a_tripped_cell_whose_slot_was_taken_is_held_again() {
    let cell = cell(1500).await;
    cell.set_switch(&["--admit-mode", "reserve", "--dead-man-trip-slots", "1"]);
    cell.wait_card("the switch read", |c| c["switchAdmitMode"] == "reserve").await;
    let card = cell.wait_card("the trip", |c| c["tripped"] == true).await;
    assert_eq!(card["effectiveAdmitMode"], "db", "{card}");
    assert_eq!(cell.metric("tether_cell_slot_claims_total{outcome=\"won\"}").await, 1.0);

    // Another cell holds the one slot now.
    cell.peer_holds_a_slot();
    let card = cell.wait_card("the slot given up", |c| c["held"] == true).await;
    assert_eq!((&card["tripped"], &card["effectiveAdmitMode"]), (&json!(false), &json!("reserve")), "{card}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while cell.effective().map(|(mode, _)| mode).as_deref() != Some("reserve") {
        assert!(tokio::time::Instant::now() < deadline, "the row says reserve again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cell.log_count("tether_cell_trip_slot_lost"), 1);
}
