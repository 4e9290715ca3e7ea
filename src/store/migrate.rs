//! The numbered migrations of both backends, embedded in the binary.
//!
//! Each backend records applied versions in `schema_migrations`; applying is
//! idempotent, and a database that records a version this binary does not
//! know is refused rather than guessed at.

/// One numbered schema change.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

pub const MIGRATIONS_POSTGRES: &[Migration] = &[
    Migration { version: 1, name: "foundation", sql: include_str!("../../migrations/postgres/0001_foundation.sql") },
    Migration { version: 2, name: "tokens", sql: include_str!("../../migrations/postgres/0002_tokens.sql") },
    Migration { version: 3, name: "audit", sql: include_str!("../../migrations/postgres/0003_audit.sql") },
    Migration {
        version: 4,
        name: "run_log_offsets_credentials_expiry",
        sql: include_str!("../../migrations/postgres/0004_run_log_offsets_credentials_expiry.sql"),
    },
    Migration {
        version: 5,
        name: "live_terminal_indexes",
        sql: include_str!("../../migrations/postgres/0005_live_terminal_indexes.sql"),
    },
    Migration { version: 6, name: "token_ends", sql: include_str!("../../migrations/postgres/0006_token_ends.sql") },
    Migration { version: 7, name: "list_pages", sql: include_str!("../../migrations/postgres/0007_list_pages.sql") },
];

pub const MIGRATIONS_SQLITE: &[Migration] = &[
    Migration { version: 1, name: "foundation", sql: include_str!("../../migrations/sqlite/0001_foundation.sql") },
    Migration { version: 2, name: "tokens", sql: include_str!("../../migrations/sqlite/0002_tokens.sql") },
    Migration { version: 3, name: "audit", sql: include_str!("../../migrations/sqlite/0003_audit.sql") },
    Migration {
        version: 4,
        name: "run_log_offsets_credentials_expiry",
        sql: include_str!("../../migrations/sqlite/0004_run_log_offsets_credentials_expiry.sql"),
    },
    Migration {
        version: 5,
        name: "renew_touches_hosts",
        sql: include_str!("../../migrations/sqlite/0005_renew_touches_hosts.sql"),
    },
    Migration {
        version: 6,
        name: "live_terminal_indexes",
        sql: include_str!("../../migrations/sqlite/0006_live_terminal_indexes.sql"),
    },
    Migration { version: 7, name: "token_ends", sql: include_str!("../../migrations/sqlite/0007_token_ends.sql") },
    Migration { version: 8, name: "list_pages", sql: include_str!("../../migrations/sqlite/0008_list_pages.sql") },
    Migration {
        version: 9,
        name: "triggers_any_sqlite",
        sql: include_str!("../../migrations/sqlite/0009_triggers_any_sqlite.sql"),
    },
];

/// The error for a database migrated by a newer binary.
pub(super) fn too_new(found: i64, known: i64) -> super::StoreError {
    super::StoreError::Migration(format!(
        "the database is at schema version {found}, newer than this binary knows ({known}); \
         upgrade tether before pointing it at this database"
    ))
}

/// Highest version in a migration list.
pub(super) fn latest(migrations: &[Migration]) -> i64 {
    migrations.iter().map(|m| m.version).max().unwrap_or(0)
}
