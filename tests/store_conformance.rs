//! One conformance suite for both store backends: every test below runs
//! against the embedded SQLite file and against a real PostgreSQL database
//! (a fresh database per test, from tests/support).

mod support;

use std::sync::Arc;
use std::time::Duration;

use tether::store::postgres::PgStore;
use tether::store::sqlite::SqliteStore;
use tether::store::*;
use uuid::Uuid;

/// A store plus whatever must outlive it (the SQLite temp dir).
struct Fixture {
    store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
}

async fn sqlite() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("t.db")).expect("open sqlite");
    store.migrate().await.expect("migrate sqlite");
    Fixture { store: Arc::new(store), _dir: Some(dir) }
}

async fn postgres() -> Fixture {
    let url = support::pg_database().await;
    let store = PgStore::connect(&url, 8).await.expect("connect postgres");
    store.migrate().await.expect("migrate postgres");
    Fixture { store: Arc::new(store), _dir: None }
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite_backend {
            $(#[actix_rt::test] async fn $name() { super::$name(&super::sqlite().await.store).await })*
        }
        mod postgres_backend {
            $(#[actix_rt::test] async fn $name() { super::$name(&super::postgres().await.store).await })*
        }
    };
}

conformance!(
    migrations_are_recorded_once,
    users_and_tokens,
    tokens_scope_expiry_and_revocation,
    token_last_use_is_stamped_once_a_minute,
    ended_tokens_are_read_from_the_log,
    daemon_tokens_bind_to_their_first_host,
    a_host_takes_a_second_daemon_token_only_once_the_first_is_unusable,
    daemon_tokens_register_hosts_in_one_step,
    hosts_upsert_and_scope,
    host_and_terminal_pages,
    host_delete_removes_dependents,
    terminal_lifecycle_compares_state,
    terminal_writes_are_scoped_by_host,
    terminal_delete_refuses_live,
    hello_reconciliation,
    hello_revives_terminals_its_daemon_still_runs,
    hello_admission_reads_the_owner_and_the_assignment,
    token_lookup_brings_the_bound_host,
    tokens_are_looked_up_many_at_once,
    parked_terminals_and_stuck_launches,
    snapshots,
    lease_claim_and_renew_check_the_holder,
    lease_release_only_own,
    lease_holders_read_back_typed,
    lease_seize_replaces_any_holder,
    lease_expiry,
    renewing_a_host_lease_marks_the_host_seen,
    a_drain_releases_its_host_leases_at_once,
    hosts_without_a_live_lease_are_marked_offline_at_once,
    runs_queue_and_finish,
    run_pages_filter_by_host_and_state,
    run_claims_never_overlap,
    run_log_is_capped,
    run_log_is_idempotent_by_offset_and_counts_gaps,
    credentials_round_trip,
    credentials_expiring_on_connected_hosts,
    stale_hosts_go_offline,
    runs_of_long_gone_hosts_are_lost,
    interaction_stamp_once_a_minute,
    audit_events_append_list_and_age_out,
);

const TTL: Duration = Duration::from_secs(30);

async fn user(store: &Arc<dyn Store>, name: &str) -> User {
    store.ensure_user(name).await.expect("user")
}

async fn host(store: &Arc<dyn Store>, user: &User, hostname: &str) -> Host {
    support::store_host(store.as_ref(), user, hostname).await
}

fn new_terminal(host: &Host) -> NewTerminal {
    NewTerminal {
        user_id: host.user_id,
        host_id: host.id,
        title: Some("t".into()),
        dir: None,
        argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
        cols: 80,
        rows: 24,
        run_id: None,
    }
}

async fn terminal(store: &Arc<dyn Store>, host: &Host) -> Terminal {
    store.insert_terminal(&new_terminal(host), None).await.expect("terminal")
}

/// A daemon's hello for `host_id` by connection `holder`, reporting `running`.
async fn hello(
    store: &Arc<dyn Store>,
    host_id: Uuid,
    holder: &LeaseHolder,
    capabilities: &Capabilities,
    dirs: &[String],
    running: &[Uuid],
) -> Vec<HelloTerminal> {
    let record = HostHello { host_id, holder, lease_ttl: TTL, capabilities, dirs, running };
    store.host_hello(&record).await.expect("hello")
}

async fn state_of(store: &Arc<dyn Store>, id: Uuid) -> TerminalState {
    store.terminal_by_id(id).await.expect("read").expect("exists").state
}

async fn migrations_are_recorded_once(store: &Arc<dyn Store>) {
    assert_eq!(store.migrate().await.expect("second migrate"), 0, "a second run applies nothing");
    let migrations = if store.backend() == "postgres" { MIGRATIONS_POSTGRES } else { MIGRATIONS_SQLITE };
    let latest = migrations.iter().map(|m| m.version).max().expect("migrations");
    assert_eq!(store.schema_version().await.expect("version"), latest);
}

async fn users_and_tokens(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    assert_eq!(user(store, "ann").await.id, ann.id, "ensure_user is idempotent");
    assert_eq!(store.user_by_name("ann").await.expect("lookup").map(|u| u.id), Some(ann.id));
    assert_eq!(store.user_by_name("nobody").await.expect("lookup"), None, "a lookup creates nobody");
    let token = store.insert_token(&NewToken::full(ann.id, "hash-1")).await.expect("token");
    assert_eq!((token.scope, token.expires_at, token.revoked_at), (TokenScope::Full, None, None));
    let found = store.token_by_hash("hash-1", chrono::Utc::now()).await.expect("lookup").expect("found");
    assert_eq!((found.user.id, found.token.id, found.bound_host), (ann.id, token.id, None));
    assert_eq!(store.token_by_hash("hash-2", chrono::Utc::now()).await.expect("lookup"), None);
}

async fn tokens_scope_expiry_and_revocation(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bob = user(store, "bob").await;
    let now = chrono::Utc::now();
    let daemon = store
        .insert_token(&NewToken {
            name: Some("laptop".into()),
            scope: TokenScope::Daemon,
            expires_at: Some(now + chrono::Duration::hours(1)),
            ..NewToken::full(ann.id, "hash-daemon")
        })
        .await
        .expect("daemon token");
    assert_eq!((daemon.scope, daemon.name.as_deref()), (TokenScope::Daemon, Some("laptop")));
    let expired = store
        .insert_token(&NewToken {
            expires_at: Some(now - chrono::Duration::seconds(1)),
            ..NewToken::full(ann.id, "hash-old")
        })
        .await
        .expect("expired token");
    assert_eq!(
        store.token_by_hash("hash-old", chrono::Utc::now()).await.expect("lookup"),
        None,
        "an expired token is refused"
    );
    assert!(store.token_by_hash("hash-daemon", chrono::Utc::now()).await.expect("lookup").is_some());
    let mut ended = store.ended_tokens(None, &[daemon.id, expired.id]).await.expect("ended").ended;
    ended.sort();
    assert_eq!(ended, vec![expired.id], "of fresh ids, only the unusable one");

    // Another user cannot revoke it; its owner (or the operator) can, once.
    assert_eq!(store.revoke_token(Some(bob.id), daemon.id).await.expect("revoke as bob"), None);
    assert!(store.token_by_hash("hash-daemon", chrono::Utc::now()).await.expect("lookup").is_some());
    assert_eq!(
        store.revoke_token(Some(ann.id), daemon.id).await.expect("revoke"),
        Some(Revocation::Now { user_id: ann.id })
    );
    let first = store.token_by_id(daemon.id).await.expect("read").expect("row").revoked_at.expect("revoked");
    assert_eq!(store.revoke_token(None, daemon.id).await.expect("revoke again"), Some(Revocation::Earlier));
    assert_eq!(store.token_by_id(daemon.id).await.expect("read").expect("row").revoked_at, Some(first));
    assert_eq!(
        store.token_by_hash("hash-daemon", chrono::Utc::now()).await.expect("lookup"),
        None,
        "a revoked token is refused"
    );
    assert_eq!(store.ended_tokens(None, &[daemon.id]).await.expect("ended").ended, vec![daemon.id]);
    assert_eq!(store.revoke_token(None, Uuid::new_v4()).await.expect("revoke unknown"), None);

    let listed: Vec<Uuid> = store.list_tokens(ann.id).await.expect("list").iter().map(|t| t.id).collect();
    assert_eq!(listed, vec![daemon.id, expired.id]);
    assert!(store.list_tokens(bob.id).await.expect("list").is_empty());
}

/// The revocation watch's look: what was revoked, deleted (by cascade too)
/// or expired after `since`, and the fresh ids that are unusable; a look
/// whose window is past those changes finds nothing.
async fn ended_tokens_are_read_from_the_log(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let h = host(store, &ann, "box").await;
    let t = terminal(store, &h).await;
    let token = |hash: &'static str, expires_at, terminal_id| {
        let new = NewToken { expires_at, terminal_id, ..NewToken::full(ann.id, hash) };
        let new = if terminal_id.is_some() { NewToken { scope: TokenScope::Read, ..new } } else { new };
        async move { store.insert_token(&new).await.expect("token").id }
    };
    let kept = token("hash-kept", None, None).await;
    let revoked = token("hash-revoked", None, None).await;
    let shared = token("hash-shared", None, Some(t.id)).await;

    let start = store.ended_tokens(None, &[]).await.expect("look");
    assert!(start.ended.is_empty(), "no window and no fresh id: nothing");
    let since = Some(start.checked_at);
    assert!(store.ended_tokens(since, &[kept]).await.expect("look").ended.is_empty(), "nothing ended yet");
    // Expiring inside the window, however slow the machine: just after its start.
    let expiring = token("hash-expiring", Some(start.checked_at + chrono::Duration::milliseconds(1)), None).await;
    // The changes below must come after `since`, and SQLite stamps milliseconds.
    tokio::time::sleep(Duration::from_millis(2)).await;

    assert_eq!(store.revoke_token(None, revoked).await.expect("revoke"), Some(Revocation::Now { user_id: ann.id }));
    assert!(store.mark_exited(h.id, t.id, ExitStatus::default()).await.expect("exit"));
    assert_eq!(store.delete_terminal(ann.id, t.id).await.expect("delete"), DeleteOutcome::Deleted);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let found = store.ended_tokens(since, &[]).await.expect("look");
    let mut ended = found.ended.clone();
    ended.sort();
    let mut want = vec![revoked, expiring, shared];
    want.sort();
    assert_eq!(ended, want, "revoked, expired and deleted with their terminal; not {kept}");
    assert!(found.checked_at > start.checked_at);

    let later = store.ended_tokens(Some(found.checked_at), &[]).await.expect("look");
    assert!(later.ended.is_empty(), "a window after the changes finds none of them");
    assert_eq!(store.ended_tokens(Some(found.checked_at), &[revoked, kept]).await.expect("look").ended, vec![revoked]);
    assert!(
        store.delete_token_ends_before(found.checked_at + chrono::Duration::seconds(1)).await.expect("sweep") >= 2,
        "the revocation and the deletion were logged"
    );
    assert!(store.ended_tokens(since, &[]).await.expect("look").ended == vec![expiring], "only the expiry is left");
}

async fn token_last_use_is_stamped_once_a_minute(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let token = store.insert_token(&NewToken::full(ann.id, "hash-1")).await.expect("token");
    let t0 = chrono::Utc::now();
    let touch = |now| async move { store.token_by_hash("hash-1", now).await.expect("lookup").expect("usable") };
    assert_eq!(touch(t0).await.token.last_used_at, None, "the row as it was read");
    let stamped = |store: Arc<dyn Store>| async move {
        store.token_by_id(token.id).await.expect("read").expect("row").last_used_at.expect("stamped")
    };
    let first = stamped(store.clone()).await;
    assert!((first - t0).num_milliseconds().abs() < 2, "{first} vs {t0}");
    touch(t0 + chrono::Duration::seconds(59)).await;
    assert_eq!(stamped(store.clone()).await, first, "not again within a minute");
    touch(t0 + chrono::Duration::seconds(61)).await;
    assert!(stamped(store.clone()).await > first, "again after a minute");
}

async fn daemon_tokens_bind_to_their_first_host(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let token = store
        .insert_token(&NewToken { scope: TokenScope::Daemon, ..NewToken::full(ann.id, "hash-1") })
        .await
        .expect("token");
    let (h1, h2) = (Uuid::new_v4(), Uuid::new_v4());
    assert_eq!(store.bind_token_host(token.id, h1).await.expect("bind"), Some(h1));
    assert_eq!(store.bind_token_host(token.id, h2).await.expect("bind"), Some(h1), "the first host stays");
    assert_eq!(store.bind_token_host(Uuid::new_v4(), h2).await.expect("bind"), None, "no such token");
}

/// An unbound daemon token does not bind to a host another usable daemon
/// token is bound to (it stays unbound); it does once that one is revoked
/// or expired.
async fn a_host_takes_a_second_daemon_token_only_once_the_first_is_unusable(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bx = host(store, &ann, "box").await;
    let daemon = |hash: &'static str| NewToken { scope: TokenScope::Daemon, ..NewToken::full(ann.id, hash) };
    let first = store.insert_token(&daemon("hash-first")).await.expect("token");
    let second = store.insert_token(&daemon("hash-second")).await.expect("token");
    assert_eq!(store.bind_token_host(first.id, bx.id).await.expect("bind"), Some(bx.id));
    assert_eq!(store.bind_token_host(second.id, bx.id).await.expect("bind"), None, "the host has a token");
    let other = host(store, &ann, "other").await;
    assert_eq!(store.bind_token_host(second.id, other.id).await.expect("bind"), Some(other.id), "still unbound");

    let third = store.insert_token(&daemon("hash-third")).await.expect("token");
    assert_eq!(store.bind_token_host(third.id, bx.id).await.expect("bind"), None);
    store.revoke_token(None, first.id).await.expect("revoke");
    assert_eq!(store.bind_token_host(third.id, bx.id).await.expect("bind"), Some(bx.id), "the first is revoked");

    let expired = NewToken {
        expires_at: Some(chrono::Utc::now() - chrono::Duration::seconds(1)),
        host_id: Some(other.id),
        ..daemon("hash-expired")
    };
    store.insert_token(&expired).await.expect("token");
    let fourth = store.insert_token(&daemon("hash-fourth")).await.expect("token");
    assert_eq!(store.bind_token_host(fourth.id, other.id).await.expect("bind"), None, "second still holds it");
    store.revoke_token(None, second.id).await.expect("revoke");
    assert_eq!(
        store.bind_token_host(fourth.id, other.id).await.expect("bind"),
        Some(other.id),
        "an expired token holds nothing"
    );
}

/// A daemon token registers its own host, or binds to one no other usable
/// daemon token holds, in one step: a refusal changes nothing, one token
/// registering several hostnames at once gets one host, and deleting a
/// host frees its tokens to register a machine again.
async fn daemon_tokens_register_hosts_in_one_step(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let daemon = |hash: &'static str| NewToken { scope: TokenScope::Daemon, ..NewToken::full(ann.id, hash) };
    let machine = |hostname: &str, name: &str| NewHost {
        user_id: ann.id,
        name: name.into(),
        hostname: hostname.into(),
        platform: "linux".into(),
        arch: "x86_64".into(),
    };
    let bound_to = |id: Uuid| {
        let store = store.clone();
        async move { store.token_by_id(id).await.expect("token").expect("a token").host_id }
    };
    let first = store.insert_token(&daemon("hash-first")).await.expect("token");
    let registered = store.register_host(&machine("laptop", "laptop"), Some(first.id)).await.expect("register");
    let Registered::Host(laptop) = registered else { panic!("an unbound token refused: {registered:?}") };
    assert_eq!(bound_to(first.id).await, Some(laptop.id));
    let again = store.register_host(&machine("laptop", "renamed"), Some(first.id)).await.expect("register");
    assert!(matches!(&again, Registered::Host(h) if h.id == laptop.id && h.name == "renamed"), "{again:?}");
    let elsewhere = store.register_host(&machine("other", "other"), Some(first.id)).await.expect("register");
    assert!(matches!(elsewhere, Registered::TokenBoundElsewhere), "{elsewhere:?}");

    // Another token on the bound machine: refused, and the host keeps its name.
    let second = store.insert_token(&daemon("hash-second")).await.expect("token");
    let taken = store.register_host(&machine("laptop", "PWNED"), Some(second.id)).await.expect("register");
    assert!(matches!(taken, Registered::HostHasToken), "{taken:?}");
    let hosts = store.list_hosts(ann.id).await.expect("hosts");
    assert_eq!(
        hosts.iter().map(|h| (h.hostname.as_str(), h.name.as_str())).collect::<Vec<_>>(),
        [("laptop", "renamed")]
    );
    assert_eq!(bound_to(second.id).await, None);

    // One unbound token registering six hostnames at once: one host.
    let third = store.insert_token(&daemon("hash-third")).await.expect("token");
    let tries = (0..6).map(|i| {
        let (store, new) = (store.clone(), machine(&format!("race-{i}"), "race"));
        async move { store.register_host(&new, Some(third.id)).await.expect("register") }
    });
    let outcomes = futures_util::future::join_all(tries).await;
    let won = outcomes.iter().filter(|o| matches!(o, Registered::Host(_))).count();
    assert_eq!(won, 1, "{outcomes:?}");
    assert_eq!(store.list_hosts(ann.id).await.expect("hosts").len(), 2, "only the winner's host was made");

    // A deleted host's token may register the machine again.
    assert!(store.delete_host(ann.id, laptop.id).await.expect("delete"));
    assert_eq!(bound_to(first.id).await, None);
    let back = store.register_host(&machine("laptop", "laptop"), Some(first.id)).await.expect("register");
    assert!(matches!(back, Registered::Host(_)), "{back:?}");
}

/// Pages in creation order after a cursor, filtered by the host's lease or
/// the terminal's host and state; a deleted cursor item moves nothing.
async fn host_and_terminal_pages(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bob = user(store, "bob").await;
    let mut hosts = Vec::new();
    for name in ["h1", "h2", "h3", "h4", "h5"] {
        hosts.push(host(store, &ann, name).await);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    host(store, &bob, "other").await;
    for live in [&hosts[1], &hosts[3]] {
        assert!(store.claim_lease(&host_lease_key(live.id), &h("i1", 1), TTL).await.expect("lease"));
    }
    let at = |host: &Host| Some((host.created_at, host.id));
    let page = |online, after, limit| async move {
        let rows = store.page_hosts(ann.id, online, &PageAfter { after, limit }).await.expect("page");
        rows.into_iter().map(|(h, live)| (h.hostname, live)).collect::<Vec<_>>()
    };
    let names = |rows: Vec<(String, bool)>| rows.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(
        page(None, None, 3).await,
        vec![("h1".into(), false), ("h2".into(), true), ("h3".into(), false)],
        "the first page, with each host's lease"
    );
    assert_eq!(names(page(None, at(&hosts[2]), 3).await), ["h4", "h5"]);
    assert_eq!(names(page(Some(true), None, 10).await), ["h2", "h4"]);
    assert_eq!(names(page(Some(false), at(&hosts[0]), 10).await), ["h3", "h5"]);
    assert!(store.delete_host(ann.id, hosts[2].id).await.expect("delete"));
    assert_eq!(names(page(None, at(&hosts[2]), 10).await), ["h4", "h5"], "after where the deleted host was");

    let mut terminals = Vec::new();
    for on in [&hosts[0], &hosts[1], &hosts[0]] {
        terminals.push(terminal(store, on).await);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(store.mark_started(hosts[0].id, terminals[2].id).await.expect("start"));
    let tpage = |filter: TerminalFilter, after, limit| async move {
        let rows = store.page_terminals(ann.id, &filter, &PageAfter { after, limit }).await.expect("page");
        rows.into_iter().map(|t| t.id).collect::<Vec<_>>()
    };
    let ids = |list: &[&Terminal]| list.iter().map(|t| t.id).collect::<Vec<_>>();
    let all = TerminalFilter::default();
    assert_eq!(tpage(all.clone(), None, 2).await, ids(&[&terminals[0], &terminals[1]]));
    let after = Some((terminals[1].created_at, terminals[1].id));
    assert_eq!(tpage(all, after, 2).await, ids(&[&terminals[2]]));
    let of_h1 = TerminalFilter { host_id: Some(hosts[0].id), state: None };
    assert_eq!(tpage(of_h1, None, 10).await, ids(&[&terminals[0], &terminals[2]]));
    let running = TerminalFilter { host_id: None, state: Some(TerminalState::Running) };
    assert_eq!(tpage(running, None, 10).await, ids(&[&terminals[2]]));
    assert!(store
        .page_terminals(bob.id, &TerminalFilter::default(), &PageAfter::first(10))
        .await
        .expect("page")
        .is_empty());
}

async fn hosts_upsert_and_scope(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bob = user(store, "bob").await;
    let h1 = host(store, &ann, "box").await;
    let renamed = NewHost {
        user_id: ann.id,
        name: "renamed".into(),
        hostname: "box".into(),
        platform: "linux".into(),
        arch: "aarch64".into(),
    };
    let Registered::Host(again) = store.register_host(&renamed, None).await.expect("upsert") else {
        panic!("refused with no token")
    };
    assert_eq!(again.id, h1.id, "upsert by user + hostname keeps the id");
    assert_eq!(again.name, "renamed");
    assert_eq!(again.arch, "aarch64");
    let bobs = host(store, &bob, "box").await;
    assert_ne!(bobs.id, h1.id, "the same hostname under another user is another host");
    assert!(store.get_host(bob.id, h1.id).await.expect("get").is_none(), "another user's host is invisible");
    assert_eq!(store.list_hosts(ann.id).await.expect("list").len(), 1);
    let caps = Capabilities {
        manage_dirs: true,
        refresh_limits: true,
        credentials: false,
        usage: true,
        flow_control: true,
        input_flow_control: true,
    };
    hello(store, h1.id, &h("a", 1), &caps, &["/home/ann".into()], &[]).await;
    let h = store.host_by_id(h1.id).await.expect("get").expect("exists");
    assert_eq!(h.capabilities, caps);
    assert_eq!(h.dirs, vec!["/home/ann".to_string()]);
    assert_eq!(h.state, HostState::Online);
    assert!(h.last_seen_at.is_some());
}

async fn host_delete_removes_dependents(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bob = user(store, "bob").await;
    let h = host(store, &ann, "box").await;
    let t = terminal(store, &h).await;
    let run =
        store.insert_run(&NewRun { user_id: ann.id, host_id: h.id, argv: vec!["true".into()], dir: None }, None).await;
    let run = run.expect("run");
    assert!(!store.delete_host(bob.id, h.id).await.expect("delete"), "bob cannot delete ann's host");
    assert!(store.delete_host(ann.id, h.id).await.expect("delete"));
    assert!(store.terminal_by_id(t.id).await.expect("read").is_none());
    assert!(store.get_run(ann.id, run.id).await.expect("read").is_none());
    assert!(!store.delete_host(ann.id, h.id).await.expect("delete twice"));
}

async fn terminal_lifecycle_compares_state(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let h = host(store, &ann, "box").await;
    let t = terminal(store, &h).await;
    assert_eq!(t.state, TerminalState::Pending);
    assert_eq!(t.pending_reason.as_deref(), Some(PENDING_HOST_OFFLINE));
    assert_eq!(t.argv, vec!["sh", "-c", "echo hi"]);
    assert!(store.claim_launch(h.id, t.id).await.expect("claim"));
    assert!(!store.claim_launch(h.id, t.id).await.expect("claim twice"), "compare-and-set: only one claim wins");
    assert_eq!(state_of(store, t.id).await, TerminalState::Launching);
    assert!(store.mark_started(h.id, t.id).await.expect("started"));
    assert!(!store.mark_started(h.id, t.id).await.expect("started twice"));
    let exit = ExitStatus { code: Some(3), signal: None };
    assert!(store.mark_exited(h.id, t.id, exit).await.expect("exited"));
    assert!(!store.mark_exited(h.id, t.id, ExitStatus::default()).await.expect("late exit"), "no blind overwrite");
    let t = store.terminal_by_id(t.id).await.expect("read").expect("exists");
    assert_eq!((t.state, t.exit_code, t.exit_signal), (TerminalState::Exited, Some(3), None));
    assert!(t.started_at.is_some() && t.ended_at.is_some());
    assert!(!store.mark_started(h.id, t.id).await.expect("started after exit"), "an exited terminal stays exited");

    let t2 = terminal(store, &h).await;
    assert!(store.mark_started(h.id, t2.id).await.expect("Started accepts pending"));
    let t3 = terminal(store, &h).await;
    assert!(store.claim_launch(h.id, t3.id).await.expect("claim"));
    assert!(store.mark_spawn_failed(h.id, t3.id, "no such dir").await.expect("spawn error"));
    let t3 = store.terminal_by_id(t3.id).await.expect("read").expect("exists");
    assert_eq!((t3.state, t3.error.as_deref()), (TerminalState::Error, Some("no such dir")));
    let t4 = terminal(store, &h).await;
    assert!(store.claim_launch(h.id, t4.id).await.expect("claim"));
    assert!(store.park_terminal(h.id, t4.id, PENDING_HOST_OFFLINE).await.expect("park"));
    assert_eq!(state_of(store, t4.id).await, TerminalState::Pending);
}

async fn terminal_writes_are_scoped_by_host(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let h = host(store, &ann, "box").await;
    let other = host(store, &ann, "other").await;
    let t = terminal(store, &h).await;
    assert!(!store.claim_launch(other.id, t.id).await.expect("claim"));
    assert!(!store.mark_started(other.id, t.id).await.expect("started"));
    assert!(!store.mark_exited(other.id, t.id, ExitStatus::default()).await.expect("exit"));
    let snap = TerminalSnapshot { data: b"x".to_vec(), cols: 80, rows: 24 };
    store.put_snapshot(other.id, t.id, &snap).await.expect("snapshot");
    assert!(store.get_snapshot(t.id).await.expect("read").is_none(), "another host cannot write this terminal");
    store.set_terminal_size(other.id, t.id, 10, 10).await.expect("size");
    assert_eq!(state_of(store, t.id).await, TerminalState::Pending);
    assert_eq!(store.terminal_by_id(t.id).await.expect("read").expect("exists").cols, 80);
}

async fn terminal_delete_refuses_live(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bob = user(store, "bob").await;
    let h = host(store, &ann, "box").await;
    let t = terminal(store, &h).await;
    assert!(store.mark_started(h.id, t.id).await.expect("started"));
    assert_eq!(store.delete_terminal(ann.id, t.id).await.expect("delete"), DeleteOutcome::Conflict);
    assert_eq!(store.delete_terminal(bob.id, t.id).await.expect("delete"), DeleteOutcome::NotFound);
    assert!(store.mark_exited(h.id, t.id, ExitStatus::default()).await.expect("exit"));
    assert_eq!(store.delete_terminal(ann.id, t.id).await.expect("delete"), DeleteOutcome::Deleted);
    assert_eq!(store.delete_terminal(ann.id, t.id).await.expect("delete"), DeleteOutcome::NotFound);
    let pending = terminal(store, &h).await;
    assert_eq!(store.delete_terminal(ann.id, pending.id).await.expect("delete"), DeleteOutcome::Deleted);
}

/// One call seizes the lease, marks the host online, reconciles its
/// terminals (and the runs of those that are gone) and answers the live and
/// pending ones as they are after it.
async fn hello_reconciliation(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bx = host(store, &ann, "box").await;
    let run_of = |argv: &str| NewRun { user_id: ann.id, host_id: bx.id, argv: vec![argv.into()], dir: None };
    let kept_run = store.insert_run(&run_of("kept"), None).await.expect("run");
    let gone_run = store.insert_run(&run_of("gone"), None).await.expect("run");
    let with_run = |run_id| NewTerminal { run_id: Some(run_id), ..new_terminal(&bx) };
    let kept = store.insert_terminal(&with_run(kept_run.id), None).await.expect("terminal");
    let gone = store.insert_terminal(&with_run(gone_run.id), None).await.expect("terminal");
    let launching = terminal(store, &bx).await;
    let parked = terminal(store, &bx).await;
    let ended = terminal(store, &bx).await;
    assert_eq!(store.claim_queued_runs(&[bx.id], 10).await.expect("dispatch").len(), 2);
    for (run, t) in [(&kept_run, &kept), (&gone_run, &gone)] {
        store.set_run_terminal(run.id, t.id).await.expect("link");
        assert!(store.mark_run_running(run.id).await.expect("running"));
        assert!(store.mark_started(bx.id, t.id).await.expect("started"));
    }
    store.append_run_log(kept_run.id, 0, b"so far", 1024).await.expect("log");
    store.claim_launch(bx.id, launching.id).await.expect("claim");
    assert!(store.mark_exited(bx.id, ended.id, ExitStatus::default()).await.expect("exit"));
    assert!(store.claim_lease(&host_lease_key(bx.id), &h("old", 1), TTL).await.expect("lease"));

    let caps = Capabilities { flow_control: true, ..Capabilities::default() };
    let answer = hello(store, bx.id, &h("new", 2), &caps, &["/srv".into()], &[kept.id, launching.id]).await;

    let got: Vec<(Uuid, TerminalState, Option<i64>)> =
        answer.iter().map(|t| (t.terminal.id, t.terminal.state, t.unfinished_run_log_end)).collect();
    assert_eq!(
        got,
        vec![
            (kept.id, TerminalState::Running, Some(6)),
            (launching.id, TerminalState::Running, None),
            (parked.id, TerminalState::Pending, None),
        ],
        "live and pending terminals, oldest first, as they are after the hello"
    );
    assert!(answer[1].terminal.started_at.is_some(), "a reported launch is started");
    assert_eq!(state_of(store, kept.id).await, TerminalState::Running);
    assert_eq!(state_of(store, gone.id).await, TerminalState::Exited, "not reported: exited");
    assert_eq!(state_of(store, launching.id).await, TerminalState::Running, "reported launching becomes running");
    assert_eq!(state_of(store, parked.id).await, TerminalState::Pending, "parked rows are untouched");
    let run_state = |id| async move { store.get_run(ann.id, id).await.expect("get").expect("run").state };
    assert_eq!(run_state(gone_run.id).await, RunState::Failed, "the run of a gone terminal failed");
    assert_eq!(run_state(kept_run.id).await, RunState::Running);
    assert_eq!(store.lease_holder(&host_lease_key(bx.id)).await.expect("holder"), Some(h("new", 2)), "seized");
    let host = store.host_by_id(bx.id).await.expect("read").expect("host");
    assert_eq!((host.state, host.capabilities, host.dirs), (HostState::Online, caps, vec!["/srv".to_string()]));
}

/// A second daemon of the same host says hello without the first one's
/// terminals, which are marked exited; when the first returns and reports
/// them, they are running again. A recorded exit stays as it is.
async fn hello_revives_terminals_its_daemon_still_runs(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bx = host(store, &ann, "box").await;
    let kept = terminal(store, &bx).await;
    let finished = terminal(store, &bx).await;
    for t in [&kept, &finished] {
        assert!(store.mark_started(bx.id, t.id).await.expect("started"));
    }
    let caps = Capabilities::default();
    hello(store, bx.id, &h("second", 1), &caps, &[], &[finished.id]).await;
    let before = store.terminal_by_id(kept.id).await.expect("read").expect("row");
    assert_eq!(before.state, TerminalState::Exited, "not reported by the second daemon");
    assert!(before.ended_at.is_some());
    assert!(store.mark_exited(bx.id, finished.id, ExitStatus { code: Some(3), signal: None }).await.expect("exit"));

    let answer = hello(store, bx.id, &h("first", 2), &caps, &[], &[kept.id, finished.id]).await;

    let got: Vec<(Uuid, TerminalState)> = answer.iter().map(|t| (t.terminal.id, t.terminal.state)).collect();
    assert_eq!(got, vec![(kept.id, TerminalState::Running)], "the reported terminal is live again");
    assert_eq!(answer[0].terminal.ended_at, None);
    let after = store.terminal_by_id(kept.id).await.expect("read").expect("row");
    assert_eq!((after.state, after.ended_at, after.started_at), (TerminalState::Running, None, before.started_at));
    let done = store.terminal_by_id(finished.id).await.expect("read").expect("row");
    assert_eq!((done.state, done.exit_code), (TerminalState::Exited, Some(3)), "a recorded exit stays");
}

/// The hello's database check reads the owner and the assignment in one query.
async fn hello_admission_reads_the_owner_and_the_assignment(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bx = host(store, &ann, "box").await;
    assert_eq!(store.host_admission(Uuid::new_v4()).await.expect("read"), None, "unknown host");
    let unassigned = HostAdmission { user_id: ann.id, assignment: None };
    assert_eq!(store.host_admission(bx.id).await.expect("read"), Some(unassigned));
    let epoch = store.assign_host(bx.id, "cell-a").await.expect("assign");
    let assigned = HostAdmission { user_id: ann.id, assignment: Some(("cell-a".to_string(), epoch)) };
    assert_eq!(store.host_admission(bx.id).await.expect("read"), Some(assigned));
}

/// A token bound to a host brings that host as the hello's check reads it,
/// in the lookup's own round trip; an unbound token, or one whose host is
/// gone, brings none.
async fn token_lookup_brings_the_bound_host(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bx = host(store, &ann, "box").await;
    let daemon = NewToken { scope: TokenScope::Daemon, ..NewToken::full(ann.id, "hash-bound") };
    let token = store.insert_token(&daemon).await.expect("token");
    let lookup =
        || async { store.token_by_hash("hash-bound", chrono::Utc::now()).await.expect("lookup").expect("usable") };
    assert_eq!(lookup().await.bound_host, None, "not bound yet");
    assert_eq!(store.bind_token_host(token.id, bx.id).await.expect("bind"), Some(bx.id));
    let found = lookup().await;
    assert_eq!(found.token.host_id, Some(bx.id));
    assert_eq!(found.bound_host, Some(HostAdmission { user_id: ann.id, assignment: None }));
    let epoch = store.assign_host(bx.id, "cell-a").await.expect("assign");
    let assigned = HostAdmission { user_id: ann.id, assignment: Some(("cell-a".to_string(), epoch)) };
    assert_eq!(lookup().await.bound_host, Some(assigned.clone()));
    assert_eq!(store.host_admission(bx.id).await.expect("read"), Some(assigned), "the same row as the check's");
    assert!(store.delete_host(ann.id, bx.id).await.expect("delete"));
    assert_eq!(lookup().await.bound_host, None, "the host is gone");
}

/// Many hashes in one lookup: each usable token comes back under its own
/// hash, with its user and bound host, and is stamped; unknown, revoked and
/// expired hashes are left out.
async fn tokens_are_looked_up_many_at_once(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bob = user(store, "bob").await;
    let bx = host(store, &bob, "box").await;
    let now = chrono::Utc::now();
    let full = store.insert_token(&NewToken::full(ann.id, "hash-ann")).await.expect("token");
    let daemon = NewToken { scope: TokenScope::Daemon, ..NewToken::full(bob.id, "hash-bob") };
    let daemon = store.insert_token(&daemon).await.expect("token");
    assert_eq!(store.bind_token_host(daemon.id, bx.id).await.expect("bind"), Some(bx.id));
    let revoked = store.insert_token(&NewToken::full(ann.id, "hash-revoked")).await.expect("token");
    assert_eq!(store.revoke_token(None, revoked.id).await.expect("revoke"), Some(Revocation::Now { user_id: ann.id }));
    let expired =
        NewToken { expires_at: Some(now - chrono::Duration::seconds(1)), ..NewToken::full(ann.id, "hash-old") };
    store.insert_token(&expired).await.expect("token");

    let hashes: Vec<String> =
        ["hash-ann", "hash-bob", "hash-revoked", "hash-old", "hash-unknown"].map(String::from).to_vec();
    let mut found = store.tokens_by_hash(&hashes, now).await.expect("lookup");
    let mut keys: Vec<&String> = found.keys().collect();
    keys.sort();
    assert_eq!(keys, ["hash-ann", "hash-bob"], "only the usable tokens");
    let ann_found = found.remove("hash-ann").expect("ann's");
    assert_eq!((ann_found.user.id, ann_found.token.id, ann_found.bound_host), (ann.id, full.id, None));
    let bob_found = found.remove("hash-bob").expect("bob's");
    assert_eq!((bob_found.user.id, bob_found.token.id), (bob.id, daemon.id));
    assert_eq!(bob_found.bound_host, Some(HostAdmission { user_id: bob.id, assignment: None }));
    for id in [full.id, daemon.id] {
        let stamped = store.token_by_id(id).await.expect("read").expect("row").last_used_at.expect("stamped");
        assert!((stamped - now).num_milliseconds().abs() < 2, "{stamped} vs {now}");
    }
    assert!(store.tokens_by_hash(&[], now).await.expect("no hashes").is_empty());
}

async fn parked_terminals_and_stuck_launches(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let h = host(store, &ann, "box").await;
    let a = terminal(store, &h).await;
    let b = terminal(store, &h).await;
    let parked: Vec<Uuid> = store.parked_terminals(h.id).await.expect("parked").iter().map(|t| t.id).collect();
    assert_eq!(parked, vec![a.id, b.id], "oldest first");
    store.claim_launch(h.id, a.id).await.expect("claim");
    assert!(store.fail_stuck_launches(Duration::from_secs(60)).await.expect("sweep").is_empty());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.fail_stuck_launches(Duration::from_millis(10)).await.expect("sweep"), vec![a.id]);
    assert_eq!(state_of(store, a.id).await, TerminalState::Error);
    assert_eq!(state_of(store, b.id).await, TerminalState::Pending);
}

async fn snapshots(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let h = host(store, &ann, "box").await;
    let t = terminal(store, &h).await;
    let snap = TerminalSnapshot { data: vec![0, 27, b'[', b'H', 255], cols: 100, rows: 30 };
    store.put_snapshot(h.id, t.id, &snap).await.expect("put");
    assert_eq!(store.get_snapshot(t.id).await.expect("get"), Some(snap.clone()));
    let newer = TerminalSnapshot { data: b"final".to_vec(), cols: 80, rows: 24 };
    store.put_snapshot(h.id, t.id, &newer).await.expect("replace");
    assert_eq!(store.get_snapshot(t.id).await.expect("get"), Some(newer));
}

/// The stamp is written at most once a minute whoever asks (injected
/// time): a stamp written 59.7 s ago by another instance is kept and
/// answered; 0.6 s later the write happens.
async fn interaction_stamp_once_a_minute(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let h = host(store, &ann, "box").await;
    let t = terminal(store, &h).await;
    assert_eq!(t.last_interacted_at, None);
    let base = chrono::DateTime::from_timestamp_millis(1_800_000_000_000).expect("time");
    let ms = |n: i64| base + chrono::Duration::milliseconds(n);
    assert_eq!(store.stamp_interaction(t.id, ms(0)).await.expect("stamp"), Some(ms(0)), "first write");
    assert_eq!(store.stamp_interaction(t.id, ms(59_700)).await.expect("stamp"), Some(ms(0)), "no write at 59.7 s");
    assert_eq!(
        store.stamp_interaction(t.id, ms(60_300)).await.expect("stamp"),
        Some(ms(60_300)),
        "written 0.6 s later"
    );
    let stored = store.terminal_by_id(t.id).await.expect("read").expect("terminal");
    assert_eq!(stored.last_interacted_at, Some(ms(60_300)));
    assert_eq!(store.stamp_interaction(Uuid::new_v4(), ms(0)).await.expect("stamp"), None, "no such terminal");
}

/// A daemon connection's lease holder.
fn h(instance: &str, connection: u64) -> LeaseHolder {
    LeaseHolder::connection(instance, connection)
}

async fn lease_claim_and_renew_check_the_holder(store: &Arc<dyn Store>) {
    assert!(store.claim_lease("host:1", &h("a", 1), TTL).await.expect("claim"));
    assert!(store.claim_lease("host:1", &h("a", 1), TTL).await.expect("reclaim by holder"));
    assert!(
        !store.claim_lease("host:1", &h("b", 1), TTL).await.expect("claim by other"),
        "a live lease is not claimable"
    );
    assert_eq!(store.lease_holder("host:1").await.expect("holder"), Some(h("a", 1)));
    let renewed = store.renew_leases(&[("host:1".into(), h("b", 1))], TTL).await.expect("renew by non-holder");
    assert!(renewed.is_empty(), "a renew by a non-holder fails");
    store.claim_lease("host:2", &h("a", 2), TTL).await.expect("claim");
    store.claim_lease("host:3", &h("c", 1), TTL).await.expect("claim");
    let mut renewed = store
        .renew_leases(&[("host:1".into(), h("a", 1)), ("host:2".into(), h("a", 2)), ("host:3".into(), h("a", 3))], TTL)
        .await
        .expect("renew");
    renewed.sort();
    assert_eq!(renewed, vec!["host:1", "host:2"], "only the leases this holder holds are renewed");
    let mut holders = store.lease_holders(&["host:1".into(), "host:3".into(), "host:9".into()]).await.expect("holders");
    holders.sort();
    assert_eq!(holders, vec![("host:1".to_string(), h("a", 1)), ("host:3".to_string(), h("c", 1))]);
}

/// A holder reads back exactly as it was written, for instance ids that
/// hold `#` and digits themselves (`<cell>#<6 hex>`, which may be all
/// digits), and for the instance itself as for one of its connections.
async fn lease_holders_read_back_typed(store: &Arc<dyn Store>) {
    let connection = LeaseHolder::connection("cell-1#123456", 42);
    let instance = LeaseHolder::instance("cell-1#123456");
    store.claim_lease("host:1", &connection, TTL).await.expect("claim");
    store.claim_lease("poller:sweep", &instance, TTL).await.expect("claim");
    assert_eq!(store.lease_holder("host:1").await.expect("holder"), Some(connection.clone()));
    let read = store.lease_holder("poller:sweep").await.expect("holder").expect("held");
    assert_eq!((read.instance.as_str(), read.connection), ("cell-1#123456", 0));
    assert!(!store.release_lease("poller:sweep", &connection).await.expect("release"), "another holder");
    assert!(store.release_lease("poller:sweep", &instance).await.expect("release"));
}

async fn lease_release_only_own(store: &Arc<dyn Store>) {
    store.claim_lease("host:1", &h("a", 1), TTL).await.expect("claim");
    assert!(!store.release_lease("host:1", &h("b", 1)).await.expect("release by other"));
    assert_eq!(store.lease_holder("host:1").await.expect("holder"), Some(h("a", 1)));
    assert!(store.release_lease("host:1", &h("a", 1)).await.expect("release"));
    assert_eq!(store.lease_holder("host:1").await.expect("holder"), None);
    assert!(!store.release_lease("host:1", &h("a", 1)).await.expect("release twice"));
}

async fn lease_seize_replaces_any_holder(store: &Arc<dyn Store>) {
    assert_eq!(store.seize_lease("host:1", &h("a", 1), TTL).await.expect("seize free"), None);
    assert_eq!(store.seize_lease("host:1", &h("b", 7), TTL).await.expect("seize"), Some(h("a", 1)));
    assert_eq!(store.lease_holder("host:1").await.expect("holder"), Some(h("b", 7)));
    assert!(
        !store.release_lease("host:1", &h("a", 1)).await.expect("old holder release"),
        "the old holder releases nothing"
    );
    assert!(store.renew_leases(&[("host:1".into(), h("a", 1))], TTL).await.expect("renew").is_empty());
    assert_eq!(store.lease_holder("host:1").await.expect("holder"), Some(h("b", 7)));
}

/// The renewal also records that the hosts of the renewed host leases were
/// seen (one statement per tick for both); hosts whose lease was not
/// renewed keep their last-seen.
async fn renewing_a_host_lease_marks_the_host_seen(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let mine = host(store, &ann, "mine").await;
    let theirs = host(store, &ann, "theirs").await;
    for one in [&mine, &theirs] {
        hello(store, one.id, &h("a", 1), &Capabilities::default(), &[], &[]).await;
    }
    let seen = |h: Host| h.last_seen_at.expect("seen");
    let read = |id: Uuid| async move { store.host_by_id(id).await.expect("read").expect("host") };
    let before = (seen(read(mine.id).await), seen(read(theirs.id).await));
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.seize_lease(&host_lease_key(theirs.id), &h("b", 1), TTL).await.expect("seize");
    let pairs = [(host_lease_key(mine.id), h("a", 1)), (host_lease_key(theirs.id), h("a", 1))];
    let renewed = store.renew_leases(&pairs, TTL).await.expect("renew");
    assert_eq!(renewed, vec![host_lease_key(mine.id)]);
    let (after_mine, after_theirs) = (seen(read(mine.id).await), seen(read(theirs.id).await));
    assert!(after_mine > before.0, "the renewed host was seen: {after_mine} vs {}", before.0);
    assert_eq!(after_theirs, before.1, "the host whose lease was not renewed keeps its last-seen");
}

/// A draining instance releases all its hosts' leases in one call: those
/// its connections still hold go, and their hosts read offline; a host
/// another instance seized meanwhile keeps its lease and stays online.
async fn a_drain_releases_its_host_leases_at_once(store: &Arc<dyn Store>) {
    let [one, two, seized] = connected_hosts(store, ["one", "two", "seized"]).await;
    hello(store, seized.id, &h("b", 1), &Capabilities::default(), &[], &[]).await;
    let held = [(one.id, h("a", 1)), (two.id, h("a", 2)), (seized.id, h("a", 3))];
    let mut released = store.release_host_leases(&held).await.expect("release");
    released.sort();
    let mut expected = vec![one.id, two.id];
    expected.sort();
    assert_eq!(released, expected);
    let state = |id: Uuid| async move { store.host_by_id(id).await.expect("read").expect("host").state };
    for host in [&one, &two] {
        assert_eq!(store.lease_holder(&host_lease_key(host.id)).await.expect("holder"), None);
        assert_eq!(state(host.id).await, HostState::Offline);
    }
    assert_eq!(store.lease_holder(&host_lease_key(seized.id)).await.expect("holder"), Some(h("b", 1)));
    assert_eq!(state(seized.id).await, HostState::Online);
    assert_eq!(store.release_host_leases(&[]).await.expect("nothing to release"), Vec::<Uuid>::new());
}

/// Hosts of user "ann" named `names`, each of whose daemons said hello on
/// its own connection of instance "a" (connections 1, 2, ... in order).
async fn connected_hosts<const N: usize>(store: &Arc<dyn Store>, names: [&str; N]) -> [Host; N] {
    let ann = user(store, "ann").await;
    let mut hosts = Vec::with_capacity(N);
    for (n, name) in names.into_iter().enumerate() {
        let host = host(store, &ann, name).await;
        hello(store, host.id, &h("a", n as u64 + 1), &Capabilities::default(), &[], &[]).await;
        hosts.push(host);
    }
    hosts.try_into().unwrap_or_else(|_| unreachable!("one host per name"))
}

/// The hosts of ended connections that held no lease are marked offline in
/// one call, each only if no connection holds a live lease on it then: a
/// host whose lease was released or lapsed goes offline, one that another
/// connection holds stays online.
async fn hosts_without_a_live_lease_are_marked_offline_at_once(store: &Arc<dyn Store>) {
    let [held, released, lapsed] = connected_hosts(store, ["held", "released", "lapsed"]).await;
    assert!(store.release_lease(&host_lease_key(released.id), &h("a", 2)).await.expect("release"));
    store.seize_lease(&host_lease_key(lapsed.id), &h("a", 3), Duration::from_millis(10)).await.expect("seize");
    tokio::time::sleep(Duration::from_millis(60)).await;
    let mut marked =
        store.mark_hosts_offline_unless_leased(&[held.id, released.id, lapsed.id]).await.expect("mark offline");
    marked.sort();
    let mut expected = vec![released.id, lapsed.id];
    expected.sort();
    assert_eq!(marked, expected);
    let state = |id: Uuid| async move { store.host_by_id(id).await.expect("read").expect("host").state };
    assert_eq!(state(held.id).await, HostState::Online);
    assert_eq!(state(released.id).await, HostState::Offline);
    assert_eq!(state(lapsed.id).await, HostState::Offline);
    assert_eq!(store.mark_hosts_offline_unless_leased(&[]).await.expect("nothing to mark"), Vec::<Uuid>::new());
}

async fn lease_expiry(store: &Arc<dyn Store>) {
    assert!(store.claim_lease("host:1", &h("a", 1), Duration::from_millis(50)).await.expect("claim"));
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(store.lease_holder("host:1").await.expect("holder"), None, "an expired lease has no holder");
    assert_eq!(store.seize_lease("host:1", &h("c", 1), TTL).await.expect("seize"), None);
    assert!(store.release_lease("host:1", &h("c", 1)).await.expect("release"));
    assert!(store.claim_lease("host:2", &h("a", 1), Duration::from_millis(10)).await.expect("claim"));
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(store.claim_lease("host:2", &h("b", 1), TTL).await.expect("claim after expiry"));
    assert!(store.claim_lease("host:3", &h("a", 1), Duration::from_millis(10)).await.expect("claim"));
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(store.delete_expired_leases(Duration::from_millis(20)).await.expect("delete"), 1);
    assert_eq!(store.lease_holder("host:2").await.expect("holder"), Some(h("b", 1)));
}

async fn runs_queue_and_finish(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bob = user(store, "bob").await;
    let h = host(store, &ann, "box").await;
    let run = store
        .insert_run(
            &NewRun {
                user_id: ann.id,
                host_id: h.id,
                argv: vec!["sh".into(), "-c".into(), "exit 7".into()],
                dir: None,
            },
            None,
        )
        .await
        .expect("run");
    assert_eq!(run.state, RunState::Queued);
    assert!(store.get_run(bob.id, run.id).await.expect("get").is_none());
    assert_eq!(store.queued_run_hosts().await.expect("queued"), vec![h.id], "the host with a queued run");
    assert!(store.claim_queued_runs(&[], 10).await.expect("claim").is_empty(), "no online host, nothing claimed");
    let claimed = store.claim_queued_runs(&[h.id], 10).await.expect("claim");
    assert_eq!(claimed.iter().map(|r| r.id).collect::<Vec<_>>(), vec![run.id]);
    assert_eq!(claimed[0].state, RunState::Dispatched);
    assert!(store.claim_queued_runs(&[h.id], 10).await.expect("claim").is_empty());
    assert!(store.queued_run_hosts().await.expect("queued").is_empty(), "a dispatched run is no longer queued");
    let t = terminal(store, &h).await;
    store.set_run_terminal(run.id, t.id).await.expect("link");
    assert!(store.mark_run_running(run.id).await.expect("running"));
    let usage = RunUsage { cpu_ms: 3, max_rss_kb: 1000, output_bytes: 12, wall_ms: 40 };
    store.set_run_usage(run.id, &usage).await.expect("usage");
    assert!(store.finish_run(run.id, RunState::Failed, Some(7)).await.expect("finish"));
    assert!(!store.finish_run(run.id, RunState::Succeeded, Some(0)).await.expect("finish twice"), "final is final");
    let run = store.get_run(ann.id, run.id).await.expect("get").expect("exists");
    assert_eq!(
        (run.state, run.exit_code, run.usage, run.terminal_id),
        (RunState::Failed, Some(7), Some(usage), Some(t.id))
    );
    assert!(run.finished_at.is_some());
    let of_h = RunFilter { host_id: Some(h.id), state: None };
    assert_eq!(store.list_runs(ann.id, &of_h, &PageAfter::first(100)).await.expect("list").len(), 1);
    assert!(store.list_runs(bob.id, &RunFilter::default(), &PageAfter::first(100)).await.expect("list").is_empty());
}

/// Runs page like terminals: in creation order after a cursor, filtered by
/// host, by state, or both.
async fn run_pages_filter_by_host_and_state(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let bob = user(store, "bob").await;
    let (h1, h2) = (host(store, &ann, "h1").await, host(store, &ann, "h2").await);
    let mut runs = Vec::new();
    for on in [&h1, &h2, &h1, &h1, &h2] {
        let new = NewRun { user_id: ann.id, host_id: on.id, argv: vec!["true".into()], dir: None };
        runs.push(store.insert_run(&new, None).await.expect("run"));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // runs[0] and runs[3] (h1) and runs[1] (h2) leave the queue; runs[3] ends.
    assert_eq!(store.claim_queued_runs(&[h1.id], 1).await.expect("claim")[0].id, runs[0].id);
    assert_eq!(store.claim_queued_runs(&[h2.id], 1).await.expect("claim")[0].id, runs[1].id);
    let claimed = store.claim_queued_runs(&[h1.id], 2).await.expect("claim");
    assert_eq!(claimed.iter().map(|r| r.id).collect::<Vec<_>>(), [runs[2].id, runs[3].id]);
    assert!(store.mark_run_running(runs[3].id).await.expect("running"));
    assert!(store.finish_run(runs[3].id, RunState::Succeeded, Some(0)).await.expect("finish"));
    let page = |host_id: Option<Uuid>, state: Option<RunState>, after: Option<&Run>, limit| {
        let page = PageAfter { after: after.map(|r| (r.created_at, r.id)), limit };
        async move {
            let rows = store.list_runs(ann.id, &RunFilter { host_id, state }, &page).await.expect("page");
            rows.into_iter().map(|r| r.id).collect::<Vec<_>>()
        }
    };
    let ids = |list: &[&Run]| list.iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(page(None, None, None, 10).await, ids(&runs.iter().collect::<Vec<_>>()));
    assert_eq!(page(None, Some(RunState::Queued), None, 10).await, ids(&[&runs[4]]));
    assert_eq!(page(None, Some(RunState::Dispatched), None, 10).await, ids(&[&runs[0], &runs[1], &runs[2]]));
    assert_eq!(page(None, Some(RunState::Succeeded), None, 10).await, ids(&[&runs[3]]));
    assert!(page(None, Some(RunState::Lost), None, 10).await.is_empty());
    assert_eq!(page(Some(h1.id), Some(RunState::Dispatched), None, 10).await, ids(&[&runs[0], &runs[2]]));
    assert!(page(Some(h2.id), Some(RunState::Succeeded), None, 10).await.is_empty());
    // The filter holds across pages: a page of one after each cursor.
    assert_eq!(page(None, Some(RunState::Dispatched), None, 1).await, ids(&[&runs[0]]));
    assert_eq!(page(None, Some(RunState::Dispatched), Some(&runs[0]), 1).await, ids(&[&runs[1]]));
    assert_eq!(page(None, Some(RunState::Dispatched), Some(&runs[1]), 1).await, ids(&[&runs[2]]));
    assert!(page(None, Some(RunState::Dispatched), Some(&runs[2]), 1).await.is_empty());
    assert_eq!(page(Some(h1.id), Some(RunState::Dispatched), Some(&runs[0]), 10).await, ids(&[&runs[2]]));
    let none = RunFilter { host_id: None, state: Some(RunState::Dispatched) };
    assert!(store.list_runs(bob.id, &none, &PageAfter::first(10)).await.expect("list").is_empty());
}

async fn run_claims_never_overlap(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let h = host(store, &ann, "box").await;
    for _ in 0..40 {
        store
            .insert_run(&NewRun { user_id: ann.id, host_id: h.id, argv: vec!["true".into()], dir: None }, None)
            .await
            .expect("run");
    }
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let store = store.clone();
        let host_id = h.id;
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let batch = store.claim_queued_runs(&[host_id], 3).await.expect("claim");
                if batch.is_empty() {
                    return mine;
                }
                mine.extend(batch.into_iter().map(|r| r.id));
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("task"));
    }
    let total = all.len();
    all.sort();
    all.dedup();
    assert_eq!(total, 40, "every run claimed");
    assert_eq!(all.len(), 40, "no run claimed twice");
}

async fn run_log_is_capped(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let h = host(store, &ann, "box").await;
    let run =
        store.insert_run(&NewRun { user_id: ann.id, host_id: h.id, argv: vec!["x".into()], dir: None }, None).await;
    let run = run.expect("run");
    store.append_run_log(run.id, 0, b"out\x00\xff\n", 10).await.expect("append");
    store.append_run_log(run.id, 6, b"more-bytes", 10).await.expect("append");
    store.append_run_log(run.id, 16, b"dropped", 10).await.expect("append");
    assert_eq!(store.run_log(ann.id, run.id).await.expect("log").as_deref(), Some(&b"out\x00\xff\nmore"[..]));
    let run = store.get_run(ann.id, run.id).await.expect("get").expect("run");
    assert_eq!((run.log_end, run.log_gap_bytes), (23, 0), "the stream position goes on past the cap");
    // Once the log is full, a chunk that starts past its end lacks bytes
    // the log could not have kept anyway: they are not a gap.
    store.append_run_log(run.id, 40, b"", 10).await.expect("append");
    let run = store.get_run(ann.id, run.id).await.expect("get").expect("run");
    assert_eq!((run.log_end, run.log_gap_bytes), (40, 0), "past the cap, not lost");
    let bob = user(store, "bob").await;
    assert_eq!(store.run_log(bob.id, run.id).await.expect("log"), None);
}

/// docs/CLUSTER.md, "Run logs across moves": a chunk is stored only past
/// the stored end, whoever sends it and however often; a chunk that starts
/// past the end counts the bytes between as lost.
async fn run_log_is_idempotent_by_offset_and_counts_gaps(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let h = host(store, &ann, "box").await;
    let run =
        store.insert_run(&NewRun { user_id: ann.id, host_id: h.id, argv: vec!["x".into()], dir: None }, None).await;
    let run = run.expect("run");
    let max = 1 << 20;
    store.append_run_log(run.id, 0, b"hello", max).await.expect("append");
    store.append_run_log(run.id, 0, b"hello", max).await.expect("the same chunk again");
    store.append_run_log(run.id, 3, b"lo world", max).await.expect("a partly-overlapping chunk");
    store.append_run_log(run.id, 2, b"ll", max).await.expect("a chunk inside the log");
    assert_eq!(store.run_log(ann.id, run.id).await.expect("log").as_deref(), Some(&b"hello world"[..]));
    let got = store.get_run(ann.id, run.id).await.expect("get").expect("run");
    assert_eq!((got.log_end, got.log_gap_bytes), (11, 0));
    store.append_run_log(run.id, 15, b"!", max).await.expect("a chunk past the end");
    store.append_run_log(run.id, 20, b"", max).await.expect("an empty chunk past the end");
    store.append_run_log(run.id, 20, b"?", max).await.expect("append");
    assert_eq!(store.run_log(ann.id, run.id).await.expect("log").as_deref(), Some(&b"hello world!?"[..]));
    let got = store.get_run(ann.id, run.id).await.expect("get").expect("run");
    assert_eq!((got.log_end, got.log_gap_bytes), (21, 8), "bytes 11..15 and 16..20 are lost");
    let listed = store.list_runs(ann.id, &RunFilter::default(), &PageAfter::first(100)).await.expect("list");
    assert_eq!(listed.iter().find(|r| r.id == run.id).map(|r| r.log_gap_bytes), Some(8));
}

async fn credentials_expiring_on_connected_hosts(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let (soon, later, unstated, offline) = (
        host(store, &ann, "soon").await,
        host(store, &ann, "later").await,
        host(store, &ann, "unstated").await,
        host(store, &ann, "offline").await,
    );
    let now = chrono::Utc::now();
    let sealed = SealedCredentials { nonce: vec![1; 12], ciphertext: vec![9] };
    let minutes = |m| Some(now + chrono::Duration::minutes(m));
    store.put_credentials(soon.id, &sealed, minutes(5)).await.expect("put");
    store.put_credentials(later.id, &sealed, minutes(60)).await.expect("put");
    store.put_credentials(unstated.id, &sealed, None).await.expect("put");
    store.put_credentials(offline.id, &sealed, minutes(1)).await.expect("put");
    let holder = LeaseHolder::connection("i", 1);
    for h in [&soon, &later, &unstated] {
        let key = tether::store::host_lease_key(h.id);
        assert!(store.claim_lease(&key, &holder, Duration::from_secs(30)).await.expect("lease"));
    }
    let due = store.credentials_expiring(now + chrono::Duration::minutes(10)).await.expect("expiring");
    assert_eq!(due, vec![soon.id], "only the connected host whose credentials expire within the window");
    store.put_credentials(soon.id, &sealed, minutes(30)).await.expect("refreshed");
    assert!(store.credentials_expiring(now + chrono::Duration::minutes(10)).await.expect("expiring").is_empty());
}

async fn credentials_round_trip(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let h = host(store, &ann, "box").await;
    assert_eq!(store.get_credentials(h.id).await.expect("get"), None);
    let sealed = SealedCredentials { nonce: vec![1; 12], ciphertext: vec![9, 8, 7] };
    store.put_credentials(h.id, &sealed, None).await.expect("put");
    let newer = SealedCredentials { nonce: vec![2; 12], ciphertext: vec![6] };
    store.put_credentials(h.id, &newer, None).await.expect("put");
    assert_eq!(store.get_credentials(h.id).await.expect("get"), Some(newer));
}

/// A database migrated by a newer binary is refused with a clear message.
#[actix_rt::test]
async fn newer_schema_is_refused_sqlite() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("t.db");
    SqliteStore::open(&path).expect("open").migrate().await.expect("migrate");
    let conn = rusqlite::Connection::open(&path).expect("raw open");
    conn.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'future', 0)", [])
        .expect("insert");
    let err = SqliteStore::open(&path).expect("open").migrate().await.expect_err("must refuse");
    assert!(err.to_string().contains("newer than this binary"), "{err}");
}

#[actix_rt::test]
async fn newer_schema_is_refused_postgres() {
    let url = support::pg_database().await;
    let store = PgStore::connect(&url, 2).await.expect("connect");
    store.migrate().await.expect("migrate");
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("raw connect");
    let driver = tokio::spawn(conn);
    client.execute("INSERT INTO schema_migrations (version, name) VALUES (999, 'future')", &[]).await.expect("insert");
    drop(client);
    let _ = driver.await;
    let err = store.migrate().await.expect_err("must refuse");
    assert!(err.to_string().contains("newer than this binary"), "{err}");
}

async fn stale_hosts_go_offline(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let leased = host(store, &ann, "leased").await;
    let lapsed = host(store, &ann, "lapsed").await;
    for one in [&leased, &lapsed] {
        hello(store, one.id, &h("a", 1), &Capabilities::default(), &[], &[]).await;
    }
    assert!(store.release_lease(&host_lease_key(lapsed.id), &h("a", 1)).await.expect("release"));
    let offline = store.mark_stale_hosts_offline(Duration::from_secs(90)).await.expect("sweep");
    assert_eq!(offline, vec![lapsed.id], "only the host without a live lease");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let offline = store.mark_stale_hosts_offline(Duration::from_millis(10)).await.expect("sweep");
    assert_eq!(offline, vec![leased.id], "a host not seen for longer than `stale` goes offline too");
    assert_eq!(store.host_by_id(leased.id).await.expect("read").expect("host").state, HostState::Offline);
}

async fn runs_of_long_gone_hosts_are_lost(store: &Arc<dyn Store>) {
    let ann = user(store, "ann").await;
    let gone = host(store, &ann, "gone").await;
    let here = host(store, &ann, "here").await;
    store.claim_lease(&host_lease_key(here.id), &h("a", 1), TTL).await.expect("lease");
    let new_run = |h: &Host| NewRun { user_id: ann.id, host_id: h.id, argv: vec!["true".into()], dir: None };
    let lost = store.insert_run(&new_run(&gone), None).await.expect("run");
    let kept = store.insert_run(&new_run(&here), None).await.expect("run");
    let done = store.insert_run(&new_run(&gone), None).await.expect("run");
    store.finish_run(done.id, RunState::Succeeded, Some(0)).await.expect("finish");
    assert!(store.mark_lost_runs(Duration::from_secs(60)).await.expect("sweep").is_empty(), "not gone long enough");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.mark_lost_runs(Duration::from_millis(10)).await.expect("sweep"), vec![lost.id]);
    assert_eq!(store.get_run(ann.id, lost.id).await.expect("get").expect("run").state, RunState::Lost);
    assert_eq!(store.get_run(ann.id, kept.id).await.expect("get").expect("run").state, RunState::Queued);
    assert_eq!(store.get_run(ann.id, done.id).await.expect("get").expect("run").state, RunState::Succeeded);

    // A run queued for a host gone long already waits `after` itself: it
    // is queued until the host returns, and lost only if it stays away.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = store.insert_run(&new_run(&gone), None).await.expect("run");
    let after = Duration::from_millis(200);
    assert!(store.mark_lost_runs(after).await.expect("sweep").is_empty(), "queued just now");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(store.mark_lost_runs(after).await.expect("sweep"), vec![late.id]);
}

fn audit_event(user: Uuid, action: AuditAction, at: chrono::DateTime<chrono::Utc>) -> NewAuditEvent {
    NewAuditEvent {
        at,
        user_id: user,
        token_id: None,
        action,
        host_id: Some(Uuid::new_v4()),
        terminal_id: None,
        instance_id: "cell-a#000001".into(),
        detail: Some("signal 9".into()),
    }
}

async fn audit_events_append_list_and_age_out(store: &Arc<dyn Store>) {
    let (ann, bob) = (user(store, "ann").await, user(store, "bob").await);
    let now = chrono::Utc::now();
    let old = now - chrono::Duration::days(100);
    let mut kill = audit_event(ann.id, AuditAction::Kill, now);
    kill.token_id = Some(Uuid::new_v4());
    kill.terminal_id = Some(Uuid::new_v4());
    let batch = vec![
        audit_event(ann.id, AuditAction::Attach, old),
        audit_event(ann.id, AuditAction::HostRegistered, now - chrono::Duration::seconds(5)),
        kill.clone(),
        audit_event(bob.id, AuditAction::TokenCreated, now),
    ];
    store.insert_audit_events(&batch).await.expect("insert");
    store.insert_audit_events(&[]).await.expect("an empty batch is fine");
    let listed = store.list_audit_events(ann.id, None, 100).await.expect("list");
    let actions: Vec<AuditAction> = listed.iter().map(|e| e.action).collect();
    assert_eq!(actions, vec![AuditAction::Kill, AuditAction::HostRegistered, AuditAction::Attach], "newest first");
    let newest = &listed[0];
    assert_eq!(
        (newest.user_id, newest.token_id, newest.host_id, newest.terminal_id),
        (ann.id, kill.token_id, kill.host_id, kill.terminal_id)
    );
    assert_eq!((newest.instance_id.as_str(), newest.detail.as_deref()), ("cell-a#000001", Some("signal 9")));
    assert!((newest.at - now).num_milliseconds().abs() <= 1, "time kept to the millisecond");
    let since = store.list_audit_events(ann.id, Some(now - chrono::Duration::seconds(10)), 100).await.expect("since");
    assert_eq!(since.len(), 2);
    assert_eq!(store.list_audit_events(ann.id, None, 1).await.expect("limit").len(), 1);
    // Retention: only events before the cutoff go, everyone's.
    let cutoff = now - chrono::Duration::days(90);
    assert_eq!(store.delete_audit_events_before(cutoff).await.expect("age out"), 1);
    assert_eq!(store.list_audit_events(ann.id, None, 100).await.expect("list").len(), 2);
    assert_eq!(store.list_audit_events(bob.id, None, 100).await.expect("list").len(), 1);
}

/// Audit rows cannot be rewritten, even with SQL.
#[actix_rt::test]
async fn audit_events_are_append_only_sqlite() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("t.db");
    let store = SqliteStore::open(&path).expect("open");
    store.migrate().await.expect("migrate");
    let ann = store.ensure_user("ann").await.expect("user");
    store.insert_audit_events(&[audit_event(ann.id, AuditAction::Spawn, chrono::Utc::now())]).await.expect("insert");
    let conn = rusqlite::Connection::open(&path).expect("raw open");
    let err = conn.execute("UPDATE audit_events SET action = 'attach'", []).expect_err("update refused");
    assert!(err.to_string().contains("append-only"), "{err}");
    let listed = store.list_audit_events(ann.id, None, 10).await.expect("list");
    assert_eq!(listed[0].action, AuditAction::Spawn);
}

/// A fresh migrated PostgreSQL database (its URL), a store on it and a
/// user "ann" in it.
async fn pg_store_with_ann() -> (String, PgStore, User) {
    let url = support::pg_database().await;
    let store = PgStore::connect(&url, 2).await.expect("connect");
    store.migrate().await.expect("migrate");
    let ann = store.ensure_user("ann").await.expect("user");
    (url, store, ann)
}

#[actix_rt::test]
async fn audit_events_are_append_only_postgres() {
    let (url, store, ann) = pg_store_with_ann().await;
    store.insert_audit_events(&[audit_event(ann.id, AuditAction::Spawn, chrono::Utc::now())]).await.expect("insert");
    let client = support::pg_connect(&url).await;
    let err = client.execute("UPDATE audit_events SET action = 'attach'", &[]).await.expect_err("update refused");
    assert!(format!("{err:?}").contains("append-only"), "{err:?}");
    let listed = store.list_audit_events(ann.id, None, 10).await.expect("list");
    assert_eq!(listed[0].action, AuditAction::Spawn);
}

/// A batch of audit events (the audit writer's, up to 256) is one INSERT
/// on PostgreSQL, not a round trip per event: a statement-level trigger
/// in the test's own database counts the INSERT statements.
#[actix_rt::test]
async fn an_audit_batch_is_one_statement_postgres() {
    let (url, store, ann) = pg_store_with_ann().await;
    let client = support::pg_connect(&url).await;
    client
        .batch_execute(
            "CREATE TABLE audit_inserts (n integer NOT NULL); INSERT INTO audit_inserts VALUES (0); \
             CREATE FUNCTION count_audit_insert() RETURNS trigger LANGUAGE plpgsql AS \
               $$ BEGIN UPDATE audit_inserts SET n = n + 1; RETURN NULL; END $$; \
             CREATE TRIGGER count_audit_insert AFTER INSERT ON audit_events \
               FOR EACH STATEMENT EXECUTE FUNCTION count_audit_insert();",
        )
        .await
        .expect("statement counter");
    let now = chrono::Utc::now();
    let batch: Vec<NewAuditEvent> = (0..256).map(|_| audit_event(ann.id, AuditAction::Input, now)).collect();
    store.insert_audit_events(&batch).await.expect("insert");
    let inserts: i32 = client.query_one("SELECT n FROM audit_inserts", &[]).await.expect("count").get(0);
    assert_eq!(inserts, 1, "INSERT statements for a batch of 256 events");
    assert_eq!(store.list_audit_events(ann.id, None, 1000).await.expect("list").len(), 256);
}

/// Processes that open a new embedded database at the same moment (say
/// `tether serve` and `tether token create` on a fresh machine) all get
/// it: switching the file to WAL waits for the other opener instead of
/// failing "database is locked" (it used to kill `serve` at start).
#[test]
fn openers_of_a_new_sqlite_file_at_the_same_moment_all_succeed() {
    for round in 0..20 {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tether.db");
        let barrier = Arc::new(std::sync::Barrier::new(6));
        let openers: Vec<_> = (0..6)
            .map(|_| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    SqliteStore::open(&path).map(|_| ())
                })
            })
            .collect();
        for opener in openers {
            let opened = opener.join().expect("opener thread");
            assert!(opened.is_ok(), "round {round}: {opened:?}");
        }
    }
}

/// Tokens made before migration 0002 keep working: scope `full`, no expiry,
/// each with an id of its own.
mod token_migration {
    use super::*;

    async fn check_upgraded(store: &dyn Store) {
        let FoundToken { user, token, .. } =
            store.token_by_hash("old-hash", chrono::Utc::now()).await.expect("lookup").expect("old token works");
        assert_eq!(user.name, "old");
        assert_eq!((token.scope, token.expires_at, token.revoked_at, token.name), (TokenScope::Full, None, None, None));
        let other =
            store.token_by_hash("old-hash-2", chrono::Utc::now()).await.expect("lookup").expect("second old token");
        assert_ne!(token.id, other.token.id, "each token gets its own id");
    }

    #[actix_rt::test]
    async fn sqlite_tokens_become_full() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("t.db");
        {
            let conn = rusqlite::Connection::open(&path).expect("open");
            conn.execute_batch(
                "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at integer NOT NULL);",
            )
            .expect("schema_migrations");
            conn.execute_batch(MIGRATIONS_SQLITE[0].sql).expect("0001");
            conn.execute_batch(
                "INSERT INTO schema_migrations VALUES (1, 'foundation', 0);
                 INSERT INTO users VALUES ('6f1c5a52-51a6-4bb4-9d43-4a1a4c4f1e01', 'old', 0);
                 INSERT INTO api_tokens VALUES ('old-hash', '6f1c5a52-51a6-4bb4-9d43-4a1a4c4f1e01', 0);
                 INSERT INTO api_tokens VALUES ('old-hash-2', '6f1c5a52-51a6-4bb4-9d43-4a1a4c4f1e01', 0);",
            )
            .expect("old rows");
        }
        let store = SqliteStore::open(&path).expect("open store");
        assert!(store.migrate().await.expect("migrate") >= 1);
        check_upgraded(&store).await;
    }

    #[actix_rt::test]
    async fn postgres_tokens_become_full() {
        let url = support::pg_database().await;
        let client = support::pg_connect(&url).await;
        client
            .batch_execute(
                "CREATE TABLE schema_migrations (version bigint PRIMARY KEY, name text NOT NULL, \
                 applied_at timestamptz NOT NULL DEFAULT now());",
            )
            .await
            .expect("schema_migrations");
        client.batch_execute(MIGRATIONS_POSTGRES[0].sql).await.expect("0001");
        client
            .batch_execute(
                "INSERT INTO schema_migrations (version, name) VALUES (1, 'foundation');
                 INSERT INTO users (id, name) VALUES ('6f1c5a52-51a6-4bb4-9d43-4a1a4c4f1e01', 'old');
                 INSERT INTO api_tokens (token_hash, user_id) VALUES ('old-hash', '6f1c5a52-51a6-4bb4-9d43-4a1a4c4f1e01');
                 INSERT INTO api_tokens (token_hash, user_id) VALUES ('old-hash-2', '6f1c5a52-51a6-4bb4-9d43-4a1a4c4f1e01');",
            )
            .await
            .expect("old rows");
        let store = PgStore::connect(&url, 4).await.expect("connect");
        assert!(store.migrate().await.expect("migrate") >= 1);
        check_upgraded(&store).await;
    }
}

/// A client of the test's PostgreSQL database, its connection running.
async fn pg_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
    actix_rt::spawn(connection);
    client
}

/// A PostgreSQL store with two hosts whose daemons said hello, on
/// connections 1 and 2 of instance "a": (store, one, two).
async fn two_connected_hosts(url: &str) -> (Arc<dyn Store>, Host, Host) {
    let store: Arc<dyn Store> = Arc::new(PgStore::connect(url, 8).await.expect("connect postgres"));
    store.migrate().await.expect("migrate");
    let [one, two] = connected_hosts(&store, ["one", "two"]).await;
    (store, one, two)
}

/// Waits until a statement of the client's database whose text is `LIKE`
/// `pattern` waits for a lock; panics with `never` if none does.
async fn until_waiting_for_a_lock(admin: &tokio_postgres::Client, pattern: &str, never: &str) {
    for _ in 0..500 {
        let row = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1",
                &[&pattern],
            )
            .await
            .expect("activity");
        if row.get::<_, i64>(0) == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{never}");
}

/// An instance's lease renewal and its release batches take turns: both
/// write the lease and host rows of many hosts in orders the planner
/// picks, and a renewal still naming a connection that just ended shares
/// rows with that connection's release, so the two at once can deadlock
/// (it happened in a mass disconnect of 19,000 daemons). While the renewal
/// waits for a lease row another session holds, the release of another
/// host waits for the renewal, then goes through.
#[actix_rt::test]
async fn postgres_an_instance_renews_and_releases_its_leases_in_turn() {
    let url = support::pg_database().await;
    let admin = pg_client(&url).await;
    let (store, one, two) = two_connected_hosts(&url).await;
    let other = pg_client(&url).await;
    other
        .batch_execute(&format!(
            "BEGIN; UPDATE leases SET expires_at = expires_at WHERE key = '{}'",
            host_lease_key(one.id)
        ))
        .await
        .expect("lock one");
    let renewing = store.clone();
    let renew =
        actix_rt::spawn(async move { renewing.renew_leases(&[(host_lease_key(one.id), h("a", 1))], TTL).await });
    until_waiting_for_a_lock(&admin, "WITH renewed%", "the renewal never waited for the lease row").await;
    let releasing = store.clone();
    let mut release = actix_rt::spawn(async move { releasing.release_host_leases(&[(two.id, h("a", 2))]).await });
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut release).await.is_err(),
        "the release ran while the renewal was writing"
    );
    other.batch_execute("COMMIT").await.expect("commit");
    assert_eq!(renew.await.expect("join").expect("renew"), vec![host_lease_key(one.id)]);
    assert_eq!(release.await.expect("join").expect("release"), vec![two.id]);
    assert_eq!(store.host_by_id(one.id).await.expect("read").expect("host").state, HostState::Online);
    assert_eq!(store.host_by_id(two.id).await.expect("read").expect("host").state, HostState::Offline);
}

/// The deadlocks PostgreSQL has counted in the client's database.
async fn deadlocks(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()", &[])
        .await
        .expect("deadlocks")
        .get(0)
}

/// A batch of lease releases that meets another writer of the same lease
/// rows in the opposite order (as the lease renewal can) is ended by
/// PostgreSQL as a deadlock; the release runs again, and its hosts go
/// offline rather than stay online until their leases lapse.
#[actix_rt::test]
async fn postgres_a_lease_release_ended_by_a_deadlock_runs_again() {
    let url = support::pg_database().await;
    let admin = pg_client(&url).await;
    let db: String = admin.query_one("SELECT current_database()", &[]).await.expect("name").get(0);
    // The store's sessions look for a deadlock 3 s after they start to
    // wait, the other writer's only after 60 s: the release is the one
    // PostgreSQL ends, and the test has 3 s to close the cycle.
    admin.batch_execute(&format!("ALTER DATABASE {db} SET deadlock_timeout = '3s'")).await.expect("alter");
    let (store, one, two) = two_connected_hosts(&url).await;
    let other = pg_client(&url).await;
    let touch =
        |host_id: Uuid| format!("UPDATE leases SET expires_at = expires_at WHERE key = '{}'", host_lease_key(host_id));
    other.batch_execute(&format!("SET deadlock_timeout = '60s'; BEGIN; {}", touch(two.id))).await.expect("lock two");
    let releasing = store.clone();
    let release =
        actix_rt::spawn(
            async move { releasing.release_host_leases(&[(one.id, h("a", 1)), (two.id, h("a", 2))]).await },
        );
    // The release has taken the first lease row and waits for the second.
    until_waiting_for_a_lock(&admin, "WITH released%", "the release never waited for the second lease row").await;
    let before = deadlocks(&admin).await;
    // The other writer now waits for the first: a cycle, which PostgreSQL
    // breaks by ending the release's statement.
    other.batch_execute(&touch(one.id)).await.expect("lock one once the release let go");
    other.batch_execute("COMMIT").await.expect("commit");
    let mut released = release.await.expect("join").expect("the release runs again after the deadlock");
    released.sort();
    let mut expected = vec![one.id, two.id];
    expected.sort();
    assert_eq!(released, expected);
    for id in [one.id, two.id] {
        assert_eq!(store.host_by_id(id).await.expect("read").expect("host").state, HostState::Offline);
    }
    // PostgreSQL counted the deadlock (its statistics reach the view within a second or so).
    for _ in 0..100 {
        if deadlocks(&admin).await > before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no deadlock was counted: the test did not make the conflict it is about");
}
