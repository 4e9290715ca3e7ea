//! PostgreSQL for the benchmarks that run on it (`cluster_bench`,
//! `scale_bench`): a fresh database per run on the server that
//! `TETHER_BENCH_DATABASE_URL` names (scripts/cluster-bench and
//! scripts/scale-bench start one with pg_stat_statements preloaded), and
//! the statement counters read from it.

use std::time::Duration;

/// A client on `url`; its connection runs on the current actix arbiter.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect PostgreSQL");
    actix_rt::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// `server_url` with its database replaced by `db`.
pub fn with_database(server_url: &str, db: &str) -> String {
    let (base, query) = server_url.split_once('?').map_or((server_url, None), |(b, q)| (b, Some(q)));
    let start = base.find("://").expect("postgres:// URL") + 3;
    let end = base[start..].find('/').map_or(base.len(), |i| start + i);
    let mut url = format!("{}/{db}", &base[..end]);
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    url
}

/// Creates a database named `PREFIX_<random>` and pg_stat_statements (the
/// server must preload it); answers its name and URL.
pub async fn fresh_database(admin: &tokio_postgres::Client, server_url: &str, prefix: &str) -> (String, String) {
    let db = format!("{prefix}_{:08x}", rand::random::<u32>());
    admin.batch_execute(&format!("CREATE DATABASE {db}")).await.expect("create database");
    admin
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .expect("pg_stat_statements (the server must preload it: shared_preload_libraries)");
    let url = with_database(server_url, &db);
    (db, url)
}

/// Drops `db`, closing what is still connected to it.
pub async fn drop_database(admin: &tokio_postgres::Client, db: &str) {
    let _ = tokio::time::timeout(
        Duration::from_secs(30),
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")),
    )
    .await;
}

/// One row of pg_stat_statements: calls, rows, the server's time running
/// them (ms, all calls), the normalised statement.
pub struct Statement {
    pub calls: i64,
    pub rows: i64,
    pub total_ms: f64,
    pub query: String,
}

/// pg_stat_statements of `db`, most called first (utility statements such
/// as BEGIN/COMMIT included).
pub async fn statements(admin: &tokio_postgres::Client, db: &str) -> Vec<Statement> {
    admin
        .query(
            "SELECT s.calls, s.rows, s.total_exec_time, s.query FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
             WHERE d.datname = $1 ORDER BY s.calls DESC",
            &[&db],
        )
        .await
        .expect("read pg_stat_statements")
        .iter()
        .map(|r| Statement {
            calls: r.get(0),
            rows: r.get(1),
            total_ms: r.get(2),
            query: r.get::<_, &str>(3).split_whitespace().collect::<Vec<_>>().join(" "),
        })
        .collect()
}

/// Prints the `n` most called statements of `rows`, one line each.
pub fn print_top(rows: &[Statement], n: usize) {
    for r in rows.iter().take(n) {
        let query = &r.query[..r.query.len().min(100)];
        println!("    {:>7} calls {:>8} rows {:>8.0} ms  {query}", r.calls, r.rows, r.total_ms);
    }
}

pub async fn reset_statements(admin: &tokio_postgres::Client) {
    admin.batch_execute("SELECT pg_stat_statements_reset()").await.expect("reset pg_stat_statements");
}

/// `pg_stat_database.xact_commit` of `db`.
pub async fn xact_commit(admin: &tokio_postgres::Client, db: &str) -> i64 {
    admin
        .query_one("SELECT xact_commit FROM pg_stat_database WHERE datname = $1", &[&db])
        .await
        .expect("pg_stat_database")
        .get(0)
}

/// The pid of the postmaster of the server `admin` is connected to (it
/// must run on this machine): the parent of `admin`'s backend.
pub async fn postmaster_pid(admin: &tokio_postgres::Client) -> u32 {
    let backend: i32 = admin.query_one("SELECT pg_backend_pid()", &[]).await.expect("pg_backend_pid").get(0);
    let stat = std::fs::read_to_string(format!("/proc/{backend}/stat")).expect("the backend runs on this machine");
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    after.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("the backend's parent")
}
