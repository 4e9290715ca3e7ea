//! The test harness: real servers for integration tests.
//!
//! Integration tests include it with `mod support;`. It gives them
//!
//! - [`pg_database`]: a new, empty PostgreSQL database per call;
//! - [`redis_url`]: a standalone Redis;
//! - [`redis_cluster_nodes`] / [`redis_cluster_hosts`]: a three-master Redis Cluster;
//! - [`unique_prefix`]: a random prefix for keys and channels, so tests can share servers;
//! - [`TetherServer`] / [`tether_cmd`]: real `tether` processes;
//! - [`cell_peer::CellPeer`]: a scripted relay cell answering a director's calls;
//! - [`cli::Person`]: the client commands as a person runs them (own config dir, pipes or a PTY);
//! - [`OwnPostgres`] / [`OwnRedis`]: servers of one test's own, to stop and start again;
//! - [`disk`]: a full disk under a SQLite file; [`clock_ahead_env`]: a process whose clock runs ahead.
//!
//! No mocks: the servers are real `postgres` and `redis-server` processes.
//! When `TETHER_TEST_DATABASE_URL`, `TETHER_TEST_REDIS_URL` or
//! `TETHER_TEST_REDIS_CLUSTER` is set (scripts/test sets all three) the
//! harness uses those servers; otherwise it starts each kind once per test
//! process, on first use, on free ports. Servers it starts die with the test
//! process, however that ends (see `process`). A missing server binary is a
//! loud failure naming the Debian package to install, never a skip.

// Each test binary uses a different part of the harness.
#![allow(dead_code, unused_imports)]

pub mod balancer;
pub mod browser;
pub mod cell_peer;
pub mod cli;
pub mod client;
pub mod daemon;
pub mod disk;
pub mod e2e;
mod postgres;
mod process;
mod redis;
mod tether;

pub use postgres::{pg_connect, pg_database, url_with_database, OwnPostgres};
pub use process::{clock_ahead_env, free_port, redis_command};
pub use redis::{command_stats, redis_cluster_hosts, redis_cluster_nodes, redis_url, OwnRedis, OwnRedisCluster};
pub use tether::{tether_cmd, tether_command, TetherServer};

/// A Linux host of `user` called `hostname`, registered straight in the store.
pub async fn store_host(
    store: &dyn ::tether::store::Store,
    user: &::tether::store::User,
    hostname: &str,
) -> ::tether::store::Host {
    let new = ::tether::store::NewHost {
        user_id: user.id,
        name: hostname.into(),
        hostname: hostname.into(),
        platform: "linux".into(),
        arch: "x86_64".into(),
    };
    match store.register_host(&new, None).await.expect("register a host") {
        ::tether::store::Registered::Host(host) => host,
        refused => panic!("a host registered with no token refused: {refused:?}"),
    }
}

/// Two instances A and B forming one cluster on a fresh PostgreSQL database
/// and the test Redis (own bus prefix), with leases renewed every second
/// (3 s TTL), so a host that moves is settled within a test's patience.
pub async fn instance_pair() -> (TetherServer, TetherServer) {
    instance_pair_on(&pg_database().await, &redis_url(), &[], &[]).await
}

/// Like [`instance_pair`], on the PostgreSQL `database` and the Redis
/// `redis` (servers a test may stop), with `env` added to both instances
/// and `b_only` to B.
pub async fn instance_pair_on(
    database: &str,
    redis: &str,
    env: &[(&str, &str)],
    b_only: &[(&str, &str)],
) -> (TetherServer, TetherServer) {
    let prefix = unique_prefix();
    let mut both = vec![
        ("TETHER_DATABASE__URL", database),
        ("TETHER_REDIS__URL", redis),
        ("TETHER_BUS__PREFIX", prefix.as_str()),
        ("TETHER_LEASE__RENEW_MS", "1000"),
        ("TETHER_LEASE__TTL_MS", "3000"),
    ];
    both.extend_from_slice(env);
    let a = TetherServer::start(&both, &[]).await;
    let b = TetherServer::start(&[both.as_slice(), b_only].concat(), &[]).await;
    (a, b)
}

/// A short random prefix for the keys and channels of one test, e.g. `t3fa90c1d`.
pub fn unique_prefix() -> String {
    format!("t{:08x}", rand::random::<u32>())
}
