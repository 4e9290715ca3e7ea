//! The instance's Redis connection (standalone or Redis Cluster).
//!
//! Today it serves readiness: `/readyz` reports whether the configured Redis
//! answers. Cross-instance routing over sharded pub/sub (SPEC §7.2) is not
//! in this build yet: an instance with Redis configured still serves only
//! the daemons and viewers connected to it, and says so at start.

use std::time::Duration;

use fred::prelude::*;

use crate::config::{ConfigError, Settings};

/// A connected (and reconnecting) Redis client.
#[derive(Clone)]
pub struct RedisLink {
    client: Client,
}

impl RedisLink {
    /// Builds the client the settings describe, or `None` without Redis.
    /// Connecting happens in the background, retrying with backoff.
    pub fn from_settings(settings: &Settings) -> Result<Option<Self>, ConfigError> {
        let config = if let Some(url) = &settings.redis.url {
            Config::from_url(url).map_err(|e| ConfigError::Invalid { key: "redis.url", message: e.to_string() })?
        } else if settings.redis.cluster_nodes.is_some() {
            Config { server: ServerConfig::new_clustered(settings.cluster_nodes()?), ..Config::default() }
        } else {
            return Ok(None);
        };
        let client = Builder::from_config(config)
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 30_000, 2))
            .build()
            .map_err(|e| ConfigError::Invalid { key: "redis.url", message: e.to_string() })?;
        let _connection_task = client.connect();
        Ok(Some(Self { client }))
    }

    /// True when Redis answers a PING within a second.
    pub async fn ping(&self) -> Result<(), String> {
        match tokio::time::timeout(Duration::from_secs(1), self.client.ping::<String>(None)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within 1 s".into()),
        }
    }
}
