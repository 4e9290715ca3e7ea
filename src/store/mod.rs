//! Durable state behind one trait, with two real backends: embedded SQLite
//! (the default: no service needed) and PostgreSQL (the cluster).
//!
//! SQL lives next to its backend (`sqlite.rs`, `postgres.rs`); this module
//! holds the shared row types and the [`Store`] trait. Every write that a
//! daemon drives is scoped by host id and compares the current state, so a
//! late or duplicated frame can never overwrite a newer fact.

mod caps;
mod cells;
mod migrate;
pub mod postgres;
pub mod sqlite;
mod tokens;
mod types;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::cell::AdmitMode;
use crate::config::Settings;
pub use caps::{CapReached, TerminalCaps};
pub use cells::*;
pub use migrate::{Migration, MIGRATIONS_POSTGRES, MIGRATIONS_SQLITE};
pub use tokens::*;
pub use types::*;

/// A failure of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("postgres: {}", with_causes(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("postgres pool: {0}")]
    Pool(String),
    /// The database did not answer a call within `database.call_timeout_ms`.
    #[error("the database did not answer within {} ms", .0.as_millis())]
    Unanswered(Duration),
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("migrations: {0}")]
    Migration(String),
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    /// A caller's value the store refuses before writing anything.
    #[error("{0}")]
    Invalid(String),
    /// A new terminal or run over a cap on live terminals.
    #[error(transparent)]
    CapReached(#[from] CapReached),
    /// The one error of a call made for many callers at once (folded token
    /// lookups), answered to each of them.
    #[error(transparent)]
    Shared(Arc<StoreError>),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// An error with the errors that caused it: tokio-postgres says only "db
/// error" of an error the server reported, and keeps what it was (the
/// deadlock, the constraint) in its source.
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

impl StoreError {
    /// The database could not take the call now and may later: it is
    /// unreachable, shutting down or starting up, busy, or out of disk.
    /// The same call may be made again as it is (docs/OPERATIONS.md,
    /// "Faults"); any other error would fail again.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Pool(_) | StoreError::Unanswered(_) => true,
            StoreError::Shared(e) => e.is_transient(),
            StoreError::Postgres(e) => postgres_transient(e),
            StoreError::Sqlite(e) => {
                use rusqlite::ErrorCode::*;
                matches!(
                    e.sqlite_error_code(),
                    Some(DiskFull | SystemIoFailure | DatabaseBusy | DatabaseLocked | CannotOpen)
                )
            }
            StoreError::Migration(_) | StoreError::Corrupt(_) | StoreError::Invalid(_) | StoreError::CapReached(_) => {
                false
            }
        }
    }

    /// How long the call waited when the database did not answer it
    /// within `database.call_timeout_ms`.
    pub fn unanswered(&self) -> Option<Duration> {
        match self {
            StoreError::Unanswered(waited) => Some(*waited),
            StoreError::Shared(e) => e.unanswered(),
            _ => None,
        }
    }

    /// The database's disk is full: nothing was written. SQLite says
    /// `SQLITE_FULL` for ENOSPC and `SQLITE_IOERR_WRITE` when a write fails
    /// otherwise, as past a file-size limit (EFBIG) or a quota (EDQUOT);
    /// PostgreSQL says `53100 disk_full`.
    pub fn is_storage_full(&self) -> bool {
        match self {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(failure, _)) => {
                failure.code == rusqlite::ErrorCode::DiskFull
                    || failure.extended_code == rusqlite::ffi::SQLITE_IOERR_WRITE
            }
            StoreError::Postgres(e) => e.code() == Some(&tokio_postgres::error::SqlState::DISK_FULL),
            StoreError::Shared(e) => e.is_storage_full(),
            _ => false,
        }
    }
}

/// A PostgreSQL error that says nothing about the statement: the connection
/// broke (I/O error, closed), or the server refused it for now (class 08
/// connection exception, class 53 insufficient resources, 57P01..57P03
/// shutting down or starting up).
fn postgres_transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            let code = code.code();
            code.starts_with("08") || code.starts_with("53") || matches!(code, "57P01" | "57P02" | "57P03")
        }
        None => std::error::Error::source(e).is_some_and(|source| source.is::<std::io::Error>()),
    }
}

/// Pool figures for `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolStatus {
    pub size: usize,
    pub available: usize,
    pub waiting: usize,
    pub max_size: usize,
}

/// Durable state shared by every instance of a cluster.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `"sqlite"` or `"postgres"`.
    fn backend(&self) -> &'static str;
    /// A cheap round trip, for `/readyz`.
    async fn ping(&self) -> StoreResult<()>;
    /// Applies pending migrations; returns how many ran. Refuses a database
    /// that is newer than this binary.
    async fn migrate(&self) -> StoreResult<usize>;
    /// Highest applied migration version (0 when none).
    async fn schema_version(&self) -> StoreResult<i64>;
    fn pool_status(&self) -> PoolStatus;
    /// Sets the pool's most connections (a cell's reserve pool and full
    /// pool, docs/CELLS.md, "The connection budget"); idle connections over
    /// it are closed. SQLite has one connection and nothing to resize.
    fn resize_pool(&self, max_size: usize);
    /// How many calls this store has made to its database since it was
    /// opened (`tether_store_queries_total`): a test reads it to show that
    /// a path made no query at all.
    fn queries_total(&self) -> u64;

    // ---- users and tokens
    /// Returns the user with this name, creating it if needed.
    async fn ensure_user(&self, name: &str) -> StoreResult<User>;
    /// The user with this name, if there is one (creating nothing).
    async fn user_by_name(&self, name: &str) -> StoreResult<Option<User>>;
    async fn insert_token(&self, new: &NewToken) -> StoreResult<ApiToken>;
    /// The user and row of a token hash, only while the token is neither
    /// revoked nor expired (expiry judged by the database's clock); the row
    /// as it was read. In the same round trip, writes `last_used_at = now`
    /// unless the stored stamp is younger than [`LAST_USED_EVERY`] (so at
    /// most once a minute across instances). A token bound to a host also
    /// brings that host as a hello's admission check reads it
    /// ([`Self::host_admission`]), so a daemon's hello need not read it again.
    async fn token_by_hash(&self, token_hash: &str, now: DateTime<Utc>) -> StoreResult<Option<FoundToken>> {
        Ok(self.tokens_by_hash(&[token_hash.to_string()], now).await?.remove(token_hash))
    }
    /// [`Self::token_by_hash`] of many hashes in one round trip (the
    /// token lookups of concurrent requests, folded by
    /// `crate::http::token_lookups`): the usable ones, by hash. A stamp
    /// another transaction is writing is left to it rather than waited for.
    async fn tokens_by_hash(
        &self,
        token_hashes: &[String],
        now: DateTime<Utc>,
    ) -> StoreResult<HashMap<String, FoundToken>>;
    /// A token by id, whoever owns it, revoked or not.
    async fn token_by_id(&self, id: Uuid) -> StoreResult<Option<ApiToken>>;
    /// A user's tokens, oldest first, revoked ones included.
    async fn list_tokens(&self, user_id: Uuid) -> StoreResult<Vec<ApiToken>>;
    /// Revokes a token (of `user_id` when given); None when there is no
    /// such token. Revoking twice keeps the first revocation time and says
    /// so, so the revocation is recorded once.
    async fn revoke_token(&self, user_id: Option<Uuid>, id: Uuid) -> StoreResult<Option<Revocation>>;
    /// Binds a token to `host_id` if it is bound to none yet and no other
    /// usable token (not revoked, not expired) is bound to that host;
    /// returns the host the token is bound to afterwards (None: no such
    /// token, or still unbound because the host is another token's).
    async fn bind_token_host(&self, id: Uuid, host_id: Uuid) -> StoreResult<Option<Uuid>>;
    /// For the revocation watch: the tokens that are unusable now (revoked,
    /// expired or deleted) among those that ended or had their revocation
    /// or expiry changed after `since` (none when `since` is None) and
    /// those in `fresh`; with the database's clock at the read, which the
    /// next call's `since` is taken from. One statement whose cost follows
    /// the tokens that changed and `fresh`, not the tokens in use.
    async fn ended_tokens(&self, since: Option<DateTime<Utc>>, fresh: &[Uuid]) -> StoreResult<EndedTokens>;
    /// Deletes the log of ended tokens older than `before`.
    async fn delete_token_ends_before(&self, before: DateTime<Utc>) -> StoreResult<u64>;

    // ---- hosts
    /// Registers a host; an existing host of the same user and hostname is
    /// updated and keeps its id. With `daemon_token` (the id of the daemon
    /// token that asks, docs/REST.md "Scopes"), only the host that token is
    /// bound to may be registered, or, for an unbound token, a host no other
    /// usable daemon token is bound to, which the token is then bound to.
    /// One transaction: a refusal changes nothing, and one token
    /// registering several hostnames at once gets one host.
    async fn register_host(&self, new: &NewHost, daemon_token: Option<Uuid>) -> StoreResult<Registered>;
    async fn list_hosts(&self, user_id: Uuid) -> StoreResult<Vec<Host>>;
    /// A page of a user's hosts, each with whether its lease is live now
    /// (by the database's clock), only those whose liveness is `online`
    /// when given. One query however many hosts the user has.
    async fn page_hosts(&self, user_id: Uuid, online: Option<bool>, page: &PageAfter)
        -> StoreResult<Vec<(Host, bool)>>;
    /// A host of this user (None for another user's host).
    async fn get_host(&self, user_id: Uuid, host_id: Uuid) -> StoreResult<Option<Host>>;
    /// A host whoever owns it (daemon hello, internal paths).
    async fn host_by_id(&self, host_id: Uuid) -> StoreResult<Option<Host>>;
    /// Deletes a host of this user with its terminals and runs; false when
    /// there was no such host.
    async fn delete_host(&self, user_id: Uuid, host_id: Uuid) -> StoreResult<bool>;
    /// Records a daemon's hello in one database round trip (docs/CLUSTER.md,
    /// "Ownership: the host lease"): seizes the host lease for the
    /// connection; marks the host online with its capabilities and dirs;
    /// reconciles its terminals with those the daemon still runs (live rows
    /// it does not report become `exited` and their unfinished runs
    /// `failed`; reported `launching` rows, and reported `exited` ones that
    /// only a reconciliation ended ([`REVIVABLE`]), become `running`); and returns
    /// the host's live and pending terminals as they are then.
    async fn host_hello(&self, hello: &HostHello<'_>) -> StoreResult<Vec<HelloTerminal>>;
    /// Updates the allowed dirs the daemon reported.
    async fn set_host_dirs(&self, host_id: Uuid, dirs: &[String]) -> StoreResult<()>;
    /// Records `offline` as the last-known state (for alerts; liveness
    /// comes from the lease) of each of `host_ids` whose lease no connection
    /// holds now, in one statement; returns the hosts it marked.
    async fn mark_hosts_offline_unless_leased(&self, host_ids: &[Uuid]) -> StoreResult<Vec<Uuid>>;

    // ---- terminals
    /// Inserts a `pending` terminal. With `caps`, only when its host and its
    /// user are below them ([`StoreError::CapReached`] otherwise, nothing
    /// written), counted and inserted in one transaction (`caps` module).
    async fn insert_terminal(&self, new: &NewTerminal, caps: Option<TerminalCaps>) -> StoreResult<Terminal>;
    async fn get_terminal(&self, user_id: Uuid, id: Uuid) -> StoreResult<Option<Terminal>>;
    async fn terminal_by_id(&self, id: Uuid) -> StoreResult<Option<Terminal>>;
    /// A page of a user's terminals that match `filter`.
    async fn page_terminals(
        &self,
        user_id: Uuid,
        filter: &TerminalFilter,
        page: &PageAfter,
    ) -> StoreResult<Vec<Terminal>>;
    /// Deletes a terminal of this user that is not live.
    async fn delete_terminal(&self, user_id: Uuid, id: Uuid) -> StoreResult<DeleteOutcome>;
    /// Compare-and-set `pending -> launching`; false when the row was not pending.
    async fn claim_launch(&self, host_id: Uuid, id: Uuid) -> StoreResult<bool>;
    /// `launching -> pending` with a reason (the host went away before Spawn left).
    async fn park_terminal(&self, host_id: Uuid, id: Uuid, reason: &str) -> StoreResult<bool>;
    /// `launching|pending -> running` on the daemon's Started.
    async fn mark_started(&self, host_id: Uuid, id: Uuid) -> StoreResult<bool>;
    /// `pending|launching -> error` on the daemon's SpawnError or a stuck launch.
    async fn mark_spawn_failed(&self, host_id: Uuid, id: Uuid, message: &str) -> StoreResult<bool>;
    /// Any live state -> `exited` with the real exit status.
    async fn mark_exited(&self, host_id: Uuid, id: Uuid, exit: ExitStatus) -> StoreResult<bool>;
    /// Pending terminals of a host, oldest first.
    async fn parked_terminals(&self, host_id: Uuid) -> StoreResult<Vec<Terminal>>;
    /// Pending terminals of hosts recorded online (connected to any
    /// instance), oldest first, at most `limit`: the sweep's work.
    async fn parked_on_online_hosts(&self, limit: usize) -> StoreResult<Vec<Terminal>>;
    /// Hosts recorded online whose lease lapsed or that were not seen for
    /// `stale` become offline; returns their ids.
    async fn mark_stale_hosts_offline(&self, stale: Duration) -> StoreResult<Vec<Uuid>>;
    /// Unfinished runs whose host has no live lease and was last seen more
    /// than `after` ago become `lost`, if they were made more than `after`
    /// ago too (a run queued for a host gone long waits `after` for it);
    /// returns their ids.
    async fn mark_lost_runs(&self, after: Duration) -> StoreResult<Vec<Uuid>>;
    /// Launches left unacknowledged since before `older_than` become `error`.
    async fn fail_stuck_launches(&self, older_than: Duration) -> StoreResult<Vec<Uuid>>;
    async fn put_snapshot(&self, host_id: Uuid, terminal_id: Uuid, snapshot: &TerminalSnapshot) -> StoreResult<()>;
    async fn get_snapshot(&self, terminal_id: Uuid) -> StoreResult<Option<TerminalSnapshot>>;
    /// Sets the terminal's PTY grid as last reported by the daemon.
    async fn set_terminal_size(&self, host_id: Uuid, id: Uuid, cols: u16, rows: u16) -> StoreResult<()>;

    // ---- runs
    /// Writes `now` as the terminal's interaction stamp if the stored one
    /// is at least a minute older (or missing); answers the stored stamp
    /// after the call, written or not (None: no such terminal or never).
    async fn stamp_interaction(&self, id: Uuid, now: DateTime<Utc>) -> StoreResult<Option<DateTime<Utc>>>;
    /// Queues a run; with `caps`, as [`Store::insert_terminal`] (a queued
    /// run counts as the terminal it becomes).
    async fn insert_run(&self, new: &NewRun, caps: Option<TerminalCaps>) -> StoreResult<Run>;
    async fn get_run(&self, user_id: Uuid, id: Uuid) -> StoreResult<Option<Run>>;
    /// A page of a user's runs that match `filter`.
    async fn list_runs(&self, user_id: Uuid, filter: &RunFilter, page: &PageAfter) -> StoreResult<Vec<Run>>;
    /// The distinct hosts that have queued runs: what the dispatcher asks
    /// each tick, so an idle tick reads the (empty) queue and never ships
    /// the list of connected hosts.
    async fn queued_run_hosts(&self) -> StoreResult<Vec<Uuid>>;
    /// Claims up to `limit` queued runs whose host is in `online_hosts`
    /// (`FOR UPDATE SKIP LOCKED` on PostgreSQL), marking them `dispatched`.
    async fn claim_queued_runs(&self, online_hosts: &[Uuid], limit: usize) -> StoreResult<Vec<Run>>;
    /// Links a dispatched run to its terminal.
    async fn set_run_terminal(&self, run_id: Uuid, terminal_id: Uuid) -> StoreResult<()>;
    /// `dispatched -> running`.
    async fn mark_run_running(&self, run_id: Uuid) -> StoreResult<bool>;
    /// Final state with exit code (and usage when known).
    async fn finish_run(&self, run_id: Uuid, state: RunState, exit_code: Option<i32>) -> StoreResult<bool>;
    async fn set_run_usage(&self, run_id: Uuid, usage: &RunUsage) -> StoreResult<()>;
    /// Stores the run's stream bytes `offset..offset + data.len()`
    /// (docs/CLUSTER.md, "Run logs across moves"), idempotent by offset:
    /// bytes below the stored end (`log_end`) are skipped; a chunk starting
    /// past it adds the bytes in between to `log_gap_bytes` (an empty chunk
    /// records just that). At most `max_bytes` are kept in all.
    async fn append_run_log(&self, run_id: Uuid, offset: u64, data: &[u8], max_bytes: usize) -> StoreResult<()>;
    async fn run_log(&self, user_id: Uuid, run_id: Uuid) -> StoreResult<Option<Vec<u8>>>;

    // ---- leases (docs/ARCHITECTURE.md, "Where state lives"; docs/CLUSTER.md)
    /// Takes `key` when it is free, expired or already ours.
    async fn claim_lease(&self, key: &str, holder: &LeaseHolder, ttl: Duration) -> StoreResult<bool>;
    /// Takes `key` whoever holds it; returns the previous live holder.
    async fn seize_lease(&self, key: &str, holder: &LeaseHolder, ttl: Duration) -> StoreResult<Option<LeaseHolder>>;
    /// Extends every (key, holder) lease still held by that holder and
    /// marks the hosts of the renewed `host:` leases seen now and online, in one
    /// statement on PostgreSQL; returns the keys renewed.
    async fn renew_leases(&self, leases: &[(String, LeaseHolder)], ttl: Duration) -> StoreResult<Vec<String>>;
    /// Releases `key` only if `holder` holds it.
    async fn release_lease(&self, key: &str, holder: &LeaseHolder) -> StoreResult<bool>;
    /// Releases the lease of each (host, holder) still held by that holder
    /// and marks those hosts offline, in one statement (one transaction on
    /// SQLite), so a draining instance lets all its hosts go at once;
    /// returns the hosts released. A host another connection seized first
    /// keeps its lease and its state.
    async fn release_host_leases(&self, leases: &[(Uuid, LeaseHolder)]) -> StoreResult<Vec<Uuid>>;
    /// The live holder of `key`.
    async fn lease_holder(&self, key: &str) -> StoreResult<Option<LeaseHolder>>;
    /// The live holders of several keys in one query, as (key, holder).
    async fn lease_holders(&self, keys: &[String]) -> StoreResult<Vec<(String, LeaseHolder)>>;
    /// Deletes lease rows that expired more than `older_than` ago.
    async fn delete_expired_leases(&self, older_than: Duration) -> StoreResult<u64>;

    // ---- cells (docs/CELLS.md, "Tables")
    /// The cell a host is assigned to and the assignment's epoch.
    async fn assignment(&self, host_id: Uuid) -> StoreResult<Option<(String, i64)>>;
    /// What the database check of a hello reads, in one query: the host's
    /// user and its assignment (docs/CELLS.md, "Admission"); `None` for an
    /// unknown host.
    async fn host_admission(&self, host_id: Uuid) -> StoreResult<Option<HostAdmission>>;
    /// Registers a cell, or updates its url, region and pool sizes (a cell
    /// registers itself at start).
    async fn register_cell(&self, cell: &CellRow) -> StoreResult<()>;
    /// Every registered cell with its switch and its effective row, by cell id.
    async fn list_cells(&self) -> StoreResult<Vec<CellView>>;
    /// The operator's switch of a cell.
    async fn cell_switch(&self, cell_id: &str) -> StoreResult<Option<CellSwitch>>;
    /// Writes a cell's switch: the mode when given, the slot cap when given
    /// (`Some(None)` removes the cap). Every write bumps the generation, a
    /// write that changes nothing too (it re-arms a latched trip); a new row
    /// starts at generation 1 and, without a mode, in `db`. A cap over
    /// [`MAX_TRIP_SLOTS`] is refused before anything is written.
    async fn set_cell_switch(
        &self,
        cell_id: &str,
        admit_mode: Option<AdmitMode>,
        trip_slots: Option<Option<u8>>,
    ) -> StoreResult<CellSwitch>;
    /// Writes the cell's own effective row, stamped with the database's clock.
    async fn write_cell_effective(&self, cell_id: &str, mode: AdmitMode, incarnation: &str) -> StoreResult<()>;
    /// The dead-man trip's slot claim, in one short transaction: count the
    /// OTHER cells whose effective row says `db`, whose switch says
    /// `reserve` and whose row was written within `fresh`; below `slots`,
    /// write this cell's row `db` and win. Claims of all cells are
    /// serialised (PostgreSQL: a transaction-scoped advisory lock taken
    /// without waiting, [`SlotClaim::Busy`] when another claim holds it).
    async fn claim_trip_slot(
        &self,
        cell_id: &str,
        incarnation: &str,
        slots: u8,
        fresh: Duration,
    ) -> StoreResult<SlotClaim>;
    /// Assigns a host to a cell with the next epoch (1 for a new host) and
    /// returns it: the director's database fallback.
    async fn assign_host(&self, host_id: Uuid, cell_id: &str) -> StoreResult<i64>;
    /// Records hosts admitted on `cell_id` at their epochs in one statement
    /// (a tripped cell re-registers the hosts it admitted from memory); a
    /// stored higher epoch is kept. Returns how many rows were written.
    async fn record_assignments(&self, cell_id: &str, hosts: &[(Uuid, i64)]) -> StoreResult<u64>;

    // ---- host credentials (encrypted by the caller)
    /// Stores a host's sealed credentials with the expiry they state, if
    /// any (docs/CLUSTER.md, "Periodic host tasks").
    async fn put_credentials(
        &self,
        host_id: Uuid,
        sealed: &SealedCredentials,
        expires_at: Option<DateTime<Utc>>,
    ) -> StoreResult<()>;
    /// Hosts connected anywhere (live host lease) whose stored credentials
    /// expire before `before`.
    async fn credentials_expiring(&self, before: DateTime<Utc>) -> StoreResult<Vec<Uuid>>;
    async fn get_credentials(&self, host_id: Uuid) -> StoreResult<Option<SealedCredentials>>;

    // ---- audit (docs/SECURITY.md, "Audit"): appended, listed, aged out; never updated
    /// Appends a batch of events in one transaction.
    async fn insert_audit_events(&self, events: &[NewAuditEvent]) -> StoreResult<()>;
    /// A user's events at or after `since` (all when None), newest first,
    /// at most `limit`.
    async fn list_audit_events(
        &self,
        user_id: Uuid,
        since: Option<DateTime<Utc>>,
        limit: usize,
    ) -> StoreResult<Vec<AuditEvent>>;
    /// Deletes events older than `before`; returns how many.
    async fn delete_audit_events_before(&self, before: DateTime<Utc>) -> StoreResult<u64>;
}

/// Counts a backend's calls to its database (`tether_store_queries_total`):
/// each backend counts where every call of it passes (taking a pooled
/// connection, entering the SQLite connection).
#[derive(Debug, Default)]
pub(crate) struct QueryCounter(std::sync::atomic::AtomicU64);

impl QueryCounter {
    pub(crate) fn count(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn total(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The columns of an audit event, in the order both backends read them.
const AUDIT_COLS: &str = "id, at, user_id, token_id, action, host_id, terminal_id, instance_id, detail";

/// An `exited` terminal row that a hello may bring back to `running`: one
/// with no exit status and no error recorded, which only the hello's
/// reconciliation writes. A daemon that reports such a terminal still runs
/// it (it was marked exited while another daemon of the same host held the
/// connection); docs/PROTOCOL.md, the hello's reconciliation.
const REVIVABLE: &str = "exit_code IS NULL AND exit_signal IS NULL AND error IS NULL";

/// The lease key of a host's daemon connection (docs/CLUSTER.md, "Ownership: the host lease").
pub fn host_lease_key(host_id: Uuid) -> String {
    format!("host:{host_id}")
}

/// The value of a store call whose failure the caller can only note: the
/// error is logged with its cause and `what` was being done.
pub fn logged<T>(result: StoreResult<T>, what: &'static str) -> Option<T> {
    result.map_err(|e| tracing::error!(error = %e, what, "tether_store_error")).ok()
}

/// Opens the store the settings select, applying migrations.
pub async fn open(settings: &Settings) -> StoreResult<Arc<dyn Store>> {
    let store: Arc<dyn Store> = match &settings.database.url {
        Some(url) => Arc::new(postgres_store(url, settings).await?),
        None => Arc::new(sqlite::SqliteStore::open(&settings.database.sqlite_path)?),
    };
    store.migrate().await?;
    Ok(store)
}

/// The schema version this binary migrates `store`'s backend to.
pub fn known_schema_version(store: &dyn Store) -> i64 {
    migrate::latest(if store.backend() == "postgres" { MIGRATIONS_POSTGRES } else { MIGRATIONS_SQLITE })
}

/// Opens the store for an operator's command (`tether token`, `tether
/// cell`). A database with no schema yet is migrated, as `serve` would;
/// one at an older schema is refused, not upgraded behind the operator's
/// back (`tether migrate` does that, after a backup: docs/OPERATIONS.md);
/// a newer one is refused as `serve` refuses it.
pub async fn open_current(settings: &Settings) -> StoreResult<Arc<dyn Store>> {
    let store = open_unmigrated(settings).await?;
    let version = store.schema_version().await?;
    let known = known_schema_version(store.as_ref());
    if version == 0 {
        store.migrate().await?;
    } else if version < known {
        return Err(StoreError::Migration(format!(
            "the database is at schema version {version}, older than this binary's ({known}); \
             run `tether migrate` (or start `tether serve`) first"
        )));
    } else if version > known {
        return Err(migrate::too_new(version, known));
    }
    Ok(store)
}

/// Opens the store without migrating (for `tether migrate` reporting).
pub async fn open_unmigrated(settings: &Settings) -> StoreResult<Arc<dyn Store>> {
    Ok(match &settings.database.url {
        Some(url) => Arc::new(postgres_store(url, settings).await?),
        None => Arc::new(sqlite::SqliteStore::open(&settings.database.sqlite_path)?),
    })
}

/// The PostgreSQL store of `settings.database`.
async fn postgres_store(url: &str, settings: &Settings) -> StoreResult<postgres::PgStore> {
    let call_timeout = Duration::from_millis(settings.database.call_timeout_ms);
    Ok(postgres::PgStore::connect(url, settings.database.pool_size).await?.with_call_timeout(call_timeout))
}
