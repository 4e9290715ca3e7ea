//! The PostgreSQL backend: the shared store of a cluster.
//!
//! A deadpool-postgres pool of tokio-postgres connections. Lease expiry is
//! judged by the database clock (`now()`), so instances with skewed clocks
//! still agree on who holds a lease. Advisory locks, where used, are only
//! transaction-scoped: a session lock on a pooled connection would leak.

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::{NoTls, Row};
use uuid::Uuid;

use super::migrate::{latest, too_new, MIGRATIONS_POSTGRES};
use super::types::{parse_capabilities, parse_json_list, to_json};
use super::*;

/// Fixed key of the advisory lock that serialises migrations across instances.
const MIGRATION_LOCK_KEY: i64 = 0x7465_7468_6572_0001;
/// Fixed key of the advisory lock that serialises the cells' trip-slot
/// claims (docs/CELLS.md, "The slot claim").
const TRIP_SLOT_LOCK_KEY: i64 = 0x7465_7468_6572_0002;

pub struct PgStore {
    pool: Pool,
    queries: QueryCounter,
    /// Held while this instance's lease renewal, a lease release batch or a
    /// batch of hosts marked offline runs: they write the lease and host
    /// rows of many hosts in orders the planner picks, and a renewal still
    /// naming a connection that just ended shares rows with that
    /// connection's release, so two of them at once can deadlock
    /// (docs/BENCHMARKS.md, "a mass disconnect").
    lease_writes: tokio::sync::Mutex<()>,
    /// How long one call may wait for the database, its connection
    /// included (`database.call_timeout_ms`): a server that hangs, rather
    /// than refuses, would otherwise hold every caller for as long as it
    /// hangs (docs/OPERATIONS.md, "Faults").
    call_timeout: Duration,
}

fn pool_err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Pool(e.to_string())
}

/// A connection the pool could not open, with what the server or the
/// network said: tokio-postgres's own text is only "db error" (a refused
/// password, an unknown database) or "error connecting to server".
fn checkout_err(e: deadpool_postgres::PoolError) -> StoreError {
    match &e {
        deadpool_postgres::PoolError::Backend(inner) => {
            StoreError::Pool(format!("cannot open a connection: {}", super::with_causes(inner)))
        }
        _ => pool_err(e),
    }
}

fn secs(ttl: Duration) -> f64 {
    ttl.as_secs_f64()
}

const HOST_COLS: &str =
    "id, user_id, name, hostname, platform, arch, state, capabilities, dirs, last_seen_at, created_at";
const TERMINAL_COLS: &str = "id, user_id, host_id, title, dir, argv, state, pending_reason, exit_code, \
     exit_signal, error, cols, rows, run_id, created_at, started_at, ended_at, last_interacted_at";
/// The run's `exitSignal` is its terminal's (docs/REST.md, "Runs").
const RUN_COLS: &str = "id, user_id, host_id, argv, dir, state, exit_code, cpu_ms, max_rss_kb, \
     output_bytes, wall_ms, terminal_id, created_at, finished_at, \
     (SELECT t.exit_signal FROM terminals t WHERE t.id = runs.terminal_id), log_end, log_gap_bytes";

const TOKEN_COLS: &str =
    "id, user_id, name, scope, host_id, terminal_id, created_at, expires_at, last_used_at, revoked_at";

fn token_row(row: &Row) -> StoreResult<ApiToken> {
    let scope: String = row.get(3);
    Ok(ApiToken {
        id: row.get(0),
        user_id: row.get(1),
        name: row.get(2),
        scope: scope.parse()?,
        host_id: row.get(4),
        terminal_id: row.get(5),
        created_at: row.get(6),
        expires_at: row.get(7),
        last_used_at: row.get(8),
        revoked_at: row.get(9),
    })
}

/// `relay_cells` joined with its switch and effective row, and the
/// database's clock (read by [`cell_view`]).
const CELL_VIEW_SQL: &str = "SELECT c.cell_id, c.url, c.region, c.pool_size, c.reserve_pool_size, \
       m.admit_mode, m.dead_man_trip_slots, m.generation, m.updated_at, \
       e.mode, e.cell_incarnation, e.updated_at, now() \
     FROM relay_cells c \
     LEFT JOIN relay_cell_admit_modes m ON m.cell_id = c.cell_id \
     LEFT JOIN relay_cell_admit_effective e ON e.cell_id = c.cell_id \
     ORDER BY c.cell_id";

fn cell_view(row: &Row) -> StoreResult<CellView> {
    let cell_id: String = row.get(0);
    let switch = match row.get::<_, Option<String>>(5) {
        None => None,
        Some(mode) => Some(CellSwitch {
            cell_id: cell_id.clone(),
            admit_mode: cells::admit_mode(&mode)?,
            dead_man_trip_slots: cells::trip_slots(row.get::<_, Option<i32>>(6).map(i64::from))?,
            generation: row.get(7),
            updated_at: row.get(8),
        }),
    };
    let effective = match row.get::<_, Option<String>>(9) {
        None => None,
        Some(mode) => Some(CellEffective {
            mode: cells::admit_mode(&mode)?,
            cell_incarnation: row.get(10),
            updated_at: row.get(11),
        }),
    };
    Ok(CellView {
        cell: CellRow {
            cell_id,
            url: row.get(1),
            region: row.get(2),
            pool_size: cells::pool_size(row.get::<_, i32>(3).into())?,
            reserve_pool_size: cells::pool_size(row.get::<_, i32>(4).into())?,
        },
        switch,
        effective,
        read_at: row.get(12),
    })
}

fn cell_switch_row(cell_id: &str, row: &Row) -> StoreResult<CellSwitch> {
    Ok(CellSwitch {
        cell_id: cell_id.to_string(),
        admit_mode: cells::admit_mode(row.get(0))?,
        dead_man_trip_slots: cells::trip_slots(row.get::<_, Option<i32>>(1).map(i64::from))?,
        generation: row.get(2),
        updated_at: row.get(3),
    })
}

/// Writes a cell's effective row (`$1` cell, `$2` mode, `$3` incarnation).
const WRITE_EFFECTIVE_SQL: &str =
    "INSERT INTO relay_cell_admit_effective (cell_id, mode, cell_incarnation, updated_at) VALUES ($1, $2, $3, now()) \
     ON CONFLICT (cell_id) DO UPDATE SET mode = excluded.mode, cell_incarnation = excluded.cell_incarnation, \
       updated_at = now()";

fn user_row(row: &Row) -> User {
    User { id: row.get(0), name: row.get(1), created_at: row.get(2) }
}

fn host_row(row: &Row) -> StoreResult<Host> {
    let state: String = row.get(6);
    Ok(Host {
        id: row.get(0),
        user_id: row.get(1),
        name: row.get(2),
        hostname: row.get(3),
        platform: row.get(4),
        arch: row.get(5),
        state: if state == "online" { HostState::Online } else { HostState::Offline },
        capabilities: parse_capabilities(row.get(7))?,
        dirs: parse_json_list(row.get(8))?,
        last_seen_at: row.get(9),
        created_at: row.get(10),
    })
}

fn small(value: i32) -> u16 {
    u16::try_from(value.clamp(0, i32::from(u16::MAX))).unwrap_or(u16::MAX)
}

fn terminal_row(row: &Row) -> StoreResult<Terminal> {
    let state: String = row.get(6);
    Ok(Terminal {
        id: row.get(0),
        user_id: row.get(1),
        host_id: row.get(2),
        title: row.get(3),
        dir: row.get(4),
        argv: parse_json_list(row.get(5))?,
        state: state.parse()?,
        pending_reason: row.get(7),
        exit_code: row.get(8),
        exit_signal: row.get(9),
        error: row.get(10),
        cols: small(row.get(11)),
        rows: small(row.get(12)),
        run_id: row.get(13),
        created_at: row.get(14),
        started_at: row.get(15),
        ended_at: row.get(16),
        last_interacted_at: row.get(17),
    })
}

fn run_row(row: &Row) -> StoreResult<Run> {
    let state: String = row.get(5);
    let usage = match (row.get(7), row.get(8), row.get(9), row.get(10)) {
        (Some(cpu_ms), Some(max_rss_kb), Some(output_bytes), Some(wall_ms)) => {
            Some(RunUsage { cpu_ms, max_rss_kb, output_bytes, wall_ms })
        }
        _ => None,
    };
    Ok(Run {
        id: row.get(0),
        user_id: row.get(1),
        host_id: row.get(2),
        argv: parse_json_list(row.get(3))?,
        dir: row.get(4),
        state: state.parse()?,
        exit_code: row.get(6),
        exit_signal: row.get(14),
        usage,
        terminal_id: row.get(11),
        created_at: row.get(12),
        finished_at: row.get(13),
        log_end: row.get(15),
        log_gap_bytes: row.get(16),
    })
}

impl PgStore {
    /// Builds the pool and checks one connection.
    pub async fn connect(url: &str, pool_size: usize) -> StoreResult<Self> {
        let config: tokio_postgres::Config = url.parse()?;
        let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager).max_size(pool_size).build().map_err(pool_err)?;
        let store = Self {
            pool,
            queries: QueryCounter::default(),
            lease_writes: tokio::sync::Mutex::new(()),
            call_timeout: Duration::from_millis(crate::config::DatabaseSettings::default().call_timeout_ms),
        };
        store.ping().await?;
        Ok(store)
    }

    /// The store with another bound on each call (`database.call_timeout_ms`).
    pub fn with_call_timeout(self, call_timeout: Duration) -> Self {
        Self { call_timeout, ..self }
    }

    /// Runs one call of this backend within [`Self::call_timeout`]. A call
    /// given up on answers [`StoreError::Unanswered`]; a statement it had
    /// already sent may still run when the server answers again.
    async fn within<T>(&self, call: impl std::future::Future<Output = StoreResult<T>>) -> StoreResult<T> {
        tokio::time::timeout(self.call_timeout, call).await.unwrap_or(Err(StoreError::Unanswered(self.call_timeout)))
    }

    /// A pooled connection; every call of this backend takes one, so this
    /// is where its calls are counted.
    async fn client(&self) -> StoreResult<deadpool_postgres::Object> {
        self.queries.count();
        self.pool.get().await.map_err(checkout_err)
    }

    async fn execute(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> StoreResult<u64> {
        self.within(async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(sql).await?;
            Ok(client.execute(&stmt, params).await?)
        })
        .await
    }

    async fn query(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> StoreResult<Vec<Row>> {
        self.within(async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(sql).await?;
            Ok(client.query(&stmt, params).await?)
        })
        .await
    }

    /// [`Self::query`] for a statement that writes many rows another one
    /// may be writing at the same time, in another order (a hello and
    /// another hello of its host; a batch of lease releases and the lease
    /// renewal): PostgreSQL may end it as a deadlock or a serialization
    /// failure, and running it again completes it. `what` names it in the log.
    ///
    /// It runs again only after a pause: the statement it lost to waits for
    /// rows this one held, and a row whose locker has just aborted is free
    /// to whoever writes it first. Run again at once, it could lock those
    /// rows again before the winner (woken, but not yet scheduled) took
    /// them, and meet the same deadlock every time.
    async fn query_retrying(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        what: &'static str,
    ) -> StoreResult<Vec<Row>> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.query(sql, params).await {
                Err(StoreError::Postgres(e)) if attempts < RETRY_ATTEMPTS && is_lock_conflict(&e) => {
                    tracing::info!(error = %e, what, attempts, "tether_statement_retried");
                    tokio::time::sleep(retry_pause(attempts)).await;
                }
                other => return other,
            }
        }
    }

    /// Runs the insert `sql` (a terminal or a run, `RETURNING` its row) in
    /// one transaction after the caps check of `(user, host, caps)`: the
    /// user's row is locked first (`FOR NO KEY UPDATE`, which does not
    /// block the key-share locks of foreign keys), so two inserts of one
    /// user count one after the other and cannot both take the last place.
    async fn insert_admitted(
        &self,
        (user_id, host_id, caps): (Uuid, Uuid, Option<TerminalCaps>),
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> StoreResult<Row> {
        self.within(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            if let Some(caps) = caps {
                tx.execute("SELECT 1 FROM users WHERE id = $1 FOR NO KEY UPDATE", &[&user_id]).await?;
                let row = tx.query_one(super::caps::LIVE_TERMINALS_SQL, &[&host_id, &user_id]).await?;
                caps.admit(row.get(0), row.get(1))?;
            }
            let row = tx.query_one(sql, params).await?;
            tx.commit().await?;
            Ok(row)
        })
        .await
    }

    async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> StoreResult<Option<Row>> {
        self.within(async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(sql).await?;
            Ok(client.query_opt(&stmt, params).await?)
        })
        .await
    }
}

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn ping(&self) -> StoreResult<()> {
        self.within(async {
            let client = self.client().await?;
            client.simple_query("SELECT 1").await?;
            Ok(())
        })
        .await
    }

    async fn migrate(&self) -> StoreResult<usize> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // Instances starting together take turns; the lock ends with the transaction.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY]).await?;
        // `CREATE ... IF NOT EXISTS` of what is there already is a NOTICE,
        // which the driver would log on every start; warnings still show.
        tx.batch_execute("SET LOCAL client_min_messages = warning").await?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                version bigint PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;
        let current: i64 = tx.query_one("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", &[]).await?.get(0);
        let known = latest(MIGRATIONS_POSTGRES);
        if current > known {
            return Err(too_new(current, known));
        }
        let mut applied = 0;
        for m in MIGRATIONS_POSTGRES.iter().filter(|m| m.version > current) {
            tx.batch_execute(m.sql)
                .await
                .map_err(|e| StoreError::Migration(format!("{:04}_{}: {}", m.version, m.name, with_causes(&e))))?;
            tx.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", &[&m.version, &m.name]).await?;
            applied += 1;
        }
        tx.commit().await?;
        Ok(applied)
    }

    async fn schema_version(&self) -> StoreResult<i64> {
        let row = self
            .query_opt(
                "SELECT CASE WHEN to_regclass('schema_migrations') IS NULL THEN 0::bigint \
                 ELSE (SELECT COALESCE(MAX(version), 0) FROM schema_migrations) END",
                &[],
            )
            .await;
        match row {
            Ok(Some(row)) => Ok(row.get(0)),
            Ok(None) => Ok(0),
            // The CASE still plans the subquery; a missing table means version 0.
            Err(StoreError::Postgres(e)) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    fn pool_status(&self) -> PoolStatus {
        let s = self.pool.status();
        PoolStatus { size: s.size, available: s.available, waiting: s.waiting, max_size: s.max_size }
    }

    fn resize_pool(&self, max_size: usize) {
        self.pool.resize(max_size.max(1));
    }

    fn queries_total(&self) -> u64 {
        self.queries.total()
    }

    async fn ensure_user(&self, name: &str) -> StoreResult<User> {
        let row = self
            .query_opt(
                "WITH ins AS (INSERT INTO users (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING \
                   RETURNING id, name, created_at) \
                 SELECT id, name, created_at FROM ins UNION ALL \
                 SELECT id, name, created_at FROM users WHERE name = $2 LIMIT 1",
                &[&Uuid::new_v4(), &name],
            )
            .await?
            .ok_or_else(|| StoreError::Corrupt("user upsert returned nothing".into()))?;
        Ok(user_row(&row))
    }

    async fn user_by_name(&self, name: &str) -> StoreResult<Option<User>> {
        let row = self.query_opt("SELECT id, name, created_at FROM users WHERE name = $1", &[&name]).await?;
        Ok(row.as_ref().map(user_row))
    }

    async fn insert_token(&self, new: &NewToken) -> StoreResult<ApiToken> {
        let row = self
            .query_opt(
                &format!(
                    "INSERT INTO api_tokens (id, token_hash, user_id, name, scope, host_id, terminal_id, expires_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {TOKEN_COLS}"
                ),
                &[
                    &Uuid::new_v4(),
                    &new.token_hash,
                    &new.user_id,
                    &new.name,
                    &new.scope.as_str(),
                    &new.host_id,
                    &new.terminal_id,
                    &new.expires_at,
                ],
            )
            .await?
            .ok_or_else(|| StoreError::Corrupt("token insert returned nothing".into()))?;
        token_row(&row)
    }

    async fn tokens_by_hash(
        &self,
        token_hashes: &[String],
        now: DateTime<Utc>,
    ) -> StoreResult<HashMap<String, FoundToken>> {
        let cols: String = TOKEN_COLS.split(", ").map(|c| format!("t.{c}")).collect::<Vec<_>>().join(", ");
        // The stamp skips a row another transaction holds (its own stamp,
        // most likely): a lookup never waits for a lock, and two instances
        // stamping overlapping tokens in different orders cannot deadlock.
        let rows = self
            .query(
                &format!(
                    "WITH found AS (SELECT {cols}, u.id AS uid, u.name AS uname, u.created_at AS ucreated, \
                       h.user_id AS host_user, ra.cell_id AS host_cell, ra.epoch AS host_epoch, t.token_hash AS hash \
                       FROM api_tokens t JOIN users u ON u.id = t.user_id \
                       LEFT JOIN hosts h ON h.id = t.host_id LEFT JOIN relay_assignments ra ON ra.host_id = t.host_id \
                       WHERE t.token_hash = ANY($1) AND t.revoked_at IS NULL \
                       AND (t.expires_at IS NULL OR t.expires_at > now())), \
                     due AS (SELECT a.id FROM api_tokens a WHERE a.id IN (SELECT id FROM found) \
                       AND (a.last_used_at IS NULL OR a.last_used_at <= $2::timestamptz - make_interval(secs => $3)) \
                       FOR UPDATE SKIP LOCKED), \
                     stamped AS (UPDATE api_tokens a SET last_used_at = $2::timestamptz FROM due WHERE a.id = due.id) \
                     SELECT * FROM found"
                ),
                &[&token_hashes, &now, &secs(LAST_USED_EVERY)],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let user = User { id: row.get(10), name: row.get(11), created_at: row.get(12) };
                let bound_host = row.get::<_, Option<Uuid>>(13).map(|user_id| {
                    let assignment = row.get::<_, Option<String>>(14).zip(row.get::<_, Option<i64>>(15));
                    HostAdmission { user_id, assignment }
                });
                Ok((row.get(16), FoundToken { user, token: token_row(row)?, bound_host }))
            })
            .collect()
    }

    async fn token_by_id(&self, id: Uuid) -> StoreResult<Option<ApiToken>> {
        self.query_opt(&format!("SELECT {TOKEN_COLS} FROM api_tokens WHERE id = $1"), &[&id])
            .await?
            .as_ref()
            .map(token_row)
            .transpose()
    }

    async fn list_tokens(&self, user_id: Uuid) -> StoreResult<Vec<ApiToken>> {
        self.query(
            &format!("SELECT {TOKEN_COLS} FROM api_tokens WHERE user_id = $1 ORDER BY created_at, id"),
            &[&user_id],
        )
        .await?
        .iter()
        .map(token_row)
        .collect()
    }

    async fn revoke_token(&self, user_id: Option<Uuid>, id: Uuid) -> StoreResult<Option<Revocation>> {
        // The token is found in the statement's snapshot, before its update.
        let row = self
            .query_opt(
                "WITH now_revoked AS ( \
                   UPDATE api_tokens SET revoked_at = now() \
                   WHERE id = $1 AND ($2::uuid IS NULL OR user_id = $2) AND revoked_at IS NULL RETURNING user_id) \
                 SELECT (SELECT user_id FROM now_revoked), \
                        EXISTS (SELECT 1 FROM api_tokens WHERE id = $1 AND ($2::uuid IS NULL OR user_id = $2))",
                &[&id, &user_id],
            )
            .await?;
        // The statement has no FROM: it always answers one row.
        Ok(match row.map(|r| (r.get::<_, Option<Uuid>>(0), r.get(1))) {
            Some((Some(user_id), _)) => Some(Revocation::Now { user_id }),
            Some((None, true)) => Some(Revocation::Earlier),
            _ => None,
        })
    }

    async fn bind_token_host(&self, id: Uuid, host_id: Uuid) -> StoreResult<Option<Uuid>> {
        self.within(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            // Two tokens binding to one host take turns on its row, so the
            // second one's check (a statement of its own, so a fresh snapshot)
            // sees the first one's binding.
            tx.execute("SELECT 1 FROM hosts WHERE id = $1 FOR NO KEY UPDATE", &[&host_id]).await?;
            let row = tx
                .query_opt(
                    "WITH bound AS (UPDATE api_tokens SET host_id = $2 WHERE id = $1 AND host_id IS NULL \
                       AND NOT EXISTS (SELECT 1 FROM api_tokens o WHERE o.host_id = $2 AND o.id <> $1 \
                         AND o.revoked_at IS NULL AND (o.expires_at IS NULL OR o.expires_at > now())) \
                       RETURNING host_id) \
                     SELECT host_id FROM bound UNION ALL SELECT host_id FROM api_tokens WHERE id = $1 LIMIT 1",
                    &[&id, &host_id],
                )
                .await?;
            tx.commit().await?;
            Ok(row.and_then(|r| r.get::<_, Option<Uuid>>(0)))
        })
        .await
    }

    async fn ended_tokens(&self, since: Option<DateTime<Utc>>, fresh: &[Uuid]) -> StoreResult<EndedTokens> {
        let row = self
            .query_opt(
                "WITH changed(id) AS ( \
                   SELECT token_id FROM api_token_ends WHERE ended_at > $1 \
                   UNION SELECT id FROM api_tokens WHERE expires_at > $1 AND expires_at <= now() \
                   UNION SELECT unnest($2::uuid[])) \
                 SELECT now(), ARRAY(SELECT c.id FROM changed c WHERE NOT EXISTS ( \
                   SELECT 1 FROM api_tokens t WHERE t.id = c.id AND t.revoked_at IS NULL \
                   AND (t.expires_at IS NULL OR t.expires_at > now())))",
                &[&since, &fresh],
            )
            .await?
            .ok_or_else(|| StoreError::Corrupt("the ended-token check returned no row".into()))?;
        Ok(EndedTokens { checked_at: row.get(0), ended: row.get(1) })
    }

    async fn delete_token_ends_before(&self, before: DateTime<Utc>) -> StoreResult<u64> {
        Ok(self.execute("DELETE FROM api_token_ends WHERE ended_at < $1", &[&before]).await?)
    }

    async fn register_host(&self, new: &NewHost, daemon_token: Option<Uuid>) -> StoreResult<Registered> {
        self.within(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            if let Some(token) = daemon_token {
                // One token's registrations take turns on its row.
                let bound: Option<Uuid> = tx
                    .query_opt("SELECT host_id FROM api_tokens WHERE id = $1 FOR UPDATE", &[&token])
                    .await?
                    .and_then(|row| row.get(0));
                if let Some(bound) = bound {
                    let same = tx
                        .query_opt(
                            "SELECT 1 FROM hosts WHERE id = $1 AND user_id = $2 AND hostname = $3",
                            &[&bound, &new.user_id, &new.hostname],
                        )
                        .await?
                        .is_some();
                    if !same {
                        return Ok(Registered::TokenBoundElsewhere);
                    }
                }
            }
            let row = tx
                .query_one(
                    &format!(
                        "INSERT INTO hosts (id, user_id, name, hostname, platform, arch) VALUES ($1, $2, $3, $4, $5, $6) \
                         ON CONFLICT (user_id, hostname) DO UPDATE SET \
                           name = excluded.name, platform = excluded.platform, arch = excluded.arch \
                         RETURNING {HOST_COLS}"
                    ),
                    &[&Uuid::new_v4(), &new.user_id, &new.name, &new.hostname, &new.platform, &new.arch],
                )
                .await?;
            let host = host_row(&row)?;
            if let Some(token) = daemon_token {
                // A statement of its own, after the upsert took the host's
                // row: it sees a binding another token committed meanwhile.
                let taken = tx
                    .query_opt(
                        "SELECT 1 FROM api_tokens WHERE host_id = $1 AND id <> $2 AND revoked_at IS NULL \
                         AND (expires_at IS NULL OR expires_at > now())",
                        &[&host.id, &token],
                    )
                    .await?
                    .is_some();
                if taken {
                    return Ok(Registered::HostHasToken);
                }
                tx.execute("UPDATE api_tokens SET host_id = $2 WHERE id = $1 AND host_id IS NULL", &[&token, &host.id])
                    .await?;
            }
            tx.commit().await?;
            Ok(Registered::Host(host))
        })
        .await
    }

    async fn list_hosts(&self, user_id: Uuid) -> StoreResult<Vec<Host>> {
        self.query(&format!("SELECT {HOST_COLS} FROM hosts WHERE user_id = $1 ORDER BY created_at, id"), &[&user_id])
            .await?
            .iter()
            .map(host_row)
            .collect()
    }

    async fn page_hosts(
        &self,
        user_id: Uuid,
        online: Option<bool>,
        page: &PageAfter,
    ) -> StoreResult<Vec<(Host, bool)>> {
        let (after_at, after_id) = page.after.unzip();
        self.query(
            &format!(
                "SELECT * FROM (SELECT {HOST_COLS}, EXISTS (SELECT 1 FROM leases l \
                   WHERE l.key = 'host:' || h.id::text AND l.expires_at > now()) AS live \
                 FROM hosts h WHERE user_id = $1 \
                 AND ($2::timestamptz IS NULL OR (created_at, id) > ($2, $3::uuid))) page \
                 WHERE ($4::bool IS NULL OR live = $4) ORDER BY created_at, id LIMIT $5"
            ),
            &[&user_id, &after_at, &after_id, &online, &page.sql_limit()],
        )
        .await?
        .iter()
        .map(|row| Ok((host_row(row)?, row.get("live"))))
        .collect()
    }

    async fn get_host(&self, user_id: Uuid, host_id: Uuid) -> StoreResult<Option<Host>> {
        self.query_opt(&format!("SELECT {HOST_COLS} FROM hosts WHERE id = $1 AND user_id = $2"), &[&host_id, &user_id])
            .await?
            .as_ref()
            .map(host_row)
            .transpose()
    }

    async fn host_by_id(&self, host_id: Uuid) -> StoreResult<Option<Host>> {
        self.query_opt(&format!("SELECT {HOST_COLS} FROM hosts WHERE id = $1"), &[&host_id])
            .await?
            .as_ref()
            .map(host_row)
            .transpose()
    }

    async fn delete_host(&self, user_id: Uuid, host_id: Uuid) -> StoreResult<bool> {
        self.within(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let exists = tx
                .query_opt("SELECT 1 FROM hosts WHERE id = $1 AND user_id = $2 FOR UPDATE", &[&host_id, &user_id])
                .await?
                .is_some();
            if exists {
                tx.execute("DELETE FROM terminals WHERE host_id = $1", &[&host_id]).await?;
                tx.execute("DELETE FROM runs WHERE host_id = $1", &[&host_id]).await?;
                tx.execute("DELETE FROM relay_assignments WHERE host_id = $1", &[&host_id]).await?;
                // Its daemon tokens may register a machine again (docs/REST.md).
                tx.execute("UPDATE api_tokens SET host_id = NULL WHERE host_id = $1", &[&host_id]).await?;
                tx.execute("DELETE FROM hosts WHERE id = $1", &[&host_id]).await?;
            }
            tx.commit().await?;
            Ok(exists)
        })
        .await
    }

    async fn set_host_dirs(&self, host_id: Uuid, dirs: &[String]) -> StoreResult<()> {
        self.execute("UPDATE hosts SET dirs = $2 WHERE id = $1", &[&host_id, &to_json(&dirs)]).await?;
        Ok(())
    }

    async fn mark_hosts_offline_unless_leased(&self, host_ids: &[Uuid]) -> StoreResult<Vec<Uuid>> {
        if host_ids.is_empty() {
            return Ok(Vec::new());
        }
        // It writes host rows the renewal writes too (`lease_writes`).
        let _one_at_a_time = self.lease_writes.lock().await;
        Ok(self
            .query_retrying(
                "UPDATE hosts SET state = 'offline', last_seen_at = now() \
                 WHERE id = ANY($1) AND NOT EXISTS ( \
                   SELECT 1 FROM leases l WHERE l.key = 'host:' || hosts.id::text AND l.expires_at > now()) \
                 RETURNING id",
                &[&host_ids],
                "mark hosts offline",
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn insert_terminal(&self, new: &NewTerminal, caps: Option<TerminalCaps>) -> StoreResult<Terminal> {
        let sql = format!(
            "INSERT INTO terminals (id, user_id, host_id, title, dir, argv, state, pending_reason, cols, rows, run_id) \
             VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8, $9, $10) RETURNING {TERMINAL_COLS}"
        );
        let row = self
            .insert_admitted(
                (new.user_id, new.host_id, caps),
                &sql,
                &[
                    &Uuid::new_v4(),
                    &new.user_id,
                    &new.host_id,
                    &new.title,
                    &new.dir,
                    &to_json(&new.argv),
                    &PENDING_HOST_OFFLINE,
                    &i32::from(new.cols),
                    &i32::from(new.rows),
                    &new.run_id,
                ],
            )
            .await?;
        terminal_row(&row)
    }

    async fn get_terminal(&self, user_id: Uuid, id: Uuid) -> StoreResult<Option<Terminal>> {
        self.query_opt(
            &format!("SELECT {TERMINAL_COLS} FROM terminals WHERE id = $1 AND user_id = $2"),
            &[&id, &user_id],
        )
        .await?
        .as_ref()
        .map(terminal_row)
        .transpose()
    }

    async fn terminal_by_id(&self, id: Uuid) -> StoreResult<Option<Terminal>> {
        self.query_opt(&format!("SELECT {TERMINAL_COLS} FROM terminals WHERE id = $1"), &[&id])
            .await?
            .as_ref()
            .map(terminal_row)
            .transpose()
    }

    async fn page_terminals(
        &self,
        user_id: Uuid,
        filter: &TerminalFilter,
        page: &PageAfter,
    ) -> StoreResult<Vec<Terminal>> {
        let state = filter.state.map(|s| s.as_str());
        let (after_at, after_id) = page.after.unzip();
        self.query(
            &format!(
                "SELECT {TERMINAL_COLS} FROM terminals WHERE user_id = $1 \
                 AND ($2::uuid IS NULL OR host_id = $2) AND ($3::text IS NULL OR state = $3) \
                 AND ($4::timestamptz IS NULL OR (created_at, id) > ($4, $5::uuid)) \
                 ORDER BY created_at, id LIMIT $6"
            ),
            &[&user_id, &filter.host_id, &state, &after_at, &after_id, &page.sql_limit()],
        )
        .await?
        .iter()
        .map(terminal_row)
        .collect()
    }

    async fn delete_terminal(&self, user_id: Uuid, id: Uuid) -> StoreResult<DeleteOutcome> {
        let row = self
            .query_opt(
                "WITH target AS (SELECT id, state FROM terminals WHERE id = $1 AND user_id = $2 FOR UPDATE), \
                 del AS (DELETE FROM terminals t USING target WHERE t.id = target.id \
                   AND target.state NOT IN ('launching', 'running') RETURNING t.id) \
                 SELECT (SELECT count(*) FROM target), (SELECT count(*) FROM del)",
                &[&id, &user_id],
            )
            .await?
            .ok_or_else(|| StoreError::Corrupt("delete returned nothing".into()))?;
        let (found, deleted): (i64, i64) = (row.get(0), row.get(1));
        Ok(match (found, deleted) {
            (0, _) => DeleteOutcome::NotFound,
            (_, 0) => DeleteOutcome::Conflict,
            _ => DeleteOutcome::Deleted,
        })
    }

    async fn claim_launch(&self, host_id: Uuid, id: Uuid) -> StoreResult<bool> {
        Ok(self
            .execute(
                "UPDATE terminals SET state = 'launching', pending_reason = NULL, launched_at = now() \
                 WHERE id = $1 AND host_id = $2 AND state = 'pending'",
                &[&id, &host_id],
            )
            .await?
            == 1)
    }

    async fn park_terminal(&self, host_id: Uuid, id: Uuid, reason: &str) -> StoreResult<bool> {
        Ok(self
            .execute(
                "UPDATE terminals SET state = 'pending', pending_reason = $3, launched_at = NULL \
                 WHERE id = $1 AND host_id = $2 AND state = 'launching'",
                &[&id, &host_id, &reason],
            )
            .await?
            == 1)
    }

    async fn mark_started(&self, host_id: Uuid, id: Uuid) -> StoreResult<bool> {
        Ok(self
            .execute(
                "UPDATE terminals SET state = 'running', pending_reason = NULL, started_at = now() \
                 WHERE id = $1 AND host_id = $2 AND state IN ('pending', 'launching')",
                &[&id, &host_id],
            )
            .await?
            == 1)
    }

    async fn mark_spawn_failed(&self, host_id: Uuid, id: Uuid, message: &str) -> StoreResult<bool> {
        Ok(self
            .execute(
                "UPDATE terminals SET state = 'error', error = $3, pending_reason = NULL, ended_at = now() \
                 WHERE id = $1 AND host_id = $2 AND state IN ('pending', 'launching')",
                &[&id, &host_id, &message],
            )
            .await?
            == 1)
    }

    async fn mark_exited(&self, host_id: Uuid, id: Uuid, exit: ExitStatus) -> StoreResult<bool> {
        Ok(self
            .execute(
                "UPDATE terminals SET state = 'exited', exit_code = $3, exit_signal = $4, pending_reason = NULL, \
                 ended_at = now() WHERE id = $1 AND host_id = $2 AND state IN ('pending', 'launching', 'running')",
                &[&id, &host_id, &exit.code, &exit.signal],
            )
            .await?
            == 1)
    }

    async fn host_hello(&self, hello: &HostHello<'_>) -> StoreResult<Vec<HelloTerminal>> {
        let key = host_lease_key(hello.host_id);
        // One statement. PostgreSQL runs every data-modifying part once,
        // whether or not it is read, and all parts see the rows as they
        // were before it: `current` applies the reconciliation itself.
        let sql = format!(
            "WITH seized AS ( \
               INSERT INTO leases (key, holder, expires_at) \
               VALUES ($1, $2, now() + make_interval(secs => $3::float8)) \
               ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
               RETURNING key), \
             online AS ( \
               UPDATE hosts SET state = 'online', capabilities = $5, dirs = $6, last_seen_at = now() \
               WHERE id = $4 RETURNING id), \
             gone AS ( \
               UPDATE terminals SET state = 'exited', ended_at = now() WHERE host_id = $4 \
               AND state IN ('launching', 'running') AND NOT (id = ANY($7)) RETURNING id, run_id), \
             failed AS ( \
               UPDATE runs SET state = 'failed', exit_code = NULL, finished_at = now() \
               WHERE id IN (SELECT run_id FROM gone) AND state IN ('queued', 'dispatched', 'running') \
               RETURNING id), \
             started AS ( \
               UPDATE terminals SET state = 'running', started_at = COALESCE(started_at, now()), ended_at = NULL \
               WHERE host_id = $4 AND (state = 'launching' OR (state = 'exited' AND {REVIVABLE})) \
               AND id = ANY($7) RETURNING id, started_at), \
             current AS ( \
               SELECT t.id, t.user_id, t.host_id, t.title, t.dir, t.argv, \
                      CASE WHEN s.id IS NULL THEN t.state ELSE 'running' END AS state, \
                      t.pending_reason, t.exit_code, t.exit_signal, t.error, t.cols, t.rows, t.run_id, \
                      t.created_at, COALESCE(t.started_at, s.started_at) AS started_at, \
                      CASE WHEN s.id IS NULL THEN t.ended_at END AS ended_at, t.last_interacted_at \
               FROM terminals t LEFT JOIN started s ON s.id = t.id \
               WHERE t.host_id = $4 AND (t.state IN ('pending', 'launching', 'running') OR s.id IS NOT NULL) \
               AND t.id NOT IN (SELECT id FROM gone)) \
             SELECT {TERMINAL_COLS}, \
               (SELECT r.log_end FROM runs r WHERE r.id = current.run_id \
                AND r.state IN ('queued', 'dispatched', 'running')) \
             FROM current ORDER BY created_at, id"
        );
        let (holder, caps, dirs) = (hello.holder.encode(), to_json(hello.capabilities), to_json(&hello.dirs));
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
            [&key, &holder, &secs(hello.lease_ttl), &hello.host_id, &caps, &dirs, &hello.running];
        // Two hellos of one host at once take the same lease, host and
        // terminal rows in one statement each. A second run after a lock
        // conflict is what the hello means anyway: newest wins.
        self.query_retrying(&sql, &params, "hello")
            .await?
            .iter()
            .map(|row| Ok(HelloTerminal { terminal: terminal_row(row)?, unfinished_run_log_end: row.get(18) }))
            .collect()
    }

    async fn parked_terminals(&self, host_id: Uuid) -> StoreResult<Vec<Terminal>> {
        self.query(
            &format!(
                "SELECT {TERMINAL_COLS} FROM terminals WHERE host_id = $1 AND state = 'pending' ORDER BY created_at, id"
            ),
            &[&host_id],
        )
        .await?
        .iter()
        .map(terminal_row)
        .collect()
    }

    async fn parked_on_online_hosts(&self, limit: usize) -> StoreResult<Vec<Terminal>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.query(
            &format!(
                "SELECT {TERMINAL_COLS} FROM terminals WHERE state = 'pending' \
                 AND host_id IN (SELECT id FROM hosts WHERE state = 'online') ORDER BY created_at, id LIMIT $1"
            ),
            &[&limit],
        )
        .await?
        .iter()
        .map(terminal_row)
        .collect()
    }

    async fn mark_stale_hosts_offline(&self, stale: Duration) -> StoreResult<Vec<Uuid>> {
        Ok(self
            .query(
                "UPDATE hosts SET state = 'offline' WHERE state = 'online' AND ( \
                   last_seen_at IS NULL OR last_seen_at < now() - make_interval(secs => $1::float8) \
                   OR NOT EXISTS (SELECT 1 FROM leases l WHERE l.key = 'host:' || hosts.id::text AND l.expires_at > now())) \
                 RETURNING id",
                &[&secs(stale)],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn mark_lost_runs(&self, after: Duration) -> StoreResult<Vec<Uuid>> {
        Ok(self
            .query(
                "UPDATE runs SET state = 'lost', finished_at = now() \
                 WHERE state IN ('queued', 'dispatched', 'running') \
                 AND created_at < now() - make_interval(secs => $1::float8) AND host_id IN ( \
                   SELECT h.id FROM hosts h \
                   WHERE COALESCE(h.last_seen_at, h.created_at) < now() - make_interval(secs => $1::float8) \
                   AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.key = 'host:' || h.id::text AND l.expires_at > now())) \
                 RETURNING id",
                &[&secs(after)],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn fail_stuck_launches(&self, older_than: Duration) -> StoreResult<Vec<Uuid>> {
        Ok(self
            .query(
                "UPDATE terminals SET state = 'error', error = 'launch not acknowledged', ended_at = now() \
                 WHERE state = 'launching' AND launched_at < now() - make_interval(secs => $1::float8) RETURNING id",
                &[&secs(older_than)],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn put_snapshot(&self, host_id: Uuid, terminal_id: Uuid, snapshot: &TerminalSnapshot) -> StoreResult<()> {
        self.execute(
            "INSERT INTO terminal_snapshots (terminal_id, data, cols, rows) \
             SELECT id, $3, $4, $5 FROM terminals WHERE id = $1 AND host_id = $2 \
             ON CONFLICT (terminal_id) DO UPDATE SET data = excluded.data, cols = excluded.cols, \
               rows = excluded.rows, created_at = now()",
            &[&terminal_id, &host_id, &snapshot.data, &i32::from(snapshot.cols), &i32::from(snapshot.rows)],
        )
        .await?;
        Ok(())
    }

    async fn get_snapshot(&self, terminal_id: Uuid) -> StoreResult<Option<TerminalSnapshot>> {
        Ok(self
            .query_opt("SELECT data, cols, rows FROM terminal_snapshots WHERE terminal_id = $1", &[&terminal_id])
            .await?
            .map(|r| TerminalSnapshot { data: r.get(0), cols: small(r.get(1)), rows: small(r.get(2)) }))
    }

    async fn set_terminal_size(&self, host_id: Uuid, id: Uuid, cols: u16, rows: u16) -> StoreResult<()> {
        self.execute(
            "UPDATE terminals SET cols = $3, rows = $4 WHERE id = $1 AND host_id = $2",
            &[&id, &host_id, &i32::from(cols), &i32::from(rows)],
        )
        .await?;
        Ok(())
    }

    async fn stamp_interaction(&self, id: Uuid, now: DateTime<Utc>) -> StoreResult<Option<DateTime<Utc>>> {
        // One statement: write when the stored stamp is a minute old (or
        // missing), and answer the stored stamp either way.
        let row = self
            .query_opt(
                "WITH written AS (UPDATE terminals SET last_interacted_at = $2 WHERE id = $1 \
                 AND (last_interacted_at IS NULL OR last_interacted_at <= $2::timestamptz - interval '60 seconds') \
                 RETURNING last_interacted_at) \
                 SELECT last_interacted_at FROM written \
                 UNION ALL SELECT last_interacted_at FROM terminals \
                 WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM written)",
                &[&id, &now],
            )
            .await?;
        Ok(row.and_then(|r| r.get(0)))
    }

    async fn insert_run(&self, new: &NewRun, caps: Option<TerminalCaps>) -> StoreResult<Run> {
        let sql = format!(
            "INSERT INTO runs (id, user_id, host_id, argv, dir, state) VALUES ($1, $2, $3, $4, $5, 'queued') \
             RETURNING {RUN_COLS}"
        );
        let row = self
            .insert_admitted(
                (new.user_id, new.host_id, caps),
                &sql,
                &[&Uuid::new_v4(), &new.user_id, &new.host_id, &to_json(&new.argv), &new.dir],
            )
            .await?;
        run_row(&row)
    }

    async fn get_run(&self, user_id: Uuid, id: Uuid) -> StoreResult<Option<Run>> {
        self.query_opt(&format!("SELECT {RUN_COLS} FROM runs WHERE id = $1 AND user_id = $2"), &[&id, &user_id])
            .await?
            .as_ref()
            .map(run_row)
            .transpose()
    }

    async fn list_runs(&self, user_id: Uuid, filter: &RunFilter, page: &PageAfter) -> StoreResult<Vec<Run>> {
        let state = filter.state.map(|s| s.as_str());
        let (after_at, after_id) = page.after.unzip();
        self.query(
            &format!(
                "SELECT {RUN_COLS} FROM runs WHERE user_id = $1 AND ($2::uuid IS NULL OR host_id = $2) \
                 AND ($3::text IS NULL OR state = $3) \
                 AND ($4::timestamptz IS NULL OR (created_at, id) > ($4, $5::uuid)) \
                 ORDER BY created_at, id LIMIT $6"
            ),
            &[&user_id, &filter.host_id, &state, &after_at, &after_id, &page.sql_limit()],
        )
        .await?
        .iter()
        .map(run_row)
        .collect()
    }

    async fn queued_run_hosts(&self) -> StoreResult<Vec<Uuid>> {
        let rows = self.query("SELECT DISTINCT host_id FROM runs WHERE state = 'queued'", &[]).await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn claim_queued_runs(&self, online_hosts: &[Uuid], limit: usize) -> StoreResult<Vec<Run>> {
        if online_hosts.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut runs: Vec<Run> = self
            .query(
                &format!(
                    "UPDATE runs SET state = 'dispatched', dispatched_at = now() WHERE id IN ( \
                       SELECT id FROM runs WHERE state = 'queued' AND host_id = ANY($1) \
                       ORDER BY created_at, id LIMIT $2 FOR UPDATE SKIP LOCKED) \
                     RETURNING {RUN_COLS}"
                ),
                &[&online_hosts, &limit],
            )
            .await?
            .iter()
            .map(run_row)
            .collect::<StoreResult<_>>()?;
        runs.sort_by_key(|r| (r.created_at, r.id));
        Ok(runs)
    }

    async fn set_run_terminal(&self, run_id: Uuid, terminal_id: Uuid) -> StoreResult<()> {
        self.execute("UPDATE runs SET terminal_id = $2 WHERE id = $1", &[&run_id, &terminal_id]).await?;
        Ok(())
    }

    async fn mark_run_running(&self, run_id: Uuid) -> StoreResult<bool> {
        Ok(self.execute("UPDATE runs SET state = 'running' WHERE id = $1 AND state = 'dispatched'", &[&run_id]).await?
            == 1)
    }

    async fn finish_run(&self, run_id: Uuid, state: RunState, exit_code: Option<i32>) -> StoreResult<bool> {
        Ok(self
            .execute(
                "UPDATE runs SET state = $2, exit_code = $3, finished_at = now() \
                 WHERE id = $1 AND state IN ('queued', 'dispatched', 'running')",
                &[&run_id, &state.as_str(), &exit_code],
            )
            .await?
            == 1)
    }

    async fn set_run_usage(&self, run_id: Uuid, usage: &RunUsage) -> StoreResult<()> {
        self.execute(
            "UPDATE runs SET cpu_ms = $2, max_rss_kb = $3, output_bytes = $4, wall_ms = $5 WHERE id = $1",
            &[&run_id, &usage.cpu_ms, &usage.max_rss_kb, &usage.output_bytes, &usage.wall_ms],
        )
        .await?;
        Ok(())
    }

    async fn append_run_log(&self, run_id: Uuid, offset: u64, data: &[u8], max_bytes: usize) -> StoreResult<()> {
        let max = i32::try_from(max_bytes).unwrap_or(i32::MAX);
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        // Every right-hand side reads the row as it was: the bytes below the
        // stored end are skipped, a start past it is counted as lost (unless
        // the log is full: then what it lacks is past its cap).
        self.execute(
            "UPDATE runs SET \
               log = log || substring($2::bytea FROM (1 + GREATEST(0, log_end - $4::bigint))::int \
                                      FOR GREATEST(0, $3 - length(log))), \
               log_gap_bytes = log_gap_bytes + \
                 CASE WHEN length(log) >= $3 THEN 0 ELSE GREATEST(0, $4::bigint - log_end) END, \
               log_end = $4::bigint + length($2::bytea) \
             WHERE id = $1 AND $4::bigint + length($2::bytea) > log_end",
            &[&run_id, &data, &max, &offset],
        )
        .await?;
        Ok(())
    }

    async fn run_log(&self, user_id: Uuid, run_id: Uuid) -> StoreResult<Option<Vec<u8>>> {
        Ok(self
            .query_opt("SELECT log FROM runs WHERE id = $1 AND user_id = $2", &[&run_id, &user_id])
            .await?
            .map(|r| r.get(0)))
    }

    async fn claim_lease(&self, key: &str, holder: &LeaseHolder, ttl: Duration) -> StoreResult<bool> {
        let holder = holder.encode();
        Ok(self
            .execute(
                "INSERT INTO leases (key, holder, expires_at) \
                 VALUES ($1, $2, now() + make_interval(secs => $3::float8)) \
                 ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
                 WHERE leases.holder = excluded.holder OR leases.expires_at <= now()",
                &[&key, &holder, &secs(ttl)],
            )
            .await?
            == 1)
    }

    async fn seize_lease(&self, key: &str, holder: &LeaseHolder, ttl: Duration) -> StoreResult<Option<LeaseHolder>> {
        self.within(async {
            let holder = holder.encode();
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let previous: Option<String> = tx
                .query_opt("SELECT holder FROM leases WHERE key = $1 AND expires_at > now() FOR UPDATE", &[&key])
                .await?
                .map(|r| r.get(0));
            tx.execute(
                "INSERT INTO leases (key, holder, expires_at) VALUES ($1, $2, now() + make_interval(secs => $3::float8)) \
                 ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at",
                &[&key, &holder, &secs(ttl)],
            )
            .await?;
            tx.commit().await?;
            previous.as_deref().map(LeaseHolder::decode).transpose()
        })
        .await
    }

    async fn renew_leases(&self, leases: &[(String, LeaseHolder)], ttl: Duration) -> StoreResult<Vec<String>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<&str> = leases.iter().map(|(k, _)| k.as_str()).collect();
        let holders: Vec<String> = leases.iter().map(|(_, h)| h.encode()).collect();
        let _one_at_a_time = self.lease_writes.lock().await;
        Ok(self
            .query(
                "WITH renewed AS ( \
                   UPDATE leases l SET expires_at = now() + make_interval(secs => $3::float8) \
                   FROM unnest($1::text[], $2::text[]) AS mine(key, holder) \
                   WHERE l.key = mine.key AND l.holder = mine.holder RETURNING l.key), \
                 touched AS ( \
                   UPDATE hosts SET last_seen_at = now(), state = 'online' \
                   WHERE id IN (SELECT substr(key, 6)::uuid FROM renewed \
                                WHERE key ~ '^host:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$')) \
                 SELECT key FROM renewed",
                &[&keys, &holders, &secs(ttl)],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn release_lease(&self, key: &str, holder: &LeaseHolder) -> StoreResult<bool> {
        let holder = holder.encode();
        Ok(self.execute("DELETE FROM leases WHERE key = $1 AND holder = $2", &[&key, &holder]).await? == 1)
    }

    async fn release_host_leases(&self, leases: &[(Uuid, LeaseHolder)]) -> StoreResult<Vec<Uuid>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = leases.iter().map(|(host_id, _)| host_lease_key(*host_id)).collect();
        let holders: Vec<String> = leases.iter().map(|(_, h)| h.encode()).collect();
        // The lease key is the primary key: once this deletes a host's row
        // no other holder has it, and a seize racing this one waits for its
        // row lock and sets the host online after. This instance's renewal
        // waits for it (`lease_writes`); a writer elsewhere that takes the
        // same rows in another order can still end it as a deadlock, and it
        // runs again rather than leave its hosts online until their leases
        // lapse.
        let _one_at_a_time = self.lease_writes.lock().await;
        Ok(self
            .query_retrying(
                "WITH released AS ( \
                   DELETE FROM leases l USING unnest($1::text[], $2::text[]) AS mine(key, holder) \
                   WHERE l.key = mine.key AND l.holder = mine.holder RETURNING l.key) \
                 UPDATE hosts SET state = 'offline', last_seen_at = now() \
                 WHERE id IN (SELECT substr(key, 6)::uuid FROM released) RETURNING id",
                &[&keys, &holders],
                "release host leases",
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn lease_holder(&self, key: &str) -> StoreResult<Option<LeaseHolder>> {
        self.query_opt("SELECT holder FROM leases WHERE key = $1 AND expires_at > now()", &[&key])
            .await?
            .map(|r| LeaseHolder::decode(r.get(0)))
            .transpose()
    }

    async fn lease_holders(&self, keys: &[String]) -> StoreResult<Vec<(String, LeaseHolder)>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.query("SELECT key, holder FROM leases WHERE key = ANY($1) AND expires_at > now()", &[&keys])
            .await?
            .iter()
            .map(|r| Ok((r.get(0), LeaseHolder::decode(r.get(1))?)))
            .collect()
    }

    async fn delete_expired_leases(&self, older_than: Duration) -> StoreResult<u64> {
        self.execute(
            "DELETE FROM leases WHERE expires_at < now() - make_interval(secs => $1::float8)",
            &[&secs(older_than)],
        )
        .await
    }

    async fn assignment(&self, host_id: Uuid) -> StoreResult<Option<(String, i64)>> {
        Ok(self
            .query_opt("SELECT cell_id, epoch FROM relay_assignments WHERE host_id = $1", &[&host_id])
            .await?
            .map(|r| (r.get(0), r.get(1))))
    }

    async fn host_admission(&self, host_id: Uuid) -> StoreResult<Option<HostAdmission>> {
        let row = self
            .query_opt(
                "SELECT h.user_id, a.cell_id, a.epoch FROM hosts h \
                 LEFT JOIN relay_assignments a ON a.host_id = h.id WHERE h.id = $1",
                &[&host_id],
            )
            .await?;
        Ok(row.map(|r| {
            let assignment = r.get::<_, Option<String>>(1).zip(r.get::<_, Option<i64>>(2));
            HostAdmission { user_id: r.get(0), assignment }
        }))
    }

    async fn register_cell(&self, cell: &CellRow) -> StoreResult<()> {
        let pool = i32::try_from(cell.pool_size).unwrap_or(i32::MAX);
        let reserve = i32::try_from(cell.reserve_pool_size).unwrap_or(i32::MAX);
        self.execute(
            "INSERT INTO relay_cells (cell_id, url, region, pool_size, reserve_pool_size) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (cell_id) DO UPDATE SET url = excluded.url, region = excluded.region, \
               pool_size = excluded.pool_size, reserve_pool_size = excluded.reserve_pool_size",
            &[&cell.cell_id, &cell.url, &cell.region, &pool, &reserve],
        )
        .await?;
        Ok(())
    }

    async fn list_cells(&self) -> StoreResult<Vec<CellView>> {
        self.query(CELL_VIEW_SQL, &[]).await?.iter().map(cell_view).collect()
    }

    async fn cell_switch(&self, cell_id: &str) -> StoreResult<Option<CellSwitch>> {
        self.query_opt(
            "SELECT admit_mode, dead_man_trip_slots, generation, updated_at FROM relay_cell_admit_modes \
             WHERE cell_id = $1",
            &[&cell_id],
        )
        .await?
        .map(|row| cell_switch_row(cell_id, &row))
        .transpose()
    }

    async fn set_cell_switch(
        &self,
        cell_id: &str,
        admit_mode: Option<AdmitMode>,
        trip_slots: Option<Option<u8>>,
    ) -> StoreResult<CellSwitch> {
        cells::check_trip_slots(trip_slots)?;
        let mode = admit_mode.map(AdmitMode::as_str);
        let slots = trip_slots.flatten().map(i32::from);
        let row = self
            .query_opt(
                "INSERT INTO relay_cell_admit_modes (cell_id, admit_mode, dead_man_trip_slots, generation, updated_at) \
                 VALUES ($1, COALESCE($2::text, 'db'), $4::integer, 1, now()) \
                 ON CONFLICT (cell_id) DO UPDATE SET \
                   admit_mode = COALESCE($2::text, relay_cell_admit_modes.admit_mode), \
                   dead_man_trip_slots = CASE WHEN $3 THEN $4::integer \
                     ELSE relay_cell_admit_modes.dead_man_trip_slots END, \
                   generation = relay_cell_admit_modes.generation + 1, updated_at = now() \
                 RETURNING admit_mode, dead_man_trip_slots, generation, updated_at",
                &[&cell_id, &mode, &trip_slots.is_some(), &slots],
            )
            .await?
            .ok_or_else(|| StoreError::Corrupt("the switch upsert returned no row".into()))?;
        cell_switch_row(cell_id, &row)
    }

    async fn write_cell_effective(&self, cell_id: &str, mode: AdmitMode, incarnation: &str) -> StoreResult<()> {
        self.execute(WRITE_EFFECTIVE_SQL, &[&cell_id, &mode.as_str(), &incarnation]).await?;
        Ok(())
    }

    async fn claim_trip_slot(
        &self,
        cell_id: &str,
        incarnation: &str,
        slots: u8,
        fresh: Duration,
    ) -> StoreResult<SlotClaim> {
        self.within(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            // Without waiting: a claim that finds another in progress answers
            // Busy and asks again later, so no cell blocks a pooled connection
            // on another's claim. The lock ends with the transaction.
            let locked: bool =
                tx.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&TRIP_SLOT_LOCK_KEY]).await?.get(0);
            if !locked {
                tx.rollback().await?;
                return Ok(SlotClaim::Busy);
            }
            // Read committed: this statement's snapshot is taken after the lock,
            // so it sees the row of every claim that won before.
            let holders: i64 = tx
                .query_one(
                    "SELECT count(*) FROM relay_cell_admit_effective e \
                     JOIN relay_cell_admit_modes m ON m.cell_id = e.cell_id \
                     WHERE e.cell_id <> $1 AND e.mode = 'db' AND m.admit_mode = 'reserve' \
                       AND e.updated_at > now() - make_interval(secs => $2::float8)",
                    &[&cell_id, &secs(fresh)],
                )
                .await?
                .get(0);
            let claim = cells::slot_claim(slots, holders);
            if claim == SlotClaim::Won {
                tx.execute(WRITE_EFFECTIVE_SQL, &[&cell_id, &AdmitMode::Db.as_str(), &incarnation]).await?;
            }
            tx.commit().await?;
            Ok(claim)
        })
        .await
    }

    async fn assign_host(&self, host_id: Uuid, cell_id: &str) -> StoreResult<i64> {
        let row = self
            .query_opt(
                "INSERT INTO relay_assignments (host_id, cell_id, epoch, updated_at) VALUES ($1, $2, 1, now()) \
                 ON CONFLICT (host_id) DO UPDATE SET cell_id = excluded.cell_id, \
                   epoch = relay_assignments.epoch + 1, updated_at = now() \
                 RETURNING epoch",
                &[&host_id, &cell_id],
            )
            .await?
            .ok_or_else(|| StoreError::Corrupt("the assignment upsert returned no row".into()))?;
        Ok(row.get(0))
    }

    async fn record_assignments(&self, cell_id: &str, hosts: &[(Uuid, i64)]) -> StoreResult<u64> {
        if hosts.is_empty() {
            return Ok(0);
        }
        let (ids, epochs): (Vec<Uuid>, Vec<i64>) = cells::highest_epochs(hosts).into_iter().unzip();
        self.execute(
            "INSERT INTO relay_assignments (host_id, cell_id, epoch, updated_at) \
             SELECT h.host_id, $1, h.epoch, now() FROM unnest($2::uuid[], $3::bigint[]) AS h(host_id, epoch) \
             ON CONFLICT (host_id) DO UPDATE SET cell_id = excluded.cell_id, epoch = excluded.epoch, \
               updated_at = now() \
             WHERE relay_assignments.epoch <= excluded.epoch",
            &[&cell_id, &ids, &epochs],
        )
        .await
    }

    async fn put_credentials(
        &self,
        host_id: Uuid,
        sealed: &SealedCredentials,
        expires_at: Option<DateTime<Utc>>,
    ) -> StoreResult<()> {
        self.execute(
            "INSERT INTO host_credentials (host_id, nonce, ciphertext, expires_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (host_id) DO UPDATE SET nonce = excluded.nonce, ciphertext = excluded.ciphertext, \
               updated_at = now(), expires_at = excluded.expires_at",
            &[&host_id, &sealed.nonce, &sealed.ciphertext, &expires_at],
        )
        .await?;
        Ok(())
    }

    async fn credentials_expiring(&self, before: DateTime<Utc>) -> StoreResult<Vec<Uuid>> {
        Ok(self
            .query(
                "SELECT hc.host_id FROM host_credentials hc \
                 JOIN leases l ON l.key = 'host:' || hc.host_id::text AND l.expires_at > now() \
                 WHERE hc.expires_at < $1",
                &[&before],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn get_credentials(&self, host_id: Uuid) -> StoreResult<Option<SealedCredentials>> {
        Ok(self
            .query_opt("SELECT nonce, ciphertext FROM host_credentials WHERE host_id = $1", &[&host_id])
            .await?
            .map(|r| SealedCredentials { nonce: r.get(0), ciphertext: r.get(1) }))
    }

    async fn insert_audit_events(&self, events: &[NewAuditEvent]) -> StoreResult<()> {
        // One statement for the whole batch (the audit writer's, up to
        // 256 events), not a round trip per event.
        let ids: Vec<Uuid> = events.iter().map(|_| Uuid::new_v4()).collect();
        let at: Vec<DateTime<Utc>> = events.iter().map(|e| e.at).collect();
        let user_ids: Vec<Uuid> = events.iter().map(|e| e.user_id).collect();
        let token_ids: Vec<Option<Uuid>> = events.iter().map(|e| e.token_id).collect();
        let actions: Vec<&str> = events.iter().map(|e| e.action.as_str()).collect();
        let host_ids: Vec<Option<Uuid>> = events.iter().map(|e| e.host_id).collect();
        let terminal_ids: Vec<Option<Uuid>> = events.iter().map(|e| e.terminal_id).collect();
        let instance_ids: Vec<&str> = events.iter().map(|e| e.instance_id.as_str()).collect();
        let details: Vec<Option<&str>> = events.iter().map(|e| e.detail.as_deref()).collect();
        self.execute(
            "INSERT INTO audit_events \
             (id, at, user_id, token_id, action, host_id, terminal_id, instance_id, detail) \
             SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::uuid[], $4::uuid[], $5::text[], \
                                  $6::uuid[], $7::uuid[], $8::text[], $9::text[])",
            &[&ids, &at, &user_ids, &token_ids, &actions, &host_ids, &terminal_ids, &instance_ids, &details],
        )
        .await?;
        Ok(())
    }

    async fn list_audit_events(
        &self,
        user_id: Uuid,
        since: Option<DateTime<Utc>>,
        limit: usize,
    ) -> StoreResult<Vec<AuditEvent>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.query(
            &format!(
                "SELECT {AUDIT_COLS} \
             FROM audit_events WHERE user_id = $1 AND ($2::timestamptz IS NULL OR at >= $2) \
             ORDER BY at DESC, id DESC LIMIT $3"
            ),
            &[&user_id, &since, &limit],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(AuditEvent {
                id: r.get(0),
                at: r.get(1),
                user_id: r.get(2),
                token_id: r.get(3),
                action: r.get::<_, String>(4).parse()?,
                host_id: r.get(5),
                terminal_id: r.get(6),
                instance_id: r.get(7),
                detail: r.get(8),
            })
        })
        .collect()
    }

    async fn delete_audit_events_before(&self, before: DateTime<Utc>) -> StoreResult<u64> {
        self.execute("DELETE FROM audit_events WHERE at < $1", &[&before]).await
    }
}

/// Runs of a statement [`PostgresStore::query_retrying`] makes at most.
const RETRY_ATTEMPTS: u32 = 4;

/// The pause before run `attempts + 1`: 25 ms, 50 ms, 100 ms, each plus up
/// to as much again at random, so two sessions that conflicted do not run
/// again in step.
fn retry_pause(attempts: u32) -> Duration {
    let base = 25u64 << (attempts - 1).min(4);
    Duration::from_millis(base + rand::random_range(0..=base))
}

/// A statement ended by a lock conflict with a concurrent one: a deadlock
/// or a serialization failure, which running it again resolves.
fn is_lock_conflict(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    matches!(e.code(), Some(code) if *code == SqlState::T_R_DEADLOCK_DETECTED || *code == SqlState::T_R_SERIALIZATION_FAILURE)
}
