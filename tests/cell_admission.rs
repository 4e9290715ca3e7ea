//! The cell's admission step (docs/CELLS.md, "Admission") against a real
//! store: a booked hello and a redial from memory are admitted in reserve
//! mode with no store query at all (`queries_total` unchanged); anything
//! else, and every hello in db mode, is checked in the database, and a host
//! assigned to another cell is sent there with its URL. The check of a
//! bound daemon token takes the host its token's lookup brought, while
//! fresh, instead of reading it again.
//! SQLite by default; PostgreSQL with `TETHER_TEST_BACKEND=postgres`.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tether::auth::Principal;
use tether::cell::admission::{admit, Prefetched, Verdict, PREFETCH_FRESH};
use tether::cell::bookings::{AdmittedBy, ReserveItem};
use tether::cell::state::{CellState, CellStatus};
use tether::cell::AdmitMode;
use tether::director::ticket::{TicketKey, TicketSubject};
use tether::proto::v1::Booking;
use tether::store::{CellRow, HostAdmission, NewToken, Store, TokenScope};
use uuid::Uuid;

const SECRET: &[u8] = b"cell-admission-secret-0123";
const CELL: &str = "cell-a";

struct Fixture {
    store: Arc<dyn Store>,
    cell: CellState,
    principal: Principal,
    host: Uuid,
    _dir: tempfile::TempDir,
}

async fn fixture(mode: AdmitMode) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = tether::config::Settings::default();
    settings.database.sqlite_path = dir.path().join("tether.db");
    if std::env::var("TETHER_TEST_BACKEND").as_deref() == Ok("postgres") {
        settings.database.url = Some(support::pg_database().await);
    }
    let store = tether::store::open(&settings).await.expect("store");
    let user = store.ensure_user("ann").await.expect("user");
    let host = support::store_host(store.as_ref(), &user, "box").await.id;
    let token = store.insert_token(&NewToken::full(user.id, &tether::auth::hash_token("t"))).await.expect("token");
    let principal = Principal::new(user, &token);
    let key = TicketKey::new(SECRET).expect("key");
    let cell = CellState::new(CELL.into(), "cell-a#000001".into(), Some(key), 100, Duration::from_secs(600));
    cell.set_status(CellStatus { switch: mode, mode, tripped: false, held: false, trip_slots: None });
    Fixture { store, cell, principal, host, _dir: dir }
}

/// The director's booking of the fixture's host (ann's) at `epoch`.
fn booking(f: &Fixture, epoch: i64) -> Booking {
    let key = TicketKey::new(SECRET).expect("key");
    let expires = chrono::Utc::now().timestamp_millis() + 30_000;
    let subject = TicketSubject { host_id: f.host, user_id: f.principal.user_id(), cell_id: CELL, epoch };
    Booking { epoch: epoch as u64, ticket: key.sign(&subject, expires) }
}

fn book(f: &Fixture, epoch: i64) {
    let item = ReserveItem { host_id: f.host, epoch, ttl_ms: 30_000 };
    f.cell.reserve(Instant::now(), &[item], false);
}

#[actix_rt::test]
async fn a_booked_hello_is_admitted_without_a_store_query() {
    let f = fixture(AdmitMode::Reserve).await;
    book(&f, 3);
    let before = f.store.queries_total();
    let verdict =
        admit(&f.cell, f.store.as_ref(), &f.principal, None, f.host, Some(&booking(&f, 3)), Instant::now()).await;
    assert_eq!(verdict, Verdict::Accept { by: AdmittedBy::Booking, epoch: 3 });
    assert_eq!(f.store.queries_total(), before, "the booked hello read nothing");

    // The booking admits once; the same hello again is checked in the database.
    let verdict =
        admit(&f.cell, f.store.as_ref(), &f.principal, None, f.host, Some(&booking(&f, 3)), Instant::now()).await;
    assert_eq!(verdict, Verdict::Accept { by: AdmittedBy::Database, epoch: 3 });
    assert!(f.store.queries_total() > before, "the database check is counted");
}

#[actix_rt::test]
async fn a_redial_at_the_same_epoch_is_admitted_from_memory_without_a_store_query() {
    let f = fixture(AdmitMode::Reserve).await;
    book(&f, 2);
    let now = Instant::now();
    admit(&f.cell, f.store.as_ref(), &f.principal, None, f.host, Some(&booking(&f, 2)), now).await;
    f.cell.seats().seated(f.host, 2, 7, AdmittedBy::Booking);
    f.cell.seats().left(now, f.host, 7, 1006);

    let before = f.store.queries_total();
    let verdict = admit(&f.cell, f.store.as_ref(), &f.principal, None, f.host, Some(&booking(&f, 2)), now).await;
    assert_eq!(verdict, Verdict::Accept { by: AdmittedBy::Memory, epoch: 2 });
    assert_eq!(f.store.queries_total(), before, "the redial read nothing");
}

#[actix_rt::test]
async fn a_forged_ticket_or_db_mode_goes_to_the_database() {
    let f = fixture(AdmitMode::Reserve).await;
    book(&f, 1);
    let forged = Booking {
        epoch: 1,
        ticket: TicketKey::new(b"another secret").expect("key").sign(
            &TicketSubject { host_id: f.host, user_id: f.principal.user_id(), cell_id: CELL, epoch: 1 },
            chrono::Utc::now().timestamp_millis() + 30_000,
        ),
    };
    let before = f.store.queries_total();
    let verdict = admit(&f.cell, f.store.as_ref(), &f.principal, None, f.host, Some(&forged), Instant::now()).await;
    assert_eq!(verdict, Verdict::Accept { by: AdmittedBy::Database, epoch: 1 });
    assert!(f.store.queries_total() > before);

    let db = fixture(AdmitMode::Db).await;
    book(&db, 1);
    let before = db.store.queries_total();
    let verdict =
        admit(&db.cell, db.store.as_ref(), &db.principal, None, db.host, Some(&booking(&db, 1)), Instant::now()).await;
    assert_eq!(verdict, Verdict::Accept { by: AdmittedBy::Database, epoch: 1 });
    assert!(db.store.queries_total() > before, "db mode always reads");
}

/// Another user's token with a ticket for ann's host, got hold of (tickets
/// travel in every hello): the ticket does not verify for that user, and
/// the database check refuses the foreign host, for a booking and for a
/// redial from memory alike. It used to be admitted: the other user's
/// "daemon" replaced ann's and received her spawns and keystrokes.
#[actix_rt::test]
async fn another_users_token_with_a_ticket_for_the_host_is_refused() {
    let f = fixture(AdmitMode::Reserve).await;
    let bob = f.store.ensure_user("bob").await.expect("user");
    let bob_token = f.store.insert_token(&NewToken::full(bob.id, &tether::auth::hash_token("b"))).await.expect("token");
    let bob = Principal::new(bob, &bob_token);
    let foreign = Verdict::Refuse { code: 4403, reason: "unknown or foreign host" };
    book(&f, 4);
    let ticket = booking(&f, 4);
    assert_eq!(admit(&f.cell, f.store.as_ref(), &bob, None, f.host, Some(&ticket), Instant::now()).await, foreign);
    // The booking is still ann's to take, and her redial is remembered.
    let now = Instant::now();
    let verdict = admit(&f.cell, f.store.as_ref(), &f.principal, None, f.host, Some(&ticket), now).await;
    assert_eq!(verdict, Verdict::Accept { by: AdmittedBy::Booking, epoch: 4 });
    f.cell.seats().seated(f.host, 4, 7, AdmittedBy::Booking);
    f.cell.seats().left(now, f.host, 7, 1006);
    assert_eq!(admit(&f.cell, f.store.as_ref(), &bob, None, f.host, Some(&ticket), now).await, foreign);
}

#[actix_rt::test]
async fn a_host_assigned_to_another_cell_is_sent_there_with_its_url() {
    let f = fixture(AdmitMode::Db).await;
    let row = CellRow {
        cell_id: "cell-b".into(),
        url: "https://cell-b.relay.example:8443".into(),
        region: String::new(),
        pool_size: 8,
        reserve_pool_size: 2,
    };
    f.store.register_cell(&row).await.expect("register");
    f.store.assign_host(f.host, "cell-b").await.expect("assign");
    let verdict = admit(&f.cell, f.store.as_ref(), &f.principal, None, f.host, None, Instant::now()).await;
    assert_eq!(
        verdict,
        Verdict::WrongCell { cell_id: "cell-b".into(), url: Some("https://cell-b.relay.example:8443".into()) }
    );
    assert_eq!(
        Verdict::wrong_cell_reason("cell-b", Some("https://cell-b.relay.example:8443")),
        "wrong cell: https://cell-b.relay.example:8443"
    );
    // A foreign host is refused before anything else.
    let other = f.store.ensure_user("bob").await.expect("bob");
    let token = f.store.insert_token(&NewToken::full(other.id, &tether::auth::hash_token("b"))).await.expect("token");
    let bob = Principal::new(other, &token);
    let verdict = admit(&f.cell, f.store.as_ref(), &bob, None, f.host, None, Instant::now()).await;
    assert_eq!(verdict, Verdict::Refuse { code: 4403, reason: "unknown or foreign host" });
}

#[actix_rt::test]
async fn a_fresh_prefetched_host_is_not_read_again() {
    let f = fixture(AdmitMode::Db).await;
    let user = f.principal.user.clone();
    let new = NewToken { scope: TokenScope::Daemon, ..NewToken::full(user.id, &tether::auth::hash_token("d")) };
    let token = f.store.insert_token(&new).await.expect("token");
    assert_eq!(f.store.bind_token_host(token.id, f.host).await.expect("bind"), Some(f.host));
    let found = f.store.token_by_hash(&tether::auth::hash_token("d"), chrono::Utc::now()).await.expect("lookup");
    let found = found.expect("usable");
    let daemon = Principal::new(found.user, &found.token);
    let host = found.bound_host.expect("the lookup brought the bound host");
    assert_eq!(host, HostAdmission { user_id: user.id, assignment: None });
    let other = support::store_host(f.store.as_ref(), &user, "box-2").await.id;
    let now = Instant::now();
    let fresh = Prefetched { host_id: f.host, host: host.clone(), read_at: now };

    let before = f.store.queries_total();
    let verdict = admit(&f.cell, f.store.as_ref(), &daemon, Some(&fresh), f.host, None, now).await;
    assert_eq!(verdict, Verdict::Accept { by: AdmittedBy::Database, epoch: 0 });
    assert_eq!(f.store.queries_total(), before, "the hello read nothing the upgrade had read");

    // Too old, or a hello of another host: read again.
    let late = now + PREFETCH_FRESH + Duration::from_millis(1);
    let verdict = admit(&f.cell, f.store.as_ref(), &daemon, Some(&fresh), f.host, None, late).await;
    assert_eq!(verdict, Verdict::Accept { by: AdmittedBy::Database, epoch: 0 });
    assert_eq!(f.store.queries_total(), before + 1, "a stale row is read again");
    let verdict = admit(&f.cell, f.store.as_ref(), &daemon, Some(&fresh), other, None, now).await;
    assert_eq!(verdict, Verdict::Refuse { code: 4403, reason: "this daemon token is bound to another host" });
    assert_eq!(f.store.queries_total(), before + 2);

    // A fresh row that places the host on another cell sends it there.
    let placed = HostAdmission { user_id: user.id, assignment: Some(("cell-b".into(), 4)) };
    let moved = Prefetched { host: placed, ..fresh.clone() };
    let verdict = admit(&f.cell, f.store.as_ref(), &daemon, Some(&moved), f.host, None, now).await;
    assert_eq!(verdict, Verdict::WrongCell { cell_id: "cell-b".into(), url: None });
}
