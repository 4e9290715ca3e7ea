//! The cell tables (docs/CELLS.md, "Tables" and "The slot claim") on both
//! store backends: the switch's generation, the effective rows, the
//! trip-slot claim's rules and the assignments' epochs; then, on
//! PostgreSQL, the claim under contention: eight cells claiming at once
//! get exactly the cap, again and again.

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tether::cell::AdmitMode;
use tether::store::postgres::PgStore;
use tether::store::sqlite::SqliteStore;
use tether::store::*;
use uuid::Uuid;

/// `cell.slot_stale_ms`: how recently a slot holder must have written its row.
const FRESH: Duration = Duration::from_secs(600);

/// A store plus a second way into its database, to age rows as time would.
struct Fixture {
    store: Arc<dyn Store>,
    raw: Raw,
    _dir: Option<tempfile::TempDir>,
}

enum Raw {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Fixture {
    /// Moves a cell's effective row `by` into the past.
    async fn age_effective(&self, cell_id: &str, by: Duration) {
        match &self.raw {
            Raw::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path).expect("open sqlite");
                let ms = i64::try_from(by.as_millis()).expect("ms");
                let n = conn
                    .execute(
                        "UPDATE relay_cell_admit_effective SET updated_at = updated_at - ?2 WHERE cell_id = ?1",
                        rusqlite::params![cell_id, ms],
                    )
                    .expect("age row");
                assert_eq!(n, 1, "no effective row of {cell_id}");
            }
            Raw::Postgres(url) => {
                // Not support::pg_connect: the contention tests run on tokio's
                // multi-thread runtime, which has no actix LocalSet.
                let (client, connection) =
                    tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect postgres");
                tokio::spawn(connection);
                let n = client
                    .execute(
                        "UPDATE relay_cell_admit_effective \
                         SET updated_at = updated_at - make_interval(secs => $2::float8) WHERE cell_id = $1",
                        &[&cell_id, &by.as_secs_f64()],
                    )
                    .await
                    .expect("age row");
                assert_eq!(n, 1, "no effective row of {cell_id}");
            }
        }
    }
}

async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("t.db");
    let store = SqliteStore::open(&path).expect("open sqlite");
    store.migrate().await.expect("migrate sqlite");
    Fixture { store: Arc::new(store), raw: Raw::Sqlite(path), _dir: Some(dir) }
}

async fn postgres_with_pool(pool_size: usize) -> Fixture {
    let url = support::pg_database().await;
    let store = PgStore::connect(&url, pool_size).await.expect("connect postgres");
    store.migrate().await.expect("migrate postgres");
    Fixture { store: Arc::new(store), raw: Raw::Postgres(url), _dir: None }
}

async fn postgres() -> Fixture {
    postgres_with_pool(4).await
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite_backend {
            $(#[actix_rt::test] async fn $name() { super::$name(&super::sqlite().await).await })*
        }
        mod postgres_backend {
            $(#[actix_rt::test] async fn $name() { super::$name(&super::postgres().await).await })*
        }
    };
}

conformance!(
    every_switch_write_bumps_the_generation,
    slot_caps_outside_the_range_are_refused_before_any_write,
    cells_register_and_write_their_effective_rows,
    a_claim_wins_only_below_the_cap_of_live_other_holders,
    assigning_a_host_takes_the_next_epoch,
    recorded_assignments_never_lower_an_epoch,
    every_call_is_counted,
);

fn cell(id: &str, pool: u32, reserve: u32) -> CellRow {
    CellRow {
        cell_id: id.into(),
        url: format!("http://{id}.cells.test:8080"),
        region: "eu-1".into(),
        pool_size: pool,
        reserve_pool_size: reserve,
    }
}

async fn switch(store: &Arc<dyn Store>, id: &str) -> CellSwitch {
    store.cell_switch(id).await.expect("read switch").expect("a switch row")
}

async fn effective(store: &Arc<dyn Store>, id: &str) -> Option<CellEffective> {
    let views = store.list_cells().await.expect("list cells");
    views.into_iter().find(|v| v.cell.cell_id == id).expect("a registered cell").effective
}

async fn every_switch_write_bumps_the_generation(f: &Fixture) {
    let store = &f.store;
    assert_eq!(store.cell_switch("c1").await.expect("read"), None);
    let first = store.set_cell_switch("c1", None, None).await.expect("set");
    assert_eq!(
        (first.admit_mode, first.dead_man_trip_slots, first.generation),
        (AdmitMode::Db, None, 1),
        "a new row without a mode starts in db at generation 1"
    );
    let reserve = store.set_cell_switch("c1", Some(AdmitMode::Reserve), None).await.expect("set");
    assert_eq!((reserve.admit_mode, reserve.dead_man_trip_slots, reserve.generation), (AdmitMode::Reserve, None, 2));
    let capped = store.set_cell_switch("c1", None, Some(Some(2))).await.expect("set");
    assert_eq!(
        (capped.admit_mode, capped.dead_man_trip_slots, capped.generation),
        (AdmitMode::Reserve, Some(2), 3),
        "the mode is kept when only the cap is written"
    );
    let same = store.set_cell_switch("c1", Some(AdmitMode::Reserve), Some(Some(2))).await.expect("set");
    assert_eq!(same.generation, 4, "a write that changes nothing still bumps the generation (it re-arms)");
    let unchanged = store.set_cell_switch("c1", None, None).await.expect("set");
    assert_eq!(
        (unchanged.admit_mode, unchanged.dead_man_trip_slots, unchanged.generation),
        (AdmitMode::Reserve, Some(2), 5)
    );
    let uncapped = store.set_cell_switch("c1", None, Some(None)).await.expect("set");
    assert_eq!((uncapped.dead_man_trip_slots, uncapped.generation), (None, 6), "`none` removes the cap");
    assert!(uncapped.updated_at >= first.updated_at);
    assert_eq!(switch(store, "c1").await, uncapped, "the answer is the stored row");

    let other = store.set_cell_switch("c2", Some(AdmitMode::Reserve), Some(Some(0))).await.expect("set");
    assert_eq!((other.admit_mode, other.dead_man_trip_slots, other.generation), (AdmitMode::Reserve, Some(0), 1));
    assert_eq!(switch(store, "c1").await.generation, 6, "each cell has its own generation");
}

async fn slot_caps_outside_the_range_are_refused_before_any_write(f: &Fixture) {
    let store = &f.store;
    let err = store.set_cell_switch("new", Some(AdmitMode::Reserve), Some(Some(65))).await.expect_err("65 slots");
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
    assert!(err.to_string().contains("between 0 and 64"), "{err}");
    assert_eq!(store.cell_switch("new").await.expect("read"), None, "nothing was written");

    store.set_cell_switch("c1", Some(AdmitMode::Reserve), Some(Some(64))).await.expect("64 is the most");
    store.set_cell_switch("c1", Some(AdmitMode::Db), Some(Some(200))).await.expect_err("200 slots");
    let kept = switch(store, "c1").await;
    assert_eq!((kept.admit_mode, kept.dead_man_trip_slots, kept.generation), (AdmitMode::Reserve, Some(64), 1));
}

async fn cells_register_and_write_their_effective_rows(f: &Fixture) {
    let store = &f.store;
    store.register_cell(&cell("b", 16, 12)).await.expect("register");
    store.register_cell(&cell("a", 10, 10)).await.expect("register");
    let views = store.list_cells().await.expect("list");
    assert_eq!(views.iter().map(|v| v.cell.cell_id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(views[1].cell, cell("b", 16, 12));
    assert!(views.iter().all(|v| v.switch.is_none() && v.effective.is_none()));
    assert_eq!(views[0].admit_mode(), AdmitMode::Db, "no switch row: db");

    // A restart registers again with new figures: an update, not a second row.
    store.register_cell(&CellRow { url: "http://b2:8080".into(), ..cell("b", 20, 8) }).await.expect("register");
    store.set_cell_switch("b", Some(AdmitMode::Reserve), Some(Some(3))).await.expect("switch");
    store.write_cell_effective("b", AdmitMode::Reserve, "boot-1").await.expect("write");
    let views = store.list_cells().await.expect("list");
    let b = &views[1];
    assert_eq!((b.cell.url.as_str(), b.cell.pool_size, b.cell.reserve_pool_size), ("http://b2:8080", 20, 8));
    assert_eq!((b.admit_mode(), b.trip_slots()), (AdmitMode::Reserve, Some(3)));
    let row = b.effective.clone().expect("effective row");
    assert_eq!((row.mode, row.cell_incarnation.as_str()), (AdmitMode::Reserve, "boot-1"));
    assert!(row.updated_at <= b.read_at, "stamped by the database clock, read at or after");
    assert!(b.read_at - row.updated_at < chrono::Duration::seconds(60));

    store.write_cell_effective("b", AdmitMode::Db, "boot-2").await.expect("write");
    let row = effective(store, "b").await.expect("effective row");
    assert_eq!((row.mode, row.cell_incarnation.as_str()), (AdmitMode::Db, "boot-2"));
    assert_eq!(effective(store, "a").await, None, "only the writing cell's row changed");
}

/// Registers reserve cells with a cap of `slots`.
async fn reserve_cells(store: &Arc<dyn Store>, ids: &[&str], slots: u8) {
    for id in ids {
        store.register_cell(&cell(id, 16, 12)).await.expect("register");
        store.set_cell_switch(id, Some(AdmitMode::Reserve), Some(Some(slots))).await.expect("switch");
    }
}

async fn a_claim_wins_only_below_the_cap_of_live_other_holders(f: &Fixture) {
    let store = &f.store;
    let claim = |id: &'static str, slots: u8| {
        let store = store.clone();
        async move { store.claim_trip_slot(id, &format!("{id}-boot"), slots, FRESH).await.expect("claim") }
    };
    reserve_cells(store, &["a", "b", "c", "d", "e"], 2).await;

    assert_eq!(claim("e", 0).await, SlotClaim::Refused { holders: 0 }, "slot 0 never wins, even with no holder");
    assert_eq!(effective(store, "e").await, None, "a refused claim writes nothing");

    assert_eq!(claim("a", 2).await, SlotClaim::Won);
    let won = effective(store, "a").await.expect("the winner's row");
    assert_eq!((won.mode, won.cell_incarnation.as_str()), (AdmitMode::Db, "a-boot"));
    assert_eq!(claim("b", 2).await, SlotClaim::Won, "one holder, below the cap of 2");
    assert_eq!(claim("c", 2).await, SlotClaim::Refused { holders: 2 }, "at the cap");
    assert_eq!(effective(store, "c").await, None, "a refused claim writes nothing");
    assert_eq!(claim("a", 2).await, SlotClaim::Won, "a cell's own row is not counted: it keeps its slot");

    // A holder whose switch is no longer reserve does not count.
    store.set_cell_switch("a", Some(AdmitMode::Db), None).await.expect("switch a to db");
    assert_eq!(claim("c", 2).await, SlotClaim::Won, "only b counts");
    assert_eq!(claim("d", 2).await, SlotClaim::Refused { holders: 2 }, "b and c hold the slots");

    // A holder that stopped refreshing its row does not count.
    f.age_effective("b", FRESH + Duration::from_secs(1)).await;
    assert_eq!(claim("d", 2).await, SlotClaim::Won, "b's row is older than `fresh`");
    assert_eq!(claim("e", 2).await, SlotClaim::Refused { holders: 2 }, "c and d");

    // A holder re-armed by a new generation writes reserve: its slot is free.
    store.write_cell_effective("c", AdmitMode::Reserve, "c-boot").await.expect("write reserve");
    assert_eq!(claim("e", 2).await, SlotClaim::Won);
}

async fn assigning_a_host_takes_the_next_epoch(f: &Fixture) {
    let store = &f.store;
    let host = Uuid::new_v4();
    assert_eq!(store.assignment(host).await.expect("read"), None);
    assert_eq!(store.assign_host(host, "a").await.expect("assign"), 1, "a new host starts at epoch 1");
    assert_eq!(store.assign_host(host, "b").await.expect("assign"), 2);
    assert_eq!(store.assign_host(host, "b").await.expect("assign"), 3);
    assert_eq!(store.assignment(host).await.expect("read"), Some(("b".into(), 3)));
    let other = Uuid::new_v4();
    assert_eq!(store.assign_host(other, "a").await.expect("assign"), 1, "epochs are per host");
}

async fn recorded_assignments_never_lower_an_epoch(f: &Fixture) {
    let store = &f.store;
    let (moved, new, twice) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    store.assign_host(moved, "elsewhere").await.expect("assign");
    store.assign_host(moved, "elsewhere").await.expect("assign");
    assert_eq!(store.record_assignments("c", &[]).await.expect("empty batch"), 0);
    let written = store.record_assignments("c", &[(moved, 1), (new, 4), (twice, 1), (twice, 2)]).await.expect("record");
    assert_eq!(written, 2, "the new host and the host named twice");
    assert_eq!(store.assignment(moved).await.expect("read"), Some(("elsewhere".into(), 2)), "a higher epoch stays");
    assert_eq!(store.assignment(new).await.expect("read"), Some(("c".into(), 4)));
    assert_eq!(store.assignment(twice).await.expect("read"), Some(("c".into(), 2)), "its highest epoch");
    assert_eq!(store.record_assignments("c", &[(moved, 3)]).await.expect("record"), 1);
    assert_eq!(store.assignment(moved).await.expect("read"), Some(("c".into(), 3)), "a higher epoch is written");
    assert_eq!(store.assign_host(moved, "d").await.expect("assign"), 4, "the director continues from there");
}

async fn every_call_is_counted(f: &Fixture) {
    let store = &f.store;
    let before = store.queries_total();
    store.cell_switch("a").await.expect("read");
    store.list_cells().await.expect("list");
    store.claim_trip_slot("a", "boot", 1, FRESH).await.expect("claim");
    assert_eq!(store.queries_total(), before + 3);
    let _ = store.pool_status();
    assert_eq!(store.queries_total(), before + 3, "reading the pool's figures asks the database nothing");
}

// ---- PostgreSQL under contention

const CELLS: [&str; 8] = ["c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7"];

/// `ids` claim at the same moment, each on its own task (and pooled
/// connection), each asking again while another claim holds the lock (as
/// a held cell does); answers who won.
async fn claim_together(store: &Arc<dyn Store>, ids: &[&'static str], slots: u8) -> Vec<&'static str> {
    let start = Arc::new(tokio::sync::Barrier::new(ids.len()));
    let tasks: Vec<_> = ids
        .iter()
        .map(|&id| {
            let (store, start) = (store.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                loop {
                    match store.claim_trip_slot(id, "boot", slots, FRESH).await.expect("claim") {
                        SlotClaim::Busy => tokio::task::yield_now().await,
                        SlotClaim::Won => return Some(id),
                        SlotClaim::Refused { .. } => return None,
                    }
                }
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        winners.extend(task.await.expect("claiming task"));
    }
    winners
}

/// Cells whose effective row says db.
async fn db_rows(store: &Arc<dyn Store>) -> Vec<String> {
    let views = store.list_cells().await.expect("list");
    views
        .into_iter()
        .filter(|v| v.effective.as_ref().is_some_and(|e| e.mode == AdmitMode::Db))
        .map(|v| v.cell.cell_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_cells_claiming_together_get_exactly_two_slots_every_time() {
    let f = postgres_with_pool(CELLS.len() + 2).await;
    let store = &f.store;
    reserve_cells(store, &CELLS, 2).await;
    // Every round runs to the end, so a failure reports how often the cap held.
    let mut rounds_by_winners = std::collections::BTreeMap::new();
    let mut rows_unlike_winners = Vec::new();
    for round in 0..200 {
        for id in CELLS {
            store.write_cell_effective(id, AdmitMode::Reserve, "boot").await.expect("reset");
        }
        let mut winners: Vec<String> = claim_together(store, &CELLS, 2).await.iter().map(|w| w.to_string()).collect();
        *rounds_by_winners.entry(winners.len()).or_insert(0) += 1;
        winners.sort();
        let mut rows = db_rows(store).await;
        rows.sort();
        if rows != winners {
            rows_unlike_winners.push((round, winners, rows));
        }
    }
    assert_eq!(rounds_by_winners, [(2, 200)].into(), "rounds by number of winners (of 200)");
    assert_eq!(rows_unlike_winners, [], "rounds whose db rows are not exactly the winners'");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_holders_keep_their_slots_and_a_stale_one_frees_exactly_one() {
    let f = postgres_with_pool(CELLS.len() + 2).await;
    let store = &f.store;
    reserve_cells(store, &CELLS, 2).await;
    let holders = claim_together(store, &CELLS, 2).await;
    assert_eq!(holders.len(), 2, "{holders:?}");
    let others: Vec<&'static str> = CELLS.into_iter().filter(|c| !holders.contains(c)).collect();

    assert_eq!(claim_together(store, &others, 2).await, Vec::<&str>::new(), "live holders keep both slots");
    for &holder in &holders {
        let claim = store.claim_trip_slot(holder, "boot", 2, FRESH).await.expect("claim");
        assert_eq!(claim, SlotClaim::Won, "{holder} asks again and keeps its slot");
    }

    // The first holder stops refreshing its row for longer than cell.slot_stale_ms.
    f.age_effective(holders[0], FRESH + Duration::from_secs(60)).await;
    let freed = claim_together(store, &others, 2).await;
    assert_eq!(freed.len(), 1, "a stale holder frees exactly one slot: {freed:?}");
    assert_eq!(claim_together(store, &others, 2).await, freed, "and the rest are refused again");
}
