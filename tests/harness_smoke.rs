//! Checks of the harness itself: what `pg_database()` promises (new, empty,
//! distinct databases, from any runtime) and the small helpers.

mod support;

use std::time::Duration;

use tokio_postgres::{Client, NoTls};

/// Connects and runs the connection driver on the current runtime.
async fn connect(url: &str) -> Client {
    let (client, connection) = tokio::time::timeout(Duration::from_secs(10), tokio_postgres::connect(url, NoTls))
        .await
        .unwrap_or_else(|_| panic!("connecting to {url} timed out"))
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    tokio::spawn(connection);
    client
}

async fn user_tables(client: &Client) -> Vec<String> {
    client
        .query("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename", &[])
        .await
        .expect("list tables")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[actix_rt::test]
async fn pg_database_gives_distinct_empty_databases() {
    let first_url = support::pg_database().await;
    let second_url = support::pg_database().await;
    assert_ne!(first_url, second_url);

    let first = connect(&first_url).await;
    let second = connect(&second_url).await;
    let first_name: String = first.query_one("SELECT current_database()", &[]).await.expect("query").get(0);
    let second_name: String = second.query_one("SELECT current_database()", &[]).await.expect("query").get(0);
    assert_ne!(first_name, second_name, "both URLs lead to the same database");
    assert!(user_tables(&first).await.is_empty(), "a new database should be empty");
    assert!(user_tables(&second).await.is_empty(), "a new database should be empty");

    first
        .batch_execute("CREATE TABLE notes (id int PRIMARY KEY, body text); INSERT INTO notes VALUES (1, 'first')")
        .await
        .expect("create a table in the first database");
    let body: String = first.query_one("SELECT body FROM notes WHERE id = 1", &[]).await.expect("read back").get(0);
    assert_eq!(body, "first");
    assert_eq!(user_tables(&first).await, ["notes"]);
    assert!(user_tables(&second).await.is_empty(), "a table in one database leaked into the other");

    second.batch_execute("CREATE TABLE notes (id int)").await.expect("same table name in the second database");
}

/// Each `#[actix_rt::test]` has its own runtime; several at once, from
/// threads with their own runtimes, must share one server and still get
/// their own databases.
#[test]
fn pg_database_from_concurrent_runtimes() {
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                let runtime =
                    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("build a runtime");
                runtime.block_on(async {
                    let url = support::pg_database().await;
                    let client = connect(&url).await;
                    client.batch_execute("CREATE TABLE t (x int)").await.expect("create table");
                    url
                })
                // The runtime is dropped here: pg_database must not have left work in it.
            })
        })
        .collect();
    let urls: Vec<String> = threads.into_iter().map(|t| t.join().expect("thread panicked")).collect();
    let distinct: std::collections::BTreeSet<&String> = urls.iter().collect();
    assert_eq!(distinct.len(), urls.len(), "databases not distinct: {urls:?}");
    let server = |url: &str| url.rsplit_once('/').map(|(server, _)| server.to_string());
    assert!(urls.iter().all(|url| server(url) == server(&urls[0])), "expected one shared server: {urls:?}");
}

#[test]
fn url_with_database_replaces_only_the_path() {
    assert_eq!(support::url_with_database("postgres://u:p@h:1/postgres", "x"), "postgres://u:p@h:1/x");
    assert_eq!(support::url_with_database("postgres://u@h:1", "x"), "postgres://u@h:1/x");
    assert_eq!(
        support::url_with_database("postgresql://h/db?sslmode=disable", "x"),
        "postgresql://h/x?sslmode=disable"
    );
}

#[test]
fn unique_prefixes_differ() {
    let prefixes: std::collections::BTreeSet<String> = (0..100).map(|_| support::unique_prefix()).collect();
    assert_eq!(prefixes.len(), 100);
}
