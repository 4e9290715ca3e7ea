//! The embedded SQLite backend: the default when `database.url` is unset, so
//! `tether serve` needs no service.
//!
//! One connection in WAL mode behind a mutex; every call runs on tokio's
//! blocking pool. Uuids are stored as text and times as integer milliseconds
//! since the epoch. Only one instance uses an embedded file, so lease
//! expiry is judged by this process's clock.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};
use uuid::Uuid;

use super::migrate::{latest, too_new, MIGRATIONS_SQLITE};
use super::types::{parse_capabilities, parse_json_list, to_json};
use super::*;

pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    queries: Arc<QueryCounter>,
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

fn ts(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn opt_ts(ms: Option<i64>) -> Option<DateTime<Utc>> {
    ms.map(ts)
}

fn uuid_col(row: &Row<'_>, idx: usize) -> rusqlite::Result<Uuid> {
    let text: String = row.get(idx)?;
    Uuid::parse_str(&text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e)))
}

fn opt_uuid_col(row: &Row<'_>, idx: usize) -> rusqlite::Result<Option<Uuid>> {
    let text: Option<String> = row.get(idx)?;
    text.map(|t| {
        Uuid::parse_str(&t)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e)))
    })
    .transpose()
}

fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

const USER_COLS: &str = "id, name, created_at";
const HOST_COLS: &str =
    "id, user_id, name, hostname, platform, arch, state, capabilities, dirs, last_seen_at, created_at";
const TERMINAL_COLS: &str = "id, user_id, host_id, title, dir, argv, state, pending_reason, exit_code, \
     exit_signal, error, cols, rows, run_id, created_at, started_at, ended_at, last_interacted_at";
/// The run's `exitSignal` is its terminal's (docs/REST.md, "Runs").
const RUN_COLS: &str = "id, user_id, host_id, argv, dir, state, exit_code, cpu_ms, max_rss_kb, \
     output_bytes, wall_ms, terminal_id, created_at, finished_at, \
     (SELECT t.exit_signal FROM terminals t WHERE t.id = runs.terminal_id), log_end, log_gap_bytes";

fn user_row(row: &Row<'_>) -> rusqlite::Result<User> {
    Ok(User { id: uuid_col(row, 0)?, name: row.get(1)?, created_at: ts(row.get(2)?) })
}

/// Raw host columns; text fields are parsed after the row is read.
type HostRaw = (Uuid, Uuid, String, String, String, String, String, String, String, Option<i64>, i64);

fn host_raw(row: &Row<'_>) -> rusqlite::Result<HostRaw> {
    Ok((
        uuid_col(row, 0)?,
        uuid_col(row, 1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
        row.get(8)?,
        row.get(9)?,
        row.get(10)?,
    ))
}

fn host_from_raw(raw: HostRaw) -> StoreResult<Host> {
    let (id, user_id, name, hostname, platform, arch, state, caps, dirs, last_seen, created) = raw;
    Ok(Host {
        id,
        user_id,
        name,
        hostname,
        platform,
        arch,
        state: if state == "online" { HostState::Online } else { HostState::Offline },
        capabilities: parse_capabilities(&caps)?,
        dirs: parse_json_list(&dirs)?,
        last_seen_at: opt_ts(last_seen),
        created_at: ts(created),
    })
}

struct TerminalRaw {
    terminal: Terminal,
    argv: String,
    state: String,
}

fn terminal_raw(row: &Row<'_>) -> rusqlite::Result<TerminalRaw> {
    Ok(TerminalRaw {
        terminal: Terminal {
            id: uuid_col(row, 0)?,
            user_id: uuid_col(row, 1)?,
            host_id: uuid_col(row, 2)?,
            title: row.get(3)?,
            dir: row.get(4)?,
            argv: Vec::new(),
            state: TerminalState::Pending,
            pending_reason: row.get(7)?,
            exit_code: row.get(8)?,
            exit_signal: row.get(9)?,
            error: row.get(10)?,
            cols: row.get(11)?,
            rows: row.get(12)?,
            run_id: opt_uuid_col(row, 13)?,
            created_at: ts(row.get(14)?),
            started_at: opt_ts(row.get(15)?),
            ended_at: opt_ts(row.get(16)?),
            last_interacted_at: opt_ts(row.get(17)?),
        },
        argv: row.get(5)?,
        state: row.get(6)?,
    })
}

fn terminal_from_raw(raw: TerminalRaw) -> StoreResult<Terminal> {
    let mut t = raw.terminal;
    t.argv = parse_json_list(&raw.argv)?;
    t.state = raw.state.parse()?;
    Ok(t)
}

struct RunRaw {
    run: Run,
    argv: String,
    state: String,
    usage: [Option<i64>; 4],
}

fn run_raw(row: &Row<'_>) -> rusqlite::Result<RunRaw> {
    Ok(RunRaw {
        run: Run {
            id: uuid_col(row, 0)?,
            user_id: uuid_col(row, 1)?,
            host_id: uuid_col(row, 2)?,
            argv: Vec::new(),
            dir: row.get(4)?,
            state: RunState::Queued,
            exit_code: row.get(6)?,
            exit_signal: row.get(14)?,
            usage: None,
            terminal_id: opt_uuid_col(row, 11)?,
            created_at: ts(row.get(12)?),
            finished_at: opt_ts(row.get(13)?),
            log_end: row.get(15)?,
            log_gap_bytes: row.get(16)?,
        },
        argv: row.get(3)?,
        state: row.get(5)?,
        usage: [row.get(7)?, row.get(8)?, row.get(9)?, row.get(10)?],
    })
}

fn run_from_raw(raw: RunRaw) -> StoreResult<Run> {
    let mut run = raw.run;
    run.argv = parse_json_list(&raw.argv)?;
    run.state = raw.state.parse()?;
    if let [Some(cpu_ms), Some(max_rss_kb), Some(output_bytes), Some(wall_ms)] = raw.usage {
        run.usage = Some(RunUsage { cpu_ms, max_rss_kb, output_bytes, wall_ms });
    }
    Ok(run)
}

/// The rows of `table` after a list cursor (docs/REST.md, "Lists"), with
/// the cursor's creation time in `?at` and id in `?id`. SQLite stamps
/// milliseconds, so rows created in the same one are common: their order is
/// the insertion order (rowid, which every index ends with), found from the
/// cursor's id; when that row was deleted, the page starts after every row
/// of its millisecond, as it would have after the deleted one.
fn after_cursor(table: &str, at: u8, id: u8) -> String {
    format!(
        "(?{at} IS NULL OR created_at > ?{at} OR (created_at = ?{at} AND rowid > \
         COALESCE((SELECT rowid FROM {table} WHERE id = ?{id}), 9223372036854775807)))"
    )
}

/// How long a statement waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// The page cache: 64 MiB (a negative `cache_size` counts KiB, not pages).
const SQLITE_CACHE_KIB: i64 = -65536;

impl SqliteStore {
    /// Opens (creating) the database file. A new file and the directories
    /// made for it are private (0600 / 0700; docs/SECURITY.md, "Files"),
    /// and an existing file is made private: it holds run output. SQLite
    /// gives the WAL and shared-memory files the database file's mode.
    pub fn open(path: &Path) -> StoreResult<Self> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        // Named by its setting: the path is the operator's choice.
        let file_error = |e: std::io::Error| {
            StoreError::Migration(format!("cannot create {} (database.sqlite_path): {e}", path.display()))
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(parent).map_err(|e| {
                StoreError::Migration(format!("cannot create {} (database.sqlite_path): {e}", parent.display()))
            })?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(file_error)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(file_error)?;
        for suffix in ["-wal", "-shm"] {
            let mut side = path.as_os_str().to_owned();
            side.push(suffix);
            if let Err(e) = std::fs::set_permissions(&side, std::fs::Permissions::from_mode(0o600)) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    return Err(file_error(e));
                }
            }
        }
        drop(file);
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // Switching a new file to WAL fails at once with "database is
        // locked" while another process opens it too (SQLite does not call
        // the busy handler there): wait for it like any other lock.
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        loop {
            match conn.pragma_update(None, "journal_mode", "WAL") {
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                result => break result?,
            }
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // SQLite's default page cache is 2 MB; past that, every renew tick
        // and hello reads its pages from the kernel again (at 19,000 hosts
        // a fifth of the idle CPU was that copy). Up to 64 MiB, used only as
        // the file grows (docs/BENCHMARKS.md, "one instance at scale").
        conn.pragma_update(None, "cache_size", SQLITE_CACHE_KIB)?;
        Ok(Self { conn: Arc::new(Mutex::new(conn)), queries: Arc::default() })
    }

    /// Runs `f` on the connection; every call of this backend passes here,
    /// so this is where its calls are counted.
    async fn call<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        self.queries.count();
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Corrupt(format!("sqlite task failed: {e}")))?
    }
}

/// Within `tx` (an IMMEDIATE transaction: SQLite's write lock is held
/// from the count to the insert), refuses one more terminal (or run) of
/// `user_id` on `host_id` past `caps`.
fn admit(tx: &rusqlite::Transaction<'_>, user_id: Uuid, host_id: Uuid, caps: Option<TerminalCaps>) -> StoreResult<()> {
    let Some(caps) = caps else { return Ok(()) };
    let (host_live, user_live) =
        tx.query_row(super::caps::LIVE_TERMINALS_SQL, params![host_id.to_string(), user_id.to_string()], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    Ok(caps.admit(host_live, user_live)?)
}

/// `relay_cells` joined with its switch and effective row (read by [`cell_view`]).
const CELL_VIEW_SQL: &str = "SELECT c.cell_id, c.url, c.region, c.pool_size, c.reserve_pool_size, \
       m.admit_mode, m.dead_man_trip_slots, m.generation, m.updated_at, \
       e.mode, e.cell_incarnation, e.updated_at \
     FROM relay_cells c \
     LEFT JOIN relay_cell_admit_modes m ON m.cell_id = c.cell_id \
     LEFT JOIN relay_cell_admit_effective e ON e.cell_id = c.cell_id \
     ORDER BY c.cell_id";

/// Raw cell view columns; the texts are parsed after the row is read.
struct CellViewRaw {
    cell: (String, String, String, i64, i64),
    switch: Option<(String, Option<i64>, i64, i64)>,
    effective: Option<(String, String, i64)>,
}

fn cell_view_raw(row: &Row<'_>) -> rusqlite::Result<CellViewRaw> {
    let switch = match row.get::<_, Option<String>>(5)? {
        None => None,
        Some(mode) => Some((mode, row.get(6)?, row.get(7)?, row.get(8)?)),
    };
    let effective = match row.get::<_, Option<String>>(9)? {
        None => None,
        Some(mode) => Some((mode, row.get(10)?, row.get(11)?)),
    };
    Ok(CellViewRaw { cell: (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?), switch, effective })
}

fn cell_view_from_raw(raw: CellViewRaw, read_at: DateTime<Utc>) -> StoreResult<CellView> {
    let (cell_id, url, region, pool, reserve) = raw.cell;
    let switch = raw.switch.map(|switch| cell_switch_from_raw(&cell_id, switch)).transpose()?;
    let effective = match raw.effective {
        None => None,
        Some((mode, cell_incarnation, updated_at)) => {
            Some(CellEffective { mode: cells::admit_mode(&mode)?, cell_incarnation, updated_at: ts(updated_at) })
        }
    };
    Ok(CellView {
        cell: CellRow {
            cell_id,
            url,
            region,
            pool_size: cells::pool_size(pool)?,
            reserve_pool_size: cells::pool_size(reserve)?,
        },
        switch,
        effective,
        read_at,
    })
}

fn cell_switch_from_raw(
    cell_id: &str,
    (mode, slots, generation, updated_at): (String, Option<i64>, i64, i64),
) -> StoreResult<CellSwitch> {
    Ok(CellSwitch {
        cell_id: cell_id.to_string(),
        admit_mode: cells::admit_mode(&mode)?,
        dead_man_trip_slots: cells::trip_slots(slots)?,
        generation,
        updated_at: ts(updated_at),
    })
}

fn switch_raw(row: &Row<'_>) -> rusqlite::Result<(String, Option<i64>, i64, i64)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

/// Writes a cell's effective row (`?1` cell, `?2` mode, `?3` incarnation, `?4` now).
const WRITE_EFFECTIVE_SQL: &str =
    "INSERT INTO relay_cell_admit_effective (cell_id, mode, cell_incarnation, updated_at) VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (cell_id) DO UPDATE SET mode = excluded.mode, cell_incarnation = excluded.cell_incarnation, \
       updated_at = excluded.updated_at";

fn terminal_by(conn: &Connection, clause: &str, args: &[&dyn rusqlite::ToSql]) -> StoreResult<Option<Terminal>> {
    let sql = format!("SELECT {TERMINAL_COLS} FROM terminals WHERE {clause}");
    conn.query_row(&sql, args, terminal_raw).optional()?.map(terminal_from_raw).transpose()
}

fn run_by(conn: &Connection, clause: &str, args: &[&dyn rusqlite::ToSql]) -> StoreResult<Option<Run>> {
    let sql = format!("SELECT {RUN_COLS} FROM runs WHERE {clause}");
    conn.query_row(&sql, args, run_raw).optional()?.map(run_from_raw).transpose()
}

const TOKEN_COLS: &str =
    "id, user_id, name, scope, host_id, terminal_id, created_at, expires_at, last_used_at, revoked_at";
/// The token of a hash, only while usable (`?1` hash, `?2` now).
const USABLE_TOKEN_BY_HASH: &str = "token_hash = ?1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?2)";

fn token_raw(row: &Row<'_>) -> rusqlite::Result<(ApiToken, String)> {
    Ok((
        ApiToken {
            id: uuid_col(row, 0)?,
            user_id: uuid_col(row, 1)?,
            name: row.get(2)?,
            scope: TokenScope::Full,
            host_id: opt_uuid_col(row, 4)?,
            terminal_id: opt_uuid_col(row, 5)?,
            created_at: ts(row.get(6)?),
            expires_at: opt_ts(row.get(7)?),
            last_used_at: opt_ts(row.get(8)?),
            revoked_at: opt_ts(row.get(9)?),
        },
        row.get(3)?,
    ))
}

fn token_from_raw((mut token, scope): (ApiToken, String)) -> StoreResult<ApiToken> {
    token.scope = scope.parse()?;
    Ok(token)
}

/// What a hello's database check reads of a host: its user and its assignment.
fn host_admission(c: &Connection, host_id: Uuid) -> StoreResult<Option<HostAdmission>> {
    let row = c
        .prepare_cached(
            "SELECT h.user_id, a.cell_id, a.epoch FROM hosts h \
             LEFT JOIN relay_assignments a ON a.host_id = h.id WHERE h.id = ?1",
        )?
        .query_row([host_id.to_string()], |r| {
            Ok((uuid_col(r, 0)?, r.get::<_, Option<String>>(1)?, r.get::<_, Option<i64>>(2)?))
        })
        .optional()?;
    Ok(row.map(|(user_id, cell, epoch)| HostAdmission { user_id, assignment: cell.zip(epoch) }))
}

/// The usable token of a hash, its `last_used_at` stamped when due
/// ([`Store::token_by_hash`]).
fn usable_token(c: &Connection, hash: &str, now: DateTime<Utc>) -> StoreResult<Option<FoundToken>> {
    let Some(token) = token_by(c, USABLE_TOKEN_BY_HASH, &[&hash, &now_ms()])? else { return Ok(None) };
    let now = now.timestamp_millis();
    c.prepare_cached(
        "UPDATE api_tokens SET last_used_at = ?1 \
         WHERE id = ?2 AND (last_used_at IS NULL OR last_used_at <= ?1 - ?3)",
    )?
    .execute(params![now, token.id.to_string(), ttl_ms(LAST_USED_EVERY)])?;
    let user = c
        .query_row(&format!("SELECT {USER_COLS} FROM users WHERE id = ?1"), [token.user_id.to_string()], user_row)
        .optional()?;
    let Some(user) = user else { return Ok(None) };
    let bound_host = token.host_id.map(|host_id| host_admission(c, host_id)).transpose()?.flatten();
    Ok(Some(FoundToken { user, token, bound_host }))
}

fn token_by(conn: &Connection, clause: &str, args: &[&dyn rusqlite::ToSql]) -> StoreResult<Option<ApiToken>> {
    let sql = format!("SELECT {TOKEN_COLS} FROM api_tokens WHERE {clause}");
    conn.query_row(&sql, args, token_raw).optional()?.map(token_from_raw).transpose()
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn ping(&self) -> StoreResult<()> {
        self.call(|c| Ok(c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)).map(|_| ())?)).await
    }

    async fn migrate(&self) -> StoreResult<usize> {
        self.call(|c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS schema_migrations (
                    version integer PRIMARY KEY, name text NOT NULL, applied_at integer NOT NULL)",
            )?;
            let current: i64 =
                tx.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| r.get(0))?;
            let known = latest(MIGRATIONS_SQLITE);
            if current > known {
                return Err(too_new(current, known));
            }
            let mut applied = 0;
            for m in MIGRATIONS_SQLITE.iter().filter(|m| m.version > current) {
                tx.execute_batch(m.sql)
                    .map_err(|e| StoreError::Migration(format!("{:04}_{}: {e}", m.version, m.name)))?;
                tx.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
                    params![m.version, m.name, now_ms()],
                )?;
                applied += 1;
            }
            tx.commit()?;
            Ok(applied)
        })
        .await
    }

    async fn schema_version(&self) -> StoreResult<i64> {
        self.call(|c| {
            let exists: bool = c.query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations')",
                [],
                |r| r.get(0),
            )?;
            if !exists {
                return Ok(0);
            }
            Ok(c.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| r.get(0))?)
        })
        .await
    }

    fn pool_status(&self) -> PoolStatus {
        let available = usize::from(self.conn.try_lock().is_ok());
        PoolStatus { size: 1, available, waiting: 0, max_size: 1 }
    }

    fn resize_pool(&self, _max_size: usize) {}

    fn queries_total(&self) -> u64 {
        self.queries.total()
    }

    async fn ensure_user(&self, name: &str) -> StoreResult<User> {
        let name = name.to_string();
        self.call(move |c| {
            c.execute(
                "INSERT INTO users (id, name, created_at) VALUES (?1, ?2, ?3) ON CONFLICT (name) DO NOTHING",
                params![Uuid::new_v4().to_string(), name, now_ms()],
            )?;
            Ok(c.query_row(&format!("SELECT {USER_COLS} FROM users WHERE name = ?1"), [name], user_row)?)
        })
        .await
    }

    async fn user_by_name(&self, name: &str) -> StoreResult<Option<User>> {
        let name = name.to_string();
        self.call(move |c| {
            Ok(c.query_row(&format!("SELECT {USER_COLS} FROM users WHERE name = ?1"), [name], user_row).optional()?)
        })
        .await
    }

    async fn insert_token(&self, new: &NewToken) -> StoreResult<ApiToken> {
        let new = new.clone();
        self.call(move |c| {
            let id = Uuid::new_v4();
            c.execute(
                "INSERT INTO api_tokens (id, token_hash, user_id, name, scope, host_id, terminal_id, created_at, \
                 expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    id.to_string(),
                    new.token_hash,
                    new.user_id.to_string(),
                    new.name,
                    new.scope.as_str(),
                    new.host_id.map(|h| h.to_string()),
                    new.terminal_id.map(|t| t.to_string()),
                    now_ms(),
                    new.expires_at.map(|e| e.timestamp_millis()),
                ],
            )?;
            token_by(c, "id = ?1", &[&id.to_string()])?
                .ok_or_else(|| StoreError::Corrupt("inserted token not found".into()))
        })
        .await
    }

    async fn tokens_by_hash(
        &self,
        token_hashes: &[String],
        now: DateTime<Utc>,
    ) -> StoreResult<HashMap<String, FoundToken>> {
        let hashes = token_hashes.to_vec();
        self.call(move |c| {
            let mut found = HashMap::new();
            for hash in hashes {
                if let Some(token) = usable_token(c, &hash, now)? {
                    found.insert(hash, token);
                }
            }
            Ok(found)
        })
        .await
    }

    async fn token_by_id(&self, id: Uuid) -> StoreResult<Option<ApiToken>> {
        self.call(move |c| token_by(c, "id = ?1", &[&id.to_string()])).await
    }

    async fn list_tokens(&self, user_id: Uuid) -> StoreResult<Vec<ApiToken>> {
        self.call(move |c| {
            let sql = format!("SELECT {TOKEN_COLS} FROM api_tokens WHERE user_id = ?1 ORDER BY created_at, rowid");
            let mut stmt = c.prepare(&sql)?;
            let raws = stmt.query_map([user_id.to_string()], token_raw)?.collect::<Result<Vec<_>, _>>()?;
            raws.into_iter().map(token_from_raw).collect()
        })
        .await
    }

    async fn revoke_token(&self, user_id: Option<Uuid>, id: Uuid) -> StoreResult<Option<Revocation>> {
        self.call(move |c| {
            // One connection: nothing comes between the two statements.
            let (id, user_id) = (id.to_string(), user_id.map(|u| u.to_string()));
            let revoked = c
                .query_row(
                    "UPDATE api_tokens SET revoked_at = ?1 \
                     WHERE id = ?2 AND (?3 IS NULL OR user_id = ?3) AND revoked_at IS NULL RETURNING user_id",
                    params![now_ms(), id, user_id],
                    |row| uuid_col(row, 0),
                )
                .optional()?;
            if let Some(user_id) = revoked {
                return Ok(Some(Revocation::Now { user_id }));
            }
            let found = c
                .query_row(
                    "SELECT 1 FROM api_tokens WHERE id = ?1 AND (?2 IS NULL OR user_id = ?2)",
                    params![id, user_id],
                    |_| Ok(()),
                )
                .optional()?;
            Ok(found.map(|()| Revocation::Earlier))
        })
        .await
    }

    async fn bind_token_host(&self, id: Uuid, host_id: Uuid) -> StoreResult<Option<Uuid>> {
        self.call(move |c| {
            c.execute(
                "UPDATE api_tokens SET host_id = ?1 WHERE id = ?2 AND host_id IS NULL AND NOT EXISTS ( \
                   SELECT 1 FROM api_tokens o WHERE o.host_id = ?1 AND o.id <> ?2 \
                   AND o.revoked_at IS NULL AND (o.expires_at IS NULL OR o.expires_at > ?3))",
                params![host_id.to_string(), id.to_string(), now_ms()],
            )?;
            Ok(token_by(c, "id = ?1", &[&id.to_string()])?.and_then(|t| t.host_id))
        })
        .await
    }

    async fn ended_tokens(&self, since: Option<DateTime<Utc>>, fresh: &[Uuid]) -> StoreResult<EndedTokens> {
        let since = since.map(|t| t.timestamp_millis());
        let fresh = to_json(&fresh.iter().map(Uuid::to_string).collect::<Vec<_>>());
        self.call(move |c| {
            let now = now_ms();
            let mut stmt = c.prepare_cached(
                "WITH changed(id) AS ( \
                   SELECT token_id FROM api_token_ends WHERE ended_at > ?1 \
                   UNION SELECT id FROM api_tokens WHERE expires_at > ?1 AND expires_at <= ?2 \
                   UNION SELECT value FROM json_each(?3)) \
                 SELECT c.id FROM changed c WHERE NOT EXISTS ( \
                   SELECT 1 FROM api_tokens t WHERE t.id = c.id AND t.revoked_at IS NULL \
                   AND (t.expires_at IS NULL OR t.expires_at > ?2))",
            )?;
            let ended = stmt.query_map(params![since, now, fresh], |r| uuid_col(r, 0))?;
            Ok(EndedTokens { ended: ended.collect::<Result<_, _>>()?, checked_at: ts(now) })
        })
        .await
    }

    async fn delete_token_ends_before(&self, before: DateTime<Utc>) -> StoreResult<u64> {
        let before = before.timestamp_millis();
        self.call(move |c| Ok(c.execute("DELETE FROM api_token_ends WHERE ended_at < ?1", [before])? as u64)).await
    }

    async fn register_host(&self, new: &NewHost, daemon_token: Option<Uuid>) -> StoreResult<Registered> {
        let new = new.clone();
        self.call(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let (user_id, token) = (new.user_id.to_string(), daemon_token.map(|t| t.to_string()));
            if let Some(token) = &token {
                let bound: Option<String> = tx
                    .query_row("SELECT host_id FROM api_tokens WHERE id = ?1", [token], |r| r.get(0))
                    .optional()?
                    .flatten();
                if let Some(bound) = bound {
                    let same = tx
                        .query_row(
                            "SELECT 1 FROM hosts WHERE id = ?1 AND user_id = ?2 AND hostname = ?3",
                            params![bound, user_id, new.hostname],
                            |_| Ok(()),
                        )
                        .optional()?
                        .is_some();
                    if !same {
                        return Ok(Registered::TokenBoundElsewhere);
                    }
                }
            }
            tx.execute(
                "INSERT INTO hosts (id, user_id, name, hostname, platform, arch, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
                 ON CONFLICT (user_id, hostname) DO UPDATE SET \
                   name = excluded.name, platform = excluded.platform, arch = excluded.arch",
                params![Uuid::new_v4().to_string(), user_id, new.name, new.hostname, new.platform, new.arch, now_ms()],
            )?;
            let raw = tx.query_row(
                &format!("SELECT {HOST_COLS} FROM hosts WHERE user_id = ?1 AND hostname = ?2"),
                params![user_id, new.hostname],
                host_raw,
            )?;
            let host = host_from_raw(raw)?;
            if let Some(token) = &token {
                let taken = tx
                    .query_row(
                        "SELECT 1 FROM api_tokens WHERE host_id = ?1 AND id <> ?2 AND revoked_at IS NULL \
                         AND (expires_at IS NULL OR expires_at > ?3)",
                        params![host.id.to_string(), token, now_ms()],
                        |_| Ok(()),
                    )
                    .optional()?
                    .is_some();
                if taken {
                    return Ok(Registered::HostHasToken);
                }
                tx.execute(
                    "UPDATE api_tokens SET host_id = ?2 WHERE id = ?1 AND host_id IS NULL",
                    params![token, host.id.to_string()],
                )?;
            }
            tx.commit()?;
            Ok(Registered::Host(host))
        })
        .await
    }

    async fn list_hosts(&self, user_id: Uuid) -> StoreResult<Vec<Host>> {
        self.call(move |c| {
            let mut stmt =
                c.prepare(&format!("SELECT {HOST_COLS} FROM hosts WHERE user_id = ?1 ORDER BY created_at, rowid"))?;
            let raws = stmt.query_map([user_id.to_string()], host_raw)?.collect::<Result<Vec<_>, _>>()?;
            raws.into_iter().map(host_from_raw).collect()
        })
        .await
    }

    async fn page_hosts(
        &self,
        user_id: Uuid,
        online: Option<bool>,
        page: &PageAfter,
    ) -> StoreResult<Vec<(Host, bool)>> {
        let page = *page;
        self.call(move |c| {
            let (after_at, after_id) = page.after.map(|(at, id)| (at.timestamp_millis(), id.to_string())).unzip();
            let mut stmt = c.prepare_cached(&format!(
                "SELECT * FROM (SELECT {HOST_COLS}, EXISTS (SELECT 1 FROM leases l \
                   WHERE l.key = 'host:' || h.id AND l.expires_at > ?2) AS live, h.rowid AS seq \
                 FROM hosts h WHERE user_id = ?1 \
                 AND {}) \
                 WHERE (?5 IS NULL OR live = ?5) ORDER BY created_at, seq LIMIT ?6",
                after_cursor("hosts", 3, 4)
            ))?;
            let raws = stmt
                .query_map(params![user_id.to_string(), now_ms(), after_at, after_id, online, page.sql_limit()], |r| {
                    Ok((host_raw(r)?, r.get::<_, bool>("live")?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            raws.into_iter().map(|(raw, live)| Ok((host_from_raw(raw)?, live))).collect()
        })
        .await
    }

    async fn get_host(&self, user_id: Uuid, host_id: Uuid) -> StoreResult<Option<Host>> {
        self.call(move |c| {
            c.query_row(
                &format!("SELECT {HOST_COLS} FROM hosts WHERE id = ?1 AND user_id = ?2"),
                [host_id.to_string(), user_id.to_string()],
                host_raw,
            )
            .optional()?
            .map(host_from_raw)
            .transpose()
        })
        .await
    }

    async fn host_by_id(&self, host_id: Uuid) -> StoreResult<Option<Host>> {
        self.call(move |c| {
            c.query_row(&format!("SELECT {HOST_COLS} FROM hosts WHERE id = ?1"), [host_id.to_string()], host_raw)
                .optional()?
                .map(host_from_raw)
                .transpose()
        })
        .await
    }

    async fn delete_host(&self, user_id: Uuid, host_id: Uuid) -> StoreResult<bool> {
        self.call(move |c| {
            let tx = c.transaction()?;
            let exists = tx
                .query_row(
                    "SELECT 1 FROM hosts WHERE id = ?1 AND user_id = ?2",
                    [host_id.to_string(), user_id.to_string()],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
            if exists {
                // Terminals reference runs; remove them first so no cascade order matters.
                tx.execute("DELETE FROM terminals WHERE host_id = ?1", [host_id.to_string()])?;
                tx.execute("DELETE FROM runs WHERE host_id = ?1", [host_id.to_string()])?;
                tx.execute("DELETE FROM relay_assignments WHERE host_id = ?1", [host_id.to_string()])?;
                // Its daemon tokens may register a machine again (docs/REST.md).
                tx.execute("UPDATE api_tokens SET host_id = NULL WHERE host_id = ?1", [host_id.to_string()])?;
                tx.execute("DELETE FROM hosts WHERE id = ?1", [host_id.to_string()])?;
            }
            tx.commit()?;
            Ok(exists)
        })
        .await
    }

    async fn set_host_dirs(&self, host_id: Uuid, dirs: &[String]) -> StoreResult<()> {
        let dirs = to_json(&dirs);
        self.call(move |c| {
            c.execute("UPDATE hosts SET dirs = ?2 WHERE id = ?1", params![host_id.to_string(), dirs])?;
            Ok(())
        })
        .await
    }

    async fn mark_hosts_offline_unless_leased(&self, host_ids: &[Uuid]) -> StoreResult<Vec<Uuid>> {
        if host_ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = to_json(&host_ids.iter().map(Uuid::to_string).collect::<Vec<_>>());
        self.call(move |c| {
            let mut stmt = c.prepare_cached(
                "UPDATE hosts SET state = 'offline', last_seen_at = ?2 \
                 WHERE id IN (SELECT value FROM json_each(?1)) AND NOT EXISTS ( \
                   SELECT 1 FROM leases l WHERE l.key = 'host:' || hosts.id AND l.expires_at > ?2) \
                 RETURNING id",
            )?;
            let marked = stmt.query_map(params![ids, now_ms()], |r| uuid_col(r, 0))?.collect::<Result<_, _>>()?;
            Ok(marked)
        })
        .await
    }

    async fn insert_terminal(&self, new: &NewTerminal, caps: Option<TerminalCaps>) -> StoreResult<Terminal> {
        let new = new.clone();
        self.call(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            admit(&tx, new.user_id, new.host_id, caps)?;
            let id = Uuid::new_v4();
            tx.execute(
                "INSERT INTO terminals (id, user_id, host_id, title, dir, argv, state, pending_reason, cols, rows, \
                 run_id, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', ?7, ?8, ?9, ?10, ?11)",
                params![
                    id.to_string(),
                    new.user_id.to_string(),
                    new.host_id.to_string(),
                    new.title,
                    new.dir,
                    to_json(&new.argv),
                    PENDING_HOST_OFFLINE,
                    new.cols,
                    new.rows,
                    new.run_id.map(|r| r.to_string()),
                    now_ms()
                ],
            )?;
            let terminal = terminal_by(&tx, "id = ?1", &[&id.to_string()])?
                .ok_or_else(|| StoreError::Corrupt("inserted terminal vanished".into()))?;
            tx.commit()?;
            Ok(terminal)
        })
        .await
    }

    async fn get_terminal(&self, user_id: Uuid, id: Uuid) -> StoreResult<Option<Terminal>> {
        self.call(move |c| terminal_by(c, "id = ?1 AND user_id = ?2", &[&id.to_string(), &user_id.to_string()])).await
    }

    async fn terminal_by_id(&self, id: Uuid) -> StoreResult<Option<Terminal>> {
        self.call(move |c| terminal_by(c, "id = ?1", &[&id.to_string()])).await
    }

    async fn page_terminals(
        &self,
        user_id: Uuid,
        filter: &TerminalFilter,
        page: &PageAfter,
    ) -> StoreResult<Vec<Terminal>> {
        let filter = filter.clone();
        let page = *page;
        self.call(move |c| {
            let (after_at, after_id) = page.after.map(|(at, id)| (at.timestamp_millis(), id.to_string())).unzip();
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {TERMINAL_COLS} FROM terminals WHERE user_id = ?1 \
                 AND (?2 IS NULL OR host_id = ?2) AND (?3 IS NULL OR state = ?3) \
                 AND {} ORDER BY created_at, rowid LIMIT ?6",
                after_cursor("terminals", 4, 5)
            ))?;
            let raws = stmt
                .query_map(
                    params![
                        user_id.to_string(),
                        filter.host_id.map(|h| h.to_string()),
                        filter.state.map(|s| s.as_str()),
                        after_at,
                        after_id,
                        page.sql_limit()
                    ],
                    terminal_raw,
                )?
                .collect::<Result<Vec<_>, _>>()?;
            raws.into_iter().map(terminal_from_raw).collect()
        })
        .await
    }

    async fn delete_terminal(&self, user_id: Uuid, id: Uuid) -> StoreResult<DeleteOutcome> {
        self.call(move |c| {
            let deleted = c.execute(
                "DELETE FROM terminals WHERE id = ?1 AND user_id = ?2 AND state NOT IN ('launching', 'running')",
                [id.to_string(), user_id.to_string()],
            )?;
            if deleted > 0 {
                return Ok(DeleteOutcome::Deleted);
            }
            let exists = c
                .query_row(
                    "SELECT 1 FROM terminals WHERE id = ?1 AND user_id = ?2",
                    [id.to_string(), user_id.to_string()],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
            Ok(if exists { DeleteOutcome::Conflict } else { DeleteOutcome::NotFound })
        })
        .await
    }

    async fn claim_launch(&self, host_id: Uuid, id: Uuid) -> StoreResult<bool> {
        self.call(move |c| {
            Ok(c.execute(
                "UPDATE terminals SET state = 'launching', pending_reason = NULL, launched_at = ?3 \
                 WHERE id = ?1 AND host_id = ?2 AND state = 'pending'",
                params![id.to_string(), host_id.to_string(), now_ms()],
            )? == 1)
        })
        .await
    }

    async fn park_terminal(&self, host_id: Uuid, id: Uuid, reason: &str) -> StoreResult<bool> {
        let reason = reason.to_string();
        self.call(move |c| {
            Ok(c.execute(
                "UPDATE terminals SET state = 'pending', pending_reason = ?3, launched_at = NULL \
                 WHERE id = ?1 AND host_id = ?2 AND state = 'launching'",
                params![id.to_string(), host_id.to_string(), reason],
            )? == 1)
        })
        .await
    }

    async fn mark_started(&self, host_id: Uuid, id: Uuid) -> StoreResult<bool> {
        self.call(move |c| {
            Ok(c.execute(
                "UPDATE terminals SET state = 'running', pending_reason = NULL, started_at = ?3 \
                 WHERE id = ?1 AND host_id = ?2 AND state IN ('pending', 'launching')",
                params![id.to_string(), host_id.to_string(), now_ms()],
            )? == 1)
        })
        .await
    }

    async fn mark_spawn_failed(&self, host_id: Uuid, id: Uuid, message: &str) -> StoreResult<bool> {
        let message = message.to_string();
        self.call(move |c| {
            Ok(c.execute(
                "UPDATE terminals SET state = 'error', error = ?3, pending_reason = NULL, ended_at = ?4 \
                 WHERE id = ?1 AND host_id = ?2 AND state IN ('pending', 'launching')",
                params![id.to_string(), host_id.to_string(), message, now_ms()],
            )? == 1)
        })
        .await
    }

    async fn mark_exited(&self, host_id: Uuid, id: Uuid, exit: ExitStatus) -> StoreResult<bool> {
        self.call(move |c| {
            Ok(c.execute(
                "UPDATE terminals SET state = 'exited', exit_code = ?3, exit_signal = ?4, pending_reason = NULL, \
                 ended_at = ?5 WHERE id = ?1 AND host_id = ?2 AND state IN ('pending', 'launching', 'running')",
                params![id.to_string(), host_id.to_string(), exit.code, exit.signal, now_ms()],
            )? == 1)
        })
        .await
    }

    async fn host_hello(&self, hello: &HostHello<'_>) -> StoreResult<Vec<HelloTerminal>> {
        let host_id = hello.host_id.to_string();
        let key = host_lease_key(hello.host_id);
        let holder = hello.holder.encode();
        let ttl = ttl_ms(hello.lease_ttl);
        let caps = to_json(hello.capabilities);
        let dirs = to_json(&hello.dirs);
        let running = to_json(&hello.running.iter().map(Uuid::to_string).collect::<Vec<_>>());
        // One call, one transaction: the embedded database has no round
        // trips to save, only the lock to take once.
        self.call(move |c| {
            let now = now_ms();
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT INTO leases (key, holder, expires_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at",
                params![key, holder, now + ttl],
            )?;
            tx.execute(
                "UPDATE hosts SET state = 'online', capabilities = ?2, dirs = ?3, last_seen_at = ?4 WHERE id = ?1",
                params![host_id, caps, dirs, now],
            )?;
            tx.execute(
                "UPDATE runs SET state = 'failed', exit_code = NULL, finished_at = ?3 \
                 WHERE state IN ('queued', 'dispatched', 'running') AND id IN ( \
                   SELECT run_id FROM terminals WHERE host_id = ?1 AND state IN ('launching', 'running') \
                   AND id NOT IN (SELECT value FROM json_each(?2)))",
                params![host_id, running, now],
            )?;
            tx.execute(
                "UPDATE terminals SET state = 'exited', ended_at = ?3 WHERE host_id = ?1 \
                 AND state IN ('launching', 'running') AND id NOT IN (SELECT value FROM json_each(?2))",
                params![host_id, running, now],
            )?;
            tx.execute(
                &format!(
                    "UPDATE terminals SET state = 'running', started_at = COALESCE(started_at, ?3), ended_at = NULL \
                 WHERE host_id = ?1 AND (state = 'launching' OR (state = 'exited' AND {REVIVABLE})) \
                 AND id IN (SELECT value FROM json_each(?2))"
                ),
                params![host_id, running, now],
            )?;
            let rows = {
                let mut stmt = tx.prepare_cached(&format!(
                    "SELECT {TERMINAL_COLS}, \
                       (SELECT r.log_end FROM runs r WHERE r.id = terminals.run_id \
                        AND r.state IN ('queued', 'dispatched', 'running')) \
                     FROM terminals WHERE host_id = ?1 AND state IN ('pending', 'launching', 'running') \
                     ORDER BY created_at, rowid"
                ))?;
                let rows =
                    stmt.query_map([&host_id], |row| Ok((terminal_raw(row)?, row.get::<_, Option<i64>>(18)?)))?;
                rows.collect::<Result<Vec<_>, _>>()?
            };
            tx.commit()?;
            rows.into_iter()
                .map(|(raw, log_end)| {
                    Ok(HelloTerminal { terminal: terminal_from_raw(raw)?, unfinished_run_log_end: log_end })
                })
                .collect()
        })
        .await
    }

    async fn parked_terminals(&self, host_id: Uuid) -> StoreResult<Vec<Terminal>> {
        self.call(move |c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {TERMINAL_COLS} FROM terminals WHERE host_id = ?1 AND state = 'pending' ORDER BY created_at, rowid"
            ))?;
            let raws = stmt.query_map([host_id.to_string()], terminal_raw)?.collect::<Result<Vec<_>, _>>()?;
            raws.into_iter().map(terminal_from_raw).collect()
        })
        .await
    }

    async fn parked_on_online_hosts(&self, limit: usize) -> StoreResult<Vec<Terminal>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.call(move |c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {TERMINAL_COLS} FROM terminals WHERE state = 'pending' \
                 AND host_id IN (SELECT id FROM hosts WHERE state = 'online') ORDER BY created_at, rowid LIMIT ?1"
            ))?;
            let raws = stmt.query_map([limit], terminal_raw)?.collect::<Result<Vec<_>, _>>()?;
            raws.into_iter().map(terminal_from_raw).collect()
        })
        .await
    }

    async fn mark_stale_hosts_offline(&self, stale: Duration) -> StoreResult<Vec<Uuid>> {
        self.call(move |c| {
            let now = now_ms();
            let mut stmt = c.prepare(
                "UPDATE hosts SET state = 'offline' WHERE state = 'online' AND ( \
                   last_seen_at IS NULL OR last_seen_at < ?1 \
                   OR NOT EXISTS (SELECT 1 FROM leases l WHERE l.key = 'host:' || hosts.id AND l.expires_at > ?2)) \
                 RETURNING id",
            )?;
            let ids: Vec<String> =
                stmt.query_map(params![now - ttl_ms(stale), now], |r| r.get(0))?.collect::<Result<_, _>>()?;
            ids.iter().map(|s| Uuid::parse_str(s).map_err(|e| StoreError::Corrupt(format!("host id: {e}")))).collect()
        })
        .await
    }

    async fn mark_lost_runs(&self, after: Duration) -> StoreResult<Vec<Uuid>> {
        self.call(move |c| {
            let now = now_ms();
            let mut stmt = c.prepare(
                "UPDATE runs SET state = 'lost', finished_at = ?2 \
                 WHERE state IN ('queued', 'dispatched', 'running') AND created_at < ?1 AND host_id IN ( \
                   SELECT h.id FROM hosts h WHERE COALESCE(h.last_seen_at, h.created_at) < ?1 \
                   AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.key = 'host:' || h.id AND l.expires_at > ?2)) \
                 RETURNING id",
            )?;
            let ids: Vec<String> =
                stmt.query_map(params![now - ttl_ms(after), now], |r| r.get(0))?.collect::<Result<_, _>>()?;
            ids.iter().map(|s| Uuid::parse_str(s).map_err(|e| StoreError::Corrupt(format!("run id: {e}")))).collect()
        })
        .await
    }

    async fn fail_stuck_launches(&self, older_than: Duration) -> StoreResult<Vec<Uuid>> {
        self.call(move |c| {
            let now = now_ms();
            let mut stmt = c.prepare(
                "UPDATE terminals SET state = 'error', error = 'launch not acknowledged', ended_at = ?2 \
                 WHERE state = 'launching' AND launched_at < ?1 RETURNING id",
            )?;
            let ids: Vec<String> =
                stmt.query_map(params![now - ttl_ms(older_than), now], |r| r.get(0))?.collect::<Result<_, _>>()?;
            ids.iter()
                .map(|s| Uuid::parse_str(s).map_err(|e| StoreError::Corrupt(format!("terminal id: {e}"))))
                .collect()
        })
        .await
    }

    async fn put_snapshot(&self, host_id: Uuid, terminal_id: Uuid, snapshot: &TerminalSnapshot) -> StoreResult<()> {
        let snapshot = snapshot.clone();
        self.call(move |c| {
            c.execute(
                "INSERT INTO terminal_snapshots (terminal_id, data, cols, rows, created_at) \
                 SELECT id, ?3, ?4, ?5, ?6 FROM terminals WHERE id = ?1 AND host_id = ?2 \
                 ON CONFLICT (terminal_id) DO UPDATE SET data = excluded.data, cols = excluded.cols, \
                   rows = excluded.rows, created_at = excluded.created_at",
                params![
                    terminal_id.to_string(),
                    host_id.to_string(),
                    snapshot.data,
                    snapshot.cols,
                    snapshot.rows,
                    now_ms()
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn get_snapshot(&self, terminal_id: Uuid) -> StoreResult<Option<TerminalSnapshot>> {
        self.call(move |c| {
            Ok(c.query_row(
                "SELECT data, cols, rows FROM terminal_snapshots WHERE terminal_id = ?1",
                [terminal_id.to_string()],
                |r| Ok(TerminalSnapshot { data: r.get(0)?, cols: r.get(1)?, rows: r.get(2)? }),
            )
            .optional()?)
        })
        .await
    }

    async fn set_terminal_size(&self, host_id: Uuid, id: Uuid, cols: u16, rows: u16) -> StoreResult<()> {
        self.call(move |c| {
            c.execute(
                "UPDATE terminals SET cols = ?3, rows = ?4 WHERE id = ?1 AND host_id = ?2",
                params![id.to_string(), host_id.to_string(), cols, rows],
            )?;
            Ok(())
        })
        .await
    }

    async fn stamp_interaction(&self, id: Uuid, now: DateTime<Utc>) -> StoreResult<Option<DateTime<Utc>>> {
        let (id, now) = (id.to_string(), now.timestamp_millis());
        self.call(move |c| {
            c.execute(
                "UPDATE terminals SET last_interacted_at = ?2 WHERE id = ?1 \
                 AND (last_interacted_at IS NULL OR last_interacted_at <= ?2 - 60000)",
                params![id, now],
            )?;
            let stored: Option<Option<i64>> = c
                .query_row("SELECT last_interacted_at FROM terminals WHERE id = ?1", params![id], |r| r.get(0))
                .optional()?;
            Ok(opt_ts(stored.flatten()))
        })
        .await
    }

    async fn insert_run(&self, new: &NewRun, caps: Option<TerminalCaps>) -> StoreResult<Run> {
        let new = new.clone();
        self.call(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            admit(&tx, new.user_id, new.host_id, caps)?;
            let id = Uuid::new_v4();
            tx.execute(
                "INSERT INTO runs (id, user_id, host_id, argv, dir, state, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6)",
                params![
                    id.to_string(),
                    new.user_id.to_string(),
                    new.host_id.to_string(),
                    to_json(&new.argv),
                    new.dir,
                    now_ms()
                ],
            )?;
            let run = run_by(&tx, "id = ?1", &[&id.to_string()])?
                .ok_or_else(|| StoreError::Corrupt("inserted run vanished".into()))?;
            tx.commit()?;
            Ok(run)
        })
        .await
    }

    async fn get_run(&self, user_id: Uuid, id: Uuid) -> StoreResult<Option<Run>> {
        self.call(move |c| run_by(c, "id = ?1 AND user_id = ?2", &[&id.to_string(), &user_id.to_string()])).await
    }

    async fn list_runs(&self, user_id: Uuid, filter: &RunFilter, page: &PageAfter) -> StoreResult<Vec<Run>> {
        let (filter, page) = (*filter, *page);
        self.call(move |c| {
            let (after_at, after_id) = page.after.map(|(at, id)| (at.timestamp_millis(), id.to_string())).unzip();
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {RUN_COLS} FROM runs WHERE user_id = ?1 AND (?2 IS NULL OR host_id = ?2) \
                 AND (?3 IS NULL OR state = ?3) AND {} ORDER BY created_at, rowid LIMIT ?6",
                after_cursor("runs", 4, 5)
            ))?;
            let raws = stmt
                .query_map(
                    params![
                        user_id.to_string(),
                        filter.host_id.map(|h| h.to_string()),
                        filter.state.map(|s| s.as_str()),
                        after_at,
                        after_id,
                        page.sql_limit()
                    ],
                    run_raw,
                )?
                .collect::<Result<Vec<_>, _>>()?;
            raws.into_iter().map(run_from_raw).collect()
        })
        .await
    }

    async fn queued_run_hosts(&self) -> StoreResult<Vec<Uuid>> {
        self.call(|c| {
            let mut stmt = c.prepare_cached("SELECT DISTINCT host_id FROM runs WHERE state = 'queued'")?;
            let hosts = stmt.query_map([], |r| uuid_col(r, 0))?;
            hosts.collect::<Result<_, _>>().map_err(Into::into)
        })
        .await
    }

    async fn claim_queued_runs(&self, online_hosts: &[Uuid], limit: usize) -> StoreResult<Vec<Run>> {
        if online_hosts.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let hosts = to_json(&online_hosts.iter().map(Uuid::to_string).collect::<Vec<_>>());
        self.call(move |c| {
            // An IMMEDIATE transaction takes SQLite's write lock up front: the
            // embedded analogue of FOR UPDATE SKIP LOCKED.
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let ids: Vec<String> = {
                let mut stmt = tx.prepare(
                    "UPDATE runs SET state = 'dispatched', dispatched_at = ?3 WHERE id IN ( \
                       SELECT id FROM runs WHERE state = 'queued' \
                       AND host_id IN (SELECT value FROM json_each(?1)) ORDER BY created_at, rowid LIMIT ?2) \
                     RETURNING id",
                )?;
                let rows = stmt.query_map(params![hosts, limit as i64, now_ms()], |r| r.get(0))?;
                rows.collect::<Result<_, _>>()?
            };
            let mut runs = Vec::with_capacity(ids.len());
            for id in &ids {
                if let Some(run) = run_by(&tx, "id = ?1", &[id])? {
                    runs.push(run);
                }
            }
            tx.commit()?;
            runs.sort_by_key(|r| r.created_at);
            Ok(runs)
        })
        .await
    }

    async fn set_run_terminal(&self, run_id: Uuid, terminal_id: Uuid) -> StoreResult<()> {
        self.call(move |c| {
            c.execute("UPDATE runs SET terminal_id = ?2 WHERE id = ?1", [run_id.to_string(), terminal_id.to_string()])?;
            Ok(())
        })
        .await
    }

    async fn mark_run_running(&self, run_id: Uuid) -> StoreResult<bool> {
        self.call(move |c| {
            Ok(c.execute(
                "UPDATE runs SET state = 'running' WHERE id = ?1 AND state = 'dispatched'",
                [run_id.to_string()],
            )? == 1)
        })
        .await
    }

    async fn finish_run(&self, run_id: Uuid, state: RunState, exit_code: Option<i32>) -> StoreResult<bool> {
        self.call(move |c| {
            Ok(c.execute(
                "UPDATE runs SET state = ?2, exit_code = ?3, finished_at = ?4 \
                 WHERE id = ?1 AND state IN ('queued', 'dispatched', 'running')",
                params![run_id.to_string(), state.as_str(), exit_code, now_ms()],
            )? == 1)
        })
        .await
    }

    async fn set_run_usage(&self, run_id: Uuid, usage: &RunUsage) -> StoreResult<()> {
        let u = *usage;
        self.call(move |c| {
            c.execute(
                "UPDATE runs SET cpu_ms = ?2, max_rss_kb = ?3, output_bytes = ?4, wall_ms = ?5 WHERE id = ?1",
                params![run_id.to_string(), u.cpu_ms, u.max_rss_kb, u.output_bytes, u.wall_ms],
            )?;
            Ok(())
        })
        .await
    }

    async fn append_run_log(&self, run_id: Uuid, offset: u64, data: &[u8], max_bytes: usize) -> StoreResult<()> {
        let data = data.to_vec();
        self.call(move |c| {
            // Read-modify-write: SQLite's `||` turns blobs into text.
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let row: Option<(Vec<u8>, i64, i64)> = tx
                .query_row("SELECT log, log_end, log_gap_bytes FROM runs WHERE id = ?1", [run_id.to_string()], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .optional()?;
            if let Some((mut log, end, gap)) = row {
                let end = u64::try_from(end).unwrap_or(0);
                let chunk_end = offset + data.len() as u64;
                if chunk_end > end {
                    let skip = usize::try_from(end.saturating_sub(offset)).unwrap_or(usize::MAX).min(data.len());
                    let fresh = &data[skip..];
                    let room = max_bytes.saturating_sub(log.len());
                    // Once the log is full, what it lacks is past its cap,
                    // not lost on the way.
                    let lost = if room == 0 { 0 } else { offset.saturating_sub(end) };
                    log.extend_from_slice(&fresh[..fresh.len().min(room)]);
                    let gap = gap.saturating_add(i64::try_from(lost).unwrap_or(i64::MAX));
                    let chunk_end = i64::try_from(chunk_end).unwrap_or(i64::MAX);
                    tx.execute(
                        "UPDATE runs SET log = ?2, log_end = ?3, log_gap_bytes = ?4 WHERE id = ?1",
                        params![run_id.to_string(), log, chunk_end, gap],
                    )?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn run_log(&self, user_id: Uuid, run_id: Uuid) -> StoreResult<Option<Vec<u8>>> {
        self.call(move |c| {
            Ok(c.query_row(
                "SELECT log FROM runs WHERE id = ?1 AND user_id = ?2",
                [run_id.to_string(), user_id.to_string()],
                |r| r.get(0),
            )
            .optional()?)
        })
        .await
    }

    async fn claim_lease(&self, key: &str, holder: &LeaseHolder, ttl: Duration) -> StoreResult<bool> {
        let (key, holder) = (key.to_string(), holder.encode());
        self.call(move |c| {
            let now = now_ms();
            Ok(c.execute(
                "INSERT INTO leases (key, holder, expires_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at \
                 WHERE leases.holder = excluded.holder OR leases.expires_at <= ?4",
                params![key, holder, now + ttl_ms(ttl), now],
            )? == 1)
        })
        .await
    }

    async fn seize_lease(&self, key: &str, holder: &LeaseHolder, ttl: Duration) -> StoreResult<Option<LeaseHolder>> {
        let (key, holder) = (key.to_string(), holder.encode());
        self.call(move |c| {
            let now = now_ms();
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let previous: Option<String> = tx
                .query_row("SELECT holder FROM leases WHERE key = ?1 AND expires_at > ?2", params![key, now], |r| {
                    r.get(0)
                })
                .optional()?;
            tx.execute(
                "INSERT INTO leases (key, holder, expires_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at",
                params![key, holder, now + ttl_ms(ttl)],
            )?;
            tx.commit()?;
            previous.as_deref().map(LeaseHolder::decode).transpose()
        })
        .await
    }

    async fn renew_leases(&self, leases: &[(String, LeaseHolder)], ttl: Duration) -> StoreResult<Vec<String>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let pairs = to_json(&leases.iter().map(|(k, h)| [k.clone(), h.encode()]).collect::<Vec<_>>());
        self.call(move |c| {
            // One statement, linear in the leases: each (key, holder) pair is
            // looked up by the primary key, and the trigger of migration 0005
            // marks the hosts of renewed host leases seen and online.
            let mut stmt = c.prepare_cached(
                "UPDATE leases SET expires_at = ?2 \
                 FROM (SELECT json_extract(value, '$[0]') AS key, json_extract(value, '$[1]') AS holder \
                       FROM json_each(?1)) AS mine \
                 WHERE leases.key = mine.key AND leases.holder = mine.holder \
                 RETURNING leases.key",
            )?;
            let keys: Vec<String> =
                stmt.query_map(params![pairs, now_ms() + ttl_ms(ttl)], |r| r.get(0))?.collect::<Result<_, _>>()?;
            Ok(keys)
        })
        .await
    }

    async fn release_lease(&self, key: &str, holder: &LeaseHolder) -> StoreResult<bool> {
        let (key, holder) = (key.to_string(), holder.encode());
        self.call(move |c| Ok(c.execute("DELETE FROM leases WHERE key = ?1 AND holder = ?2", [key, holder])? == 1))
            .await
    }

    async fn release_host_leases(&self, leases: &[(Uuid, LeaseHolder)]) -> StoreResult<Vec<Uuid>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let pairs = to_json(&leases.iter().map(|(id, h)| [host_lease_key(*id), h.encode()]).collect::<Vec<_>>());
        self.call(move |c| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let keys: Vec<String> = {
                let mut stmt = tx.prepare_cached(
                    "DELETE FROM leases WHERE (key, holder) IN \
                     (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?1)) \
                     RETURNING key",
                )?;
                let keys = stmt.query_map([pairs], |r| r.get(0))?.collect::<Result<_, _>>()?;
                keys
            };
            let now = now_ms();
            let mut released = Vec::with_capacity(keys.len());
            {
                let mut offline =
                    tx.prepare_cached("UPDATE hosts SET state = 'offline', last_seen_at = ?2 WHERE id = ?1")?;
                for key in &keys {
                    let Some(id) = key.strip_prefix("host:").and_then(|id| Uuid::parse_str(id).ok()) else { continue };
                    offline.execute(params![id.to_string(), now])?;
                    released.push(id);
                }
            }
            tx.commit()?;
            Ok(released)
        })
        .await
    }

    async fn lease_holder(&self, key: &str) -> StoreResult<Option<LeaseHolder>> {
        let key = key.to_string();
        self.call(move |c| {
            let holder: Option<String> = c
                .query_row(
                    "SELECT holder FROM leases WHERE key = ?1 AND expires_at > ?2",
                    params![key, now_ms()],
                    |r| r.get(0),
                )
                .optional()?;
            holder.as_deref().map(LeaseHolder::decode).transpose()
        })
        .await
    }

    async fn lease_holders(&self, keys: &[String]) -> StoreResult<Vec<(String, LeaseHolder)>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let keys = to_json(&keys);
        self.call(move |c| {
            let mut stmt = c.prepare(
                "SELECT key, holder FROM leases WHERE key IN (SELECT value FROM json_each(?1)) AND expires_at > ?2",
            )?;
            let rows =
                stmt.query_map(params![keys, now_ms()], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
            let rows: Vec<(String, String)> = rows.collect::<Result<_, _>>()?;
            rows.into_iter().map(|(key, holder)| Ok((key, LeaseHolder::decode(&holder)?))).collect()
        })
        .await
    }

    async fn delete_expired_leases(&self, older_than: Duration) -> StoreResult<u64> {
        self.call(move |c| {
            Ok(c.execute("DELETE FROM leases WHERE expires_at < ?1", [now_ms() - ttl_ms(older_than)])? as u64)
        })
        .await
    }

    async fn assignment(&self, host_id: Uuid) -> StoreResult<Option<(String, i64)>> {
        self.call(move |c| {
            Ok(c.query_row(
                "SELECT cell_id, epoch FROM relay_assignments WHERE host_id = ?1",
                [host_id.to_string()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
        })
        .await
    }

    async fn host_admission(&self, host_id: Uuid) -> StoreResult<Option<HostAdmission>> {
        self.call(move |c| host_admission(c, host_id)).await
    }

    async fn register_cell(&self, cell: &CellRow) -> StoreResult<()> {
        let cell = cell.clone();
        self.call(move |c| {
            c.execute(
                "INSERT INTO relay_cells (cell_id, url, region, pool_size, reserve_pool_size) \
                 VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (cell_id) DO UPDATE SET url = excluded.url, region = excluded.region, \
                   pool_size = excluded.pool_size, reserve_pool_size = excluded.reserve_pool_size",
                params![cell.cell_id, cell.url, cell.region, cell.pool_size, cell.reserve_pool_size],
            )?;
            Ok(())
        })
        .await
    }

    async fn list_cells(&self) -> StoreResult<Vec<CellView>> {
        self.call(|c| {
            let read_at = ts(now_ms());
            let raws: Vec<CellViewRaw> =
                c.prepare_cached(CELL_VIEW_SQL)?.query_map([], cell_view_raw)?.collect::<Result<_, _>>()?;
            raws.into_iter().map(|raw| cell_view_from_raw(raw, read_at)).collect()
        })
        .await
    }

    async fn cell_switch(&self, cell_id: &str) -> StoreResult<Option<CellSwitch>> {
        let cell_id = cell_id.to_string();
        self.call(move |c| {
            c.query_row(
                "SELECT admit_mode, dead_man_trip_slots, generation, updated_at FROM relay_cell_admit_modes \
                 WHERE cell_id = ?1",
                [&cell_id],
                switch_raw,
            )
            .optional()?
            .map(|raw| cell_switch_from_raw(&cell_id, raw))
            .transpose()
        })
        .await
    }

    async fn set_cell_switch(
        &self,
        cell_id: &str,
        admit_mode: Option<AdmitMode>,
        trip_slots: Option<Option<u8>>,
    ) -> StoreResult<CellSwitch> {
        cells::check_trip_slots(trip_slots)?;
        let cell_id = cell_id.to_string();
        let mode = admit_mode.map(AdmitMode::as_str);
        let slots = trip_slots.flatten();
        let set_slots = trip_slots.is_some();
        self.call(move |c| {
            let raw = c.query_row(
                "INSERT INTO relay_cell_admit_modes (cell_id, admit_mode, dead_man_trip_slots, generation, updated_at) \
                 VALUES (?1, COALESCE(?2, 'db'), ?4, 1, ?5) \
                 ON CONFLICT (cell_id) DO UPDATE SET \
                   admit_mode = COALESCE(?2, relay_cell_admit_modes.admit_mode), \
                   dead_man_trip_slots = CASE WHEN ?3 THEN ?4 ELSE relay_cell_admit_modes.dead_man_trip_slots END, \
                   generation = relay_cell_admit_modes.generation + 1, updated_at = ?5 \
                 RETURNING admit_mode, dead_man_trip_slots, generation, updated_at",
                params![cell_id, mode, set_slots, slots, now_ms()],
                switch_raw,
            )?;
            cell_switch_from_raw(&cell_id, raw)
        })
        .await
    }

    async fn write_cell_effective(&self, cell_id: &str, mode: AdmitMode, incarnation: &str) -> StoreResult<()> {
        let (cell_id, incarnation) = (cell_id.to_string(), incarnation.to_string());
        self.call(move |c| {
            c.execute(WRITE_EFFECTIVE_SQL, params![cell_id, mode.as_str(), incarnation, now_ms()])?;
            Ok(())
        })
        .await
    }

    async fn claim_trip_slot(
        &self,
        cell_id: &str,
        incarnation: &str,
        slots: u8,
        fresh: Duration,
    ) -> StoreResult<SlotClaim> {
        let (cell_id, incarnation) = (cell_id.to_string(), incarnation.to_string());
        self.call(move |c| {
            // SQLite has no advisory locks. BEGIN IMMEDIATE takes the file's
            // one write lock before the count, so no other claim (of this
            // process, or of another process on the same file) can write
            // between this count and this write: claims are serialised just
            // as PostgreSQL's advisory lock serialises them. Another writer
            // holding the lock past the busy timeout answers Busy, like a
            // lock not taken there.
            let tx = match c.transaction_with_behavior(TransactionBehavior::Immediate) {
                Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::DatabaseBusy => {
                    return Ok(SlotClaim::Busy);
                }
                tx => tx?,
            };
            let now = now_ms();
            let holders: i64 = tx.query_row(
                "SELECT count(*) FROM relay_cell_admit_effective e \
                 JOIN relay_cell_admit_modes m ON m.cell_id = e.cell_id \
                 WHERE e.cell_id <> ?1 AND e.mode = 'db' AND m.admit_mode = 'reserve' AND e.updated_at > ?2",
                params![cell_id, now.saturating_sub(ttl_ms(fresh))],
                |r| r.get(0),
            )?;
            let claim = cells::slot_claim(slots, holders);
            if claim == SlotClaim::Won {
                tx.execute(WRITE_EFFECTIVE_SQL, params![cell_id, AdmitMode::Db.as_str(), incarnation, now])?;
            }
            tx.commit()?;
            Ok(claim)
        })
        .await
    }

    async fn assign_host(&self, host_id: Uuid, cell_id: &str) -> StoreResult<i64> {
        let cell_id = cell_id.to_string();
        self.call(move |c| {
            Ok(c.query_row(
                "INSERT INTO relay_assignments (host_id, cell_id, epoch, updated_at) VALUES (?1, ?2, 1, ?3) \
                 ON CONFLICT (host_id) DO UPDATE SET cell_id = excluded.cell_id, \
                   epoch = relay_assignments.epoch + 1, updated_at = excluded.updated_at \
                 RETURNING epoch",
                params![host_id.to_string(), cell_id, now_ms()],
                |r| r.get(0),
            )?)
        })
        .await
    }

    async fn record_assignments(&self, cell_id: &str, hosts: &[(Uuid, i64)]) -> StoreResult<u64> {
        if hosts.is_empty() {
            return Ok(0);
        }
        let batch: Vec<(String, i64)> =
            cells::highest_epochs(hosts).into_iter().map(|(host, epoch)| (host.to_string(), epoch)).collect();
        let batch = to_json(&batch);
        let cell_id = cell_id.to_string();
        self.call(move |c| {
            // `WHERE true` tells SQLite's parser the ON CONFLICT belongs to the upsert.
            let written = c.execute(
                "INSERT INTO relay_assignments (host_id, cell_id, epoch, updated_at) \
                 SELECT json_extract(value, '$[0]'), ?1, json_extract(value, '$[1]'), ?3 FROM json_each(?2) WHERE true \
                 ON CONFLICT (host_id) DO UPDATE SET cell_id = excluded.cell_id, epoch = excluded.epoch, \
                   updated_at = excluded.updated_at \
                 WHERE relay_assignments.epoch <= excluded.epoch",
                params![cell_id, batch, now_ms()],
            )?;
            Ok(written as u64)
        })
        .await
    }

    async fn put_credentials(
        &self,
        host_id: Uuid,
        sealed: &SealedCredentials,
        expires_at: Option<DateTime<Utc>>,
    ) -> StoreResult<()> {
        let sealed = sealed.clone();
        let expires_at = expires_at.map(|t| t.timestamp_millis());
        self.call(move |c| {
            c.execute(
                "INSERT INTO host_credentials (host_id, nonce, ciphertext, updated_at, expires_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (host_id) DO UPDATE SET nonce = excluded.nonce, ciphertext = excluded.ciphertext, \
                   updated_at = excluded.updated_at, expires_at = excluded.expires_at",
                params![host_id.to_string(), sealed.nonce, sealed.ciphertext, now_ms(), expires_at],
            )?;
            Ok(())
        })
        .await
    }

    async fn credentials_expiring(&self, before: DateTime<Utc>) -> StoreResult<Vec<Uuid>> {
        self.call(move |c| {
            let mut stmt = c.prepare(
                "SELECT hc.host_id FROM host_credentials hc \
                 JOIN leases l ON l.key = 'host:' || hc.host_id AND l.expires_at > ?2 \
                 WHERE hc.expires_at IS NOT NULL AND hc.expires_at < ?1",
            )?;
            let ids = stmt.query_map(params![before.timestamp_millis(), now_ms()], |r| uuid_col(r, 0))?;
            Ok(ids.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn get_credentials(&self, host_id: Uuid) -> StoreResult<Option<SealedCredentials>> {
        self.call(move |c| {
            Ok(c.query_row(
                "SELECT nonce, ciphertext FROM host_credentials WHERE host_id = ?1",
                [host_id.to_string()],
                |r| Ok(SealedCredentials { nonce: r.get(0)?, ciphertext: r.get(1)? }),
            )
            .optional()?)
        })
        .await
    }

    async fn insert_audit_events(&self, events: &[NewAuditEvent]) -> StoreResult<()> {
        let events = events.to_vec();
        self.call(move |c| {
            let tx = c.transaction()?;
            {
                let mut stmt = tx.prepare_cached(
                    "INSERT INTO audit_events \
                     (id, at, user_id, token_id, action, host_id, terminal_id, instance_id, detail) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                )?;
                for e in &events {
                    stmt.execute(params![
                        Uuid::new_v4().to_string(),
                        e.at.timestamp_millis(),
                        e.user_id.to_string(),
                        e.token_id.map(|t| t.to_string()),
                        e.action.as_str(),
                        e.host_id.map(|h| h.to_string()),
                        e.terminal_id.map(|t| t.to_string()),
                        e.instance_id,
                        e.detail,
                    ])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn list_audit_events(
        &self,
        user_id: Uuid,
        since: Option<DateTime<Utc>>,
        limit: usize,
    ) -> StoreResult<Vec<AuditEvent>> {
        let since = since.map(|s| s.timestamp_millis());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.call(move |c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {AUDIT_COLS} \
                 FROM audit_events WHERE user_id = ?1 AND (?2 IS NULL OR at >= ?2) \
                 ORDER BY at DESC, rowid DESC LIMIT ?3"
            ))?;
            let rows = stmt
                .query_map(params![user_id.to_string(), since, limit], |r| {
                    Ok((
                        uuid_col(r, 0)?,
                        r.get::<_, i64>(1)?,
                        uuid_col(r, 2)?,
                        opt_uuid_col(r, 3)?,
                        r.get::<_, String>(4)?,
                        opt_uuid_col(r, 5)?,
                        opt_uuid_col(r, 6)?,
                        r.get::<_, String>(7)?,
                        r.get::<_, Option<String>>(8)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(id, at, user_id, token_id, action, host_id, terminal_id, instance_id, detail)| {
                    Ok(AuditEvent {
                        id,
                        at: ts(at),
                        user_id,
                        token_id,
                        action: action.parse()?,
                        host_id,
                        terminal_id,
                        instance_id,
                        detail,
                    })
                })
                .collect()
        })
        .await
    }

    async fn delete_audit_events_before(&self, before: DateTime<Utc>) -> StoreResult<u64> {
        let before = before.timestamp_millis();
        self.call(move |c| Ok(c.execute("DELETE FROM audit_events WHERE at < ?1", [before])? as u64)).await
    }
}
