//! Settings: built-in defaults, then a TOML file (`--config` or
//! `TETHER_CONFIG`), then environment variables `TETHER_<SECTION>__<KEY>`.
//!
//! Every default the docs name is set here. `Settings::load` refuses an
//! unknown key, a value of the wrong type and a combination that breaks an
//! invariant (renew >= ttl, say), each with a message naming the key.
//! docs/CONFIG.md documents every setting.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// A setting that could not be loaded or makes no sense.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("configuration key `{key}`: {message}")]
    Invalid { key: &'static str, message: String },
}

/// The longest a cell timing may be: 30 days.
const MAX_TIMING_MS: u64 = 30 * 24 * 3600 * 1000;

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key, message: message.into() }
}

/// All settings of a tether process.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub http: HttpSettings,
    pub database: DatabaseSettings,
    pub redis: RedisSettings,
    pub bus: BusSettings,
    pub cell: CellSettings,
    pub cluster: ClusterSettings,
    pub encryption: EncryptionSettings,
    pub credentials: CredentialsSettings,
    pub lease: LeaseSettings,
    pub sweep: SweepSettings,
    pub daemon: DaemonSettings,
    pub viewer: ViewerSettings,
    pub shutdown: ShutdownSettings,
    pub runs: RunsSettings,
    pub terminals: TerminalsSettings,
    pub director: DirectorSettings,
    pub audit: AuditSettings,
    pub metrics: MetricsSettings,
    pub auth: AuthSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// Address `tether serve` listens on.
    pub listen: String,
    /// Largest JSON request body accepted by the REST API, in bytes.
    pub max_body_bytes: usize,
    /// Concurrent WebSockets one user may hold from one client address
    /// (per instance): users behind one NAT or proxy do not share it.
    pub ws_per_address: usize,
    /// Concurrent WebSockets one user may hold in all (per instance).
    pub ws_per_user: usize,
    /// A client must finish its TLS handshake, and send its first request's
    /// whole head (a WebSocket upgrade included), within this after
    /// connecting; else the connection is closed (408 for a partial head).
    /// A connection not yet past this holds no WebSocket slot.
    pub handshake_timeout_ms: u64,
    /// Proxies (CIDRs, or single addresses) whose `X-Forwarded-For` names
    /// the client; empty = the TCP peer is the client. A TOML list or a
    /// comma-separated string.
    #[serde(deserialize_with = "list_or_commas")]
    pub trusted_proxies: Vec<String>,
    /// PEM certificate chain; with `tls_key_path`, `serve` speaks HTTPS.
    pub tls_cert_path: Option<PathBuf>,
    /// PEM private key of `tls_cert_path`.
    pub tls_key_path: Option<PathBuf>,
    /// Serve the web page from this directory (a built web/dist) instead
    /// of the copy embedded in the binary; for developing the page.
    pub web_dir: Option<PathBuf>,
    /// Origins besides this instance's own whose pages may open WebSockets
    /// (`https://host[:port]`); empty = same origin only. A TOML list or a
    /// comma-separated string.
    #[serde(deserialize_with = "list_or_commas")]
    pub allowed_origins: Vec<String>,
}

/// A list of strings given as a TOML array or as one comma-separated string
/// (the form environment variables take).
fn list_or_commas<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrString {
        List(Vec<String>),
        String(String),
    }
    Ok(match ListOrString::deserialize(deserializer)? {
        ListOrString::List(list) => list,
        ListOrString::String(s) => s.split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from).collect(),
    })
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            max_body_bytes: 256 * 1024,
            ws_per_address: 256,
            ws_per_user: 1024,
            handshake_timeout_ms: 5000,
            trusted_proxies: Vec::new(),
            tls_cert_path: None,
            tls_key_path: None,
            web_dir: None,
            allowed_origins: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    /// PostgreSQL URL; unset selects the embedded SQLite file.
    pub url: Option<String>,
    /// The embedded SQLite file.
    pub sqlite_path: PathBuf,
    /// PostgreSQL connection pool size.
    pub pool_size: usize,
    /// How long one PostgreSQL call may wait for the database, taking a
    /// pooled connection included, before it fails as unavailable.
    pub call_timeout_ms: u64,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self { url: None, sqlite_path: PathBuf::from("./tether.db"), pool_size: 16, call_timeout_ms: 10_000 }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisSettings {
    /// Standalone Redis URL (`redis://host:port`).
    pub url: Option<String>,
    /// Comma-separated `host:port` seeds of a Redis Cluster.
    pub cluster_nodes: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusSettings {
    /// Channel name prefix.
    pub prefix: String,
    pub ack_ms: u64,
    pub heartbeat_ms: u64,
    /// How often a Redis Cluster's slot map is read to re-subscribe channels
    /// whose slot moved to another primary.
    pub slot_check_ms: u64,
    /// Received messages the instance's bus inbox holds before it loses
    /// them (and reports the loss as a gap).
    pub inbox_messages: usize,
}

impl Default for BusSettings {
    fn default() -> Self {
        Self {
            prefix: "tether".into(),
            ack_ms: 5_000,
            heartbeat_ms: 10_000,
            slot_check_ms: 1_000,
            inbox_messages: 16 * 1024,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CellSettings {
    /// Cell id; defaults to the host name (the pod name in Kubernetes).
    pub id: Option<String>,
    /// This instance's own base URL, for the director.
    pub url: Option<String>,
    /// A label for operators (`relay_cells.region`, shown by
    /// `GET /internal/v1/cells`); placement does not read it.
    pub region: String,
    pub dead_man_base_ms: u64,
    pub dead_man_spread_ms: u64,
    pub held_retry_ms: u64,
    pub switch_poll_ms: u64,
    pub effective_refresh_ms: u64,
    pub effective_forced_ms: u64,
    pub slot_stale_ms: u64,
    pub recent_seat_ms: u64,
    /// Database connections in reserve mode (docs/CELLS.md, "The connection
    /// budget"); unset: a quarter of `database.pool_size` (see
    /// [`Settings::reserve_pool_size`]).
    pub reserve_pool_size: Option<usize>,
    /// Hosts the cell takes by booking: seats + live bookings never exceed it.
    pub seat_capacity: usize,
}

impl Default for CellSettings {
    fn default() -> Self {
        Self {
            id: None,
            url: None,
            region: String::new(),
            dead_man_base_ms: 60_000,
            dead_man_spread_ms: 60_000,
            held_retry_ms: 30_000,
            switch_poll_ms: 5_000,
            effective_refresh_ms: 15_000,
            effective_forced_ms: 300_000,
            slot_stale_ms: 600_000,
            recent_seat_ms: 600_000,
            reserve_pool_size: None,
            seat_capacity: 10_000,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// Shared secret for `/internal/...` calls and booking tickets.
    pub secret: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EncryptionSettings {
    /// 32 bytes, base64: the AES-256-GCM key for host credentials.
    pub key: Option<String>,
}

/// Credentials auto-refresh (docs/CLUSTER.md, "Periodic host tasks").
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CredentialsSettings {
    /// Stored credentials that expire within this are refreshed, at most
    /// once per this long per host across the cluster.
    pub refresh_before_ms: u64,
    /// How often each instance looks for credentials due for a refresh.
    pub check_ms: u64,
}

impl Default for CredentialsSettings {
    fn default() -> Self {
        Self { refresh_before_ms: 600_000, check_ms: 60_000 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseSettings {
    pub ttl_ms: u64,
    pub renew_ms: u64,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self { ttl_ms: 30_000, renew_ms: 10_000 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SweepSettings {
    pub interval_ms: u64,
    pub stale_host_ms: u64,
    pub launch_timeout_ms: u64,
}

impl Default for SweepSettings {
    fn default() -> Self {
        Self { interval_ms: 30_000, stale_host_ms: 90_000, launch_timeout_ms: 30_000 }
    }
}

/// Token checks (docs/REST.md, "Revocation and expiry").
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// How often each instance asks the database whether the tokens of its
    /// open sockets are still usable; a revoked or expired token's sockets
    /// are closed 4401 within this (plus one query).
    pub revocation_check_ms: u64,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self { revocation_check_ms: 500 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonSettings {
    pub hello_timeout_ms: u64,
    /// A connected daemon that sends no frame this long is closed 1008
    /// (it pings every 30 s).
    pub idle_timeout_ms: u64,
    /// Flow control: bytes of one terminal's output a daemon may send ahead
    /// of what was handed to its viewers (docs/PROTOCOL.md, "Flow control").
    pub window_bytes: u64,
    /// Requests (dirs, limits, credentials) one daemon connection may have
    /// waiting for the daemon's answer; past it a request is refused 429.
    pub max_pending_requests: usize,
}

impl Default for DaemonSettings {
    fn default() -> Self {
        Self { hello_timeout_ms: 10_000, idle_timeout_ms: 95_000, window_bytes: 256 * 1024, max_pending_requests: 64 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ViewerSettings {
    pub in_use_ms: u64,
    pub fresh_ms: u64,
    pub ping_timeout_ms: u64,
    /// Bytes a viewer's outbound queue may hold; past it the viewer is closed 1008.
    pub queue_bytes: usize,
    /// How long a viewer may stay behind (queue over half its bound, the
    /// terminal's stream paused for it) before it is closed 1008.
    pub slow_ms: u64,
    /// Viewers of one terminal on its owner, remote ones included; one more
    /// is closed 4429.
    pub max_per_terminal: usize,
}

impl Default for ViewerSettings {
    fn default() -> Self {
        Self {
            in_use_ms: 60_000,
            fresh_ms: 5_000,
            ping_timeout_ms: 1_500,
            queue_bytes: 4 * 1024 * 1024,
            slow_ms: 3_000,
            max_per_terminal: 256,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownSettings {
    pub grace_ms: u64,
}

impl Default for ShutdownSettings {
    fn default() -> Self {
        Self { grace_ms: 20_000 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunsSettings {
    /// A run whose host has been gone this long (ms) becomes `lost`.
    pub lost_after: u64,
    /// Largest captured output kept per run, in bytes.
    pub log_max_bytes: usize,
}

impl Default for RunsSettings {
    fn default() -> Self {
        Self { lost_after: 600_000, log_max_bytes: 4 * 1024 * 1024 }
    }
}

/// Caps on live terminals (docs/REST.md, "Terminals"): a terminal or run
/// created past one is refused 429 `too_many_terminals`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TerminalsSettings {
    /// Live terminals (pending, launching, running, and queued runs) one host may have.
    pub max_per_host: u64,
    /// Live terminals one user may have over all their hosts.
    pub max_per_user: u64,
}

impl Default for TerminalsSettings {
    fn default() -> Self {
        Self { max_per_host: 256, max_per_user: 1024 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DirectorSettings {
    pub enabled: bool,
    pub poll_ms: u64,
    pub fresh_ms: u64,
    pub effective_fresh_ms: u64,
}

impl Default for DirectorSettings {
    fn default() -> Self {
        Self { enabled: false, poll_ms: 2_000, fresh_ms: 3_000, effective_fresh_ms: 45_000 }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditSettings {
    /// Audit events older than this (ms) are deleted by the sweep.
    pub retention_ms: u64,
}

impl Default for AuditSettings {
    fn default() -> Self {
        Self { retention_ms: 90 * 24 * 3600 * 1000 }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// Serve `/metrics` on this address only (and no longer on
    /// `http.listen`); unset = `/metrics` is served with the API.
    pub listen: Option<String>,
}

/// Environment variables that belong to tools around tether, not to settings
/// (`TETHER_TOKEN` and `TETHER_SERVER` are the client commands' and the
/// daemon's `--token` and `--server`, docs/CLI.md).
const NON_SETTING_ENV: &[&str] = &["TETHER_CONFIG", "TETHER_TOKEN", "TETHER_SERVER"];

impl Settings {
    /// Loads defaults, then `file` (or `TETHER_CONFIG`), then the process
    /// environment, and validates the result.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with(file, &[])
    }

    /// Like [`Settings::load`], with command-line flags on top of every
    /// layer, as (key, value) pairs such as `("http.listen", "0.0.0.0:80")`.
    pub fn load_with(file: Option<&Path>, flags: &[(&str, String)]) -> Result<Self, ConfigError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        Self::load_layers(file, &env, flags)
    }

    /// Like [`Settings::load`] with an explicit environment (for tests).
    pub fn load_from(file: Option<&Path>, env: &HashMap<String, String>) -> Result<Self, ConfigError> {
        Self::load_layers(file, env, &[])
    }

    fn load_layers(
        file: Option<&Path>,
        env: &HashMap<String, String>,
        flags: &[(&str, String)],
    ) -> Result<Self, ConfigError> {
        // The error names where the file came from: the flag, or the variable.
        let file = match file {
            Some(path) => Some((path.to_path_buf(), "--config")),
            None => env.get("TETHER_CONFIG").map(|path| (PathBuf::from(path), "TETHER_CONFIG")),
        };
        let mut builder = config::Config::builder();
        if let Some((path, named_by)) = file {
            if !path.exists() {
                return Err(invalid(named_by, format!("file {} does not exist", path.display())));
            }
            builder = builder.add_source(config::File::from(path).format(config::FileFormat::Toml));
        }
        let settings_env: config::Map<String, String> = env
            .iter()
            .filter(|(k, _)| k.starts_with("TETHER_") && !k.starts_with("TETHER_TEST_"))
            .filter(|(k, _)| !NON_SETTING_ENV.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        builder = builder.add_source(
            config::Environment::with_prefix("TETHER").prefix_separator("_").separator("__").source(Some(settings_env)),
        );
        for (key, value) in flags {
            builder = builder.set_override(*key, value.as_str())?;
        }
        let settings: Settings = builder.build()?.try_deserialize()?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks invariants the type system cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.http
            .listen
            .parse::<SocketAddr>()
            .map_err(|e| invalid("http.listen", format!("`{}` is not an address: {e}", self.http.listen)))?;
        match (&self.http.tls_cert_path, &self.http.tls_key_path) {
            (Some(_), None) => return Err(invalid("http.tls_key_path", "is required with http.tls_cert_path")),
            (None, Some(_)) => return Err(invalid("http.tls_cert_path", "is required with http.tls_key_path")),
            _ => {}
        }
        if let Some(dir) = &self.http.web_dir {
            crate::http::page::check_web_dir(dir).map_err(|e| invalid("http.web_dir", e))?;
        }
        for origin in &self.http.allowed_origins {
            if crate::http::origin::normalize(origin).is_none() {
                return Err(invalid(
                    "http.allowed_origins",
                    format!("`{origin}` is not an origin like https://host[:port] (no path)"),
                ));
            }
        }
        for proxy in &self.http.trusted_proxies {
            crate::http::client_addr::Cidr::parse(proxy).map_err(|e| invalid("http.trusted_proxies", e))?;
        }
        if let Some(listen) = &self.metrics.listen {
            let addr = listen
                .parse::<SocketAddr>()
                .map_err(|e| invalid("metrics.listen", format!("`{listen}` is not an address: {e}")))?;
            if addr == self.listen_addr() {
                return Err(invalid("metrics.listen", "must differ from http.listen"));
            }
        }
        if self.http.max_body_bytes == 0 {
            return Err(invalid("http.max_body_bytes", "must be positive"));
        }
        if self.database.pool_size == 0 {
            return Err(invalid("database.pool_size", "must be positive"));
        }
        if self.database.call_timeout_ms == 0 {
            return Err(invalid("database.call_timeout_ms", "must be positive"));
        }
        if let Some(reserve) = self.cell.reserve_pool_size {
            if reserve == 0 || reserve > self.database.pool_size {
                return Err(invalid("cell.reserve_pool_size", "must be between 1 and database.pool_size"));
            }
        }
        if self.cell.seat_capacity == 0 {
            return Err(invalid("cell.seat_capacity", "must be positive"));
        }
        if let Some(url) = &self.database.url {
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return Err(invalid("database.url", "must be a postgres:// or postgresql:// URL"));
            }
            let config = url.parse::<tokio_postgres::Config>().map_err(|e| invalid("database.url", e.to_string()))?;
            if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
                // The pool connects without TLS: refused here, naming the
                // setting, rather than as a TLS error at the first connect.
                return Err(invalid(
                    "database.url",
                    "sslmode=require (TLS) is not supported by this build; use sslmode=disable on a private network",
                ));
            }
        }
        if let Some(url) = &self.redis.url {
            if url.starts_with("rediss://") {
                // The Redis client is built without TLS: it would connect in
                // the clear while the operator believes otherwise.
                return Err(invalid(
                    "redis.url",
                    "rediss:// (TLS) is not supported by this build; use redis:// on a private network",
                ));
            }
            if !url.starts_with("redis://") {
                return Err(invalid("redis.url", "must be a redis:// URL"));
            }
        }
        if self.redis.url.is_some() && self.redis.cluster_nodes.is_some() {
            return Err(invalid("redis.cluster_nodes", "set either redis.url or redis.cluster_nodes, not both"));
        }
        if self.redis.cluster_nodes.is_some() {
            self.cluster_nodes()?;
        }
        if self.bus.prefix.is_empty() || self.bus.prefix.contains(['{', '}', ' ']) {
            return Err(invalid("bus.prefix", "must be non-empty without braces or spaces"));
        }
        if let Some(key) = &self.encryption.key {
            let bytes = base64_decode(key).map_err(|e| invalid("encryption.key", format!("not base64: {e}")))?;
            if bytes.len() != 32 {
                return Err(invalid("encryption.key", format!("must be 32 bytes, got {}", bytes.len())));
            }
        }
        if let Some(secret) = &self.cluster.secret {
            if secret.len() < 16 {
                return Err(invalid("cluster.secret", "must be at least 16 characters"));
            }
        }
        let positive: [(&'static str, u64); 34] = [
            ("http.handshake_timeout_ms", self.http.handshake_timeout_ms),
            ("terminals.max_per_host", self.terminals.max_per_host),
            ("terminals.max_per_user", self.terminals.max_per_user),
            ("viewer.max_per_terminal", self.viewer.max_per_terminal as u64),
            ("daemon.max_pending_requests", self.daemon.max_pending_requests as u64),
            ("credentials.refresh_before_ms", self.credentials.refresh_before_ms),
            ("credentials.check_ms", self.credentials.check_ms),
            ("audit.retention_ms", self.audit.retention_ms),
            ("auth.revocation_check_ms", self.auth.revocation_check_ms),
            ("http.ws_per_address", self.http.ws_per_address as u64),
            ("http.ws_per_user", self.http.ws_per_user as u64),
            ("viewer.slow_ms", self.viewer.slow_ms),
            ("lease.ttl_ms", self.lease.ttl_ms),
            ("lease.renew_ms", self.lease.renew_ms),
            ("bus.ack_ms", self.bus.ack_ms),
            ("bus.heartbeat_ms", self.bus.heartbeat_ms),
            ("bus.slot_check_ms", self.bus.slot_check_ms),
            ("sweep.interval_ms", self.sweep.interval_ms),
            ("sweep.stale_host_ms", self.sweep.stale_host_ms),
            ("sweep.launch_timeout_ms", self.sweep.launch_timeout_ms),
            ("daemon.hello_timeout_ms", self.daemon.hello_timeout_ms),
            ("daemon.idle_timeout_ms", self.daemon.idle_timeout_ms),
            ("viewer.in_use_ms", self.viewer.in_use_ms),
            ("viewer.fresh_ms", self.viewer.fresh_ms),
            ("viewer.ping_timeout_ms", self.viewer.ping_timeout_ms),
            ("shutdown.grace_ms", self.shutdown.grace_ms),
            ("cell.dead_man_base_ms", self.cell.dead_man_base_ms),
            ("cell.held_retry_ms", self.cell.held_retry_ms),
            ("cell.switch_poll_ms", self.cell.switch_poll_ms),
            ("cell.effective_refresh_ms", self.cell.effective_refresh_ms),
            ("cell.effective_forced_ms", self.cell.effective_forced_ms),
            ("director.poll_ms", self.director.poll_ms),
            ("director.fresh_ms", self.director.fresh_ms),
            ("director.effective_fresh_ms", self.director.effective_fresh_ms),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(invalid(key, "must be positive"));
            }
        }
        // None of the cell's timings means anything past a month, and a
        // month keeps every deadline sum (a dead-man window is base +
        // spread) far from overflowing.
        let bounded = [
            ("cell.dead_man_base_ms", self.cell.dead_man_base_ms),
            ("cell.dead_man_spread_ms", self.cell.dead_man_spread_ms),
            ("cell.held_retry_ms", self.cell.held_retry_ms),
            ("cell.switch_poll_ms", self.cell.switch_poll_ms),
            ("cell.effective_refresh_ms", self.cell.effective_refresh_ms),
            ("cell.effective_forced_ms", self.cell.effective_forced_ms),
            ("cell.slot_stale_ms", self.cell.slot_stale_ms),
            ("cell.recent_seat_ms", self.cell.recent_seat_ms),
        ];
        for (key, value) in bounded {
            if value > MAX_TIMING_MS {
                return Err(invalid(key, format!("must be at most {MAX_TIMING_MS} (30 days)")));
            }
        }
        self.validate_cell()?;
        if self.lease.renew_ms >= self.lease.ttl_ms {
            return Err(invalid("lease.renew_ms", "must be below lease.ttl_ms, or leases lapse between renewals"));
        }
        if self.sweep.stale_host_ms < self.lease.ttl_ms {
            return Err(invalid("sweep.stale_host_ms", "must be at least lease.ttl_ms"));
        }
        if self.viewer.fresh_ms > self.viewer.in_use_ms {
            return Err(invalid("viewer.fresh_ms", "must not exceed viewer.in_use_ms"));
        }
        if self.bus.inbox_messages == 0 {
            return Err(invalid("bus.inbox_messages", "must be at least 1"));
        }
        if self.viewer.queue_bytes < 64 * 1024 {
            return Err(invalid("viewer.queue_bytes", "must be at least 65536"));
        }
        // A viewer at the soft bound (half its queue) may still receive a
        // whole window before the stream pauses: that must fit the queue.
        if self.daemon.window_bytes < 4096 || self.daemon.window_bytes > (self.viewer.queue_bytes / 2) as u64 {
            return Err(invalid("daemon.window_bytes", "must be at least 4096 and at most half of viewer.queue_bytes"));
        }
        if self.director.fresh_ms < self.director.poll_ms {
            return Err(invalid("director.fresh_ms", "must be at least director.poll_ms"));
        }
        // The oldest a live cell's row can look to a director: a refresh
        // period, a writer tick late, read by a poll up to a period ago.
        let refresh = ms(self.cell.effective_refresh_ms);
        let oldest = refresh + crate::cell::effective::tick_for(refresh) + ms(self.director.poll_ms);
        if oldest >= ms(self.director.effective_fresh_ms) {
            return Err(invalid(
                "cell.effective_refresh_ms",
                "plus its writer's tick (a quarter of it, at most 1000) and director.poll_ms must be below \
                 director.effective_fresh_ms, or effective rows go stale between writes",
            ));
        }
        if self.credentials.check_ms > self.credentials.refresh_before_ms {
            return Err(invalid(
                "credentials.check_ms",
                "must not exceed credentials.refresh_before_ms, or credentials may expire between checks",
            ));
        }
        if self.runs.lost_after == 0 {
            return Err(invalid("runs.lost_after", "must be positive"));
        }
        Ok(())
    }

    /// The cell's identity and the timings the slot cap counts on
    /// (docs/CELLS.md).
    fn validate_cell(&self) -> Result<(), ConfigError> {
        if let Some(id) = &self.cell.id {
            if !valid_cell_id(id) {
                // An instance id is `<cell id>#<suffix>`, and the admin
                // API names a cell in its path.
                return Err(invalid(
                    "cell.id",
                    "must be 1 to 128 characters without `#`, `/`, spaces or control characters",
                ));
            }
        }
        let region = &self.cell.region;
        if region.chars().count() > 64 || region.chars().any(char::is_control) {
            return Err(invalid("cell.region", "must be at most 64 characters, without control characters"));
        }
        if let Some(url) = &self.cell.url {
            let uri = url.parse::<actix_web::http::Uri>().ok();
            let web = uri.is_some_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some());
            if !web {
                return Err(invalid("cell.url", format!("`{url}` is not an http:// or https:// URL")));
            }
            // A daemon sent here by another cell learns the URL from a
            // close frame's reason, which holds at most 120 bytes.
            if url.len() > crate::cell::MAX_CELL_URL_BYTES {
                return Err(invalid(
                    "cell.url",
                    format!(
                        "must be at most {} bytes: a wrong cell's 4409 names it in a close reason",
                        crate::cell::MAX_CELL_URL_BYTES
                    ),
                ));
            }
        }
        // A tripped cell's row may go unwritten for effective_forced_ms
        // while its pool has waiters; its slot must not read free meanwhile.
        if self.cell.slot_stale_ms <= self.cell.effective_refresh_ms.max(self.cell.effective_forced_ms) {
            return Err(invalid(
                "cell.slot_stale_ms",
                "must exceed cell.effective_refresh_ms and cell.effective_forced_ms, or a tripped cell's slot \
                 reads free while the cell still holds it",
            ));
        }
        Ok(())
    }

    /// The parsed listen address (validated at load).
    pub fn listen_addr(&self) -> SocketAddr {
        self.http.listen.parse().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 8080)))
    }

    /// Redis Cluster seeds as (host, port) pairs.
    pub fn cluster_nodes(&self) -> Result<Vec<(String, u16)>, ConfigError> {
        let Some(nodes) = &self.redis.cluster_nodes else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for node in nodes.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let (host, port) = node
                .rsplit_once(':')
                .ok_or_else(|| invalid("redis.cluster_nodes", format!("`{node}` is not host:port")))?;
            let port =
                port.parse::<u16>().map_err(|_| invalid("redis.cluster_nodes", format!("`{node}` has a bad port")))?;
            out.push((host.to_string(), port));
        }
        if out.is_empty() {
            return Err(invalid("redis.cluster_nodes", "lists no node"));
        }
        Ok(out)
    }

    /// The cell id: the setting, else the host name.
    pub fn cell_id(&self) -> String {
        self.cell.id.clone().unwrap_or_else(|| gethostname::gethostname().to_string_lossy().into_owned())
    }

    /// The cell's pool in reserve mode: `cell.reserve_pool_size`, else a
    /// quarter of `database.pool_size` (at least 1). A reserve cell reads
    /// nothing to admit a booked hello; what is left is the claim's writes,
    /// the batched lease renewal and the periodic jobs, which a quarter of
    /// the full pool carries while the fleet's budget gains three quarters.
    pub fn reserve_pool_size(&self) -> usize {
        self.cell.reserve_pool_size.unwrap_or_else(|| self.database.pool_size.div_ceil(4)).max(1)
    }

    /// The credentials encryption key, when configured (validated at load).
    pub fn encryption_key(&self) -> Option<[u8; 32]> {
        let bytes = base64_decode(self.encryption.key.as_deref()?).ok()?;
        bytes.try_into().ok()
    }
}

fn base64_decode(s: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s.trim())
}

/// Milliseconds as a `Duration`.
pub fn ms(value: u64) -> Duration {
    Duration::from_millis(value)
}

/// Whether `id` can be a cell's id: 1 to 128 characters without `#`, `/`,
/// spaces, control characters or U+FFFD (an instance id is `<cell
/// id>#<suffix>`, and ids travel in URL paths, where a byte that is not
/// UTF-8 decodes to U+FFFD: two different paths must not name one cell).
pub fn valid_cell_id(id: &str) -> bool {
    let bad = |c: char| c.is_control() || c.is_whitespace() || c == '#' || c == '/' || c == char::REPLACEMENT_CHARACTER;
    !id.is_empty() && id.chars().count() <= 128 && !id.chars().any(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn defaults_match_spec() {
        let s = Settings::load_from(None, &env(&[])).unwrap();
        assert_eq!(s.http.listen, "127.0.0.1:8080");
        assert_eq!(s.database.sqlite_path, PathBuf::from("./tether.db"));
        assert_eq!(s.lease.ttl_ms, 30_000);
        assert_eq!(s.lease.renew_ms, 10_000);
        assert_eq!(s.viewer.ping_timeout_ms, 1_500);
        assert_eq!(s.bus.prefix, "tether");
    }

    /// A text setting given in the environment is taken as written, even
    /// when it looks like a number (it used to be parsed as one and
    /// written back: `007` became `7`, a long secret `1.2e22`).
    #[test]
    fn environment_text_that_looks_like_a_number_is_kept() {
        let secret = "0000000000000000000001";
        let s = Settings::load_from(
            None,
            &env(&[("TETHER_CELL__ID", "007"), ("TETHER_CELL__REGION", "1e3"), ("TETHER_CLUSTER__SECRET", secret)]),
        )
        .unwrap();
        assert_eq!((s.cell.id.as_deref(), s.cell.region.as_str()), (Some("007"), "1e3"));
        assert_eq!(s.cluster.secret.as_deref(), Some(secret));
        let s = Settings::load_from(None, &env(&[("TETHER_LEASE__TTL_MS", "40000")])).unwrap();
        assert_eq!(s.lease.ttl_ms, 40_000, "numbers are still numbers");
    }

    #[test]
    fn environment_overrides_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "[http]\nlisten = \"127.0.0.1:9000\"\n[lease]\nttl_ms = 40000\n").unwrap();
        let s = Settings::load_from(Some(&path), &env(&[("TETHER_LEASE__TTL_MS", "50000")])).unwrap();
        assert_eq!(s.http.listen, "127.0.0.1:9000");
        assert_eq!(s.lease.ttl_ms, 50_000);
    }

    #[test]
    fn a_tls_redis_url_is_refused_rather_than_used_in_the_clear() {
        let err = Settings::load_from(None, &env(&[("TETHER_REDIS__URL", "rediss://10.0.0.5:6380")])).unwrap_err();
        assert!(err.to_string().contains("redis.url") && err.to_string().contains("TLS"), "{err}");
        assert!(Settings::load_from(None, &env(&[("TETHER_REDIS__URL", "redis://10.0.0.5:6379")])).is_ok());
    }

    #[test]
    fn a_postgres_url_that_requires_tls_is_refused_naming_the_key() {
        let url = "postgres://u@10.0.0.5/tether?sslmode=require";
        let err = Settings::load_from(None, &env(&[("TETHER_DATABASE__URL", url)])).unwrap_err();
        assert!(err.to_string().contains("database.url") && err.to_string().contains("TLS"), "{err}");
        for plain in ["postgres://u@10.0.0.5/tether?sslmode=disable", "postgres://u@10.0.0.5/tether"] {
            assert!(Settings::load_from(None, &env(&[("TETHER_DATABASE__URL", plain)])).is_ok(), "{plain}");
        }
    }

    #[test]
    fn bad_values_name_their_key() {
        let err = Settings::load_from(None, &env(&[("TETHER_LEASE__RENEW_MS", "30000")])).unwrap_err();
        assert!(err.to_string().contains("lease.renew_ms"), "{err}");
        let err = Settings::load_from(None, &env(&[("TETHER_LEASE__TTL_MS", "soon")])).unwrap_err();
        assert!(err.to_string().contains("lease.ttl_ms"), "{err}");
        let err = Settings::load_from(None, &env(&[("TETHER_HTTP__LISTEN", "nowhere")])).unwrap_err();
        assert!(err.to_string().contains("http.listen"), "{err}");
        let err = Settings::load_from(None, &env(&[("TETHER_ENCRYPTION__KEY", "c2hvcnQ=")])).unwrap_err();
        assert!(err.to_string().contains("encryption.key"), "{err}");
    }

    /// Each (variable, value) alone is refused with an error naming the key.
    fn assert_refused(refused: &[(&str, &str, &str)]) {
        for (key, value, named) in refused {
            let err = Settings::load_from(None, &env(&[(key, value)])).unwrap_err();
            assert!(err.to_string().contains(named), "{key}={value}: {err}");
        }
    }

    #[test]
    fn hardening_settings_are_checked() {
        let refused = [
            ("TETHER_HTTP__TRUSTED_PROXIES", "10.0.0.0/8, not-a-cidr", "http.trusted_proxies"),
            ("TETHER_HTTP__TRUSTED_PROXIES", "10.0.0.0/40", "http.trusted_proxies"),
            ("TETHER_METRICS__LISTEN", "nowhere", "metrics.listen"),
            ("TETHER_METRICS__LISTEN", "127.0.0.1:8080", "metrics.listen"),
            ("TETHER_HTTP__WS_PER_USER", "0", "http.ws_per_user"),
            ("TETHER_AUDIT__RETENTION_MS", "0", "audit.retention_ms"),
        ];
        assert_refused(&refused);
        let s = Settings::load_from(
            None,
            &env(&[
                ("TETHER_HTTP__TRUSTED_PROXIES", "10.0.0.0/8, 192.0.2.1"),
                ("TETHER_METRICS__LISTEN", "127.0.0.1:9090"),
            ]),
        )
        .unwrap();
        assert_eq!(s.http.trusted_proxies, vec!["10.0.0.0/8".to_string(), "192.0.2.1".to_string()]);
        assert_eq!(s.metrics.listen.as_deref(), Some("127.0.0.1:9090"));
        let defaults = Settings::default();
        assert_eq!((defaults.http.ws_per_address, defaults.http.ws_per_user), (256, 1024));
        assert_eq!(defaults.audit.retention_ms, 90 * 24 * 3600 * 1000);
        assert!(defaults.http.trusted_proxies.is_empty() && defaults.metrics.listen.is_none());
    }

    /// Cell settings that would break the cell: an id that is not one, a
    /// URL the director cannot call, a slot that reads free while held, a
    /// dead-man window that wraps.
    #[test]
    fn cell_settings_are_checked() {
        let long = "c".repeat(129);
        let long_url = format!("https://{}.example", "c".repeat(105));
        let refused = [
            ("TETHER_CELL__URL", long_url.as_str(), "cell.url"),
            ("TETHER_CELL__ID", "", "cell.id"),
            ("TETHER_CELL__ID", "a#b", "cell.id"),
            ("TETHER_CELL__ID", "a/b", "cell.id"),
            ("TETHER_CELL__ID", long.as_str(), "cell.id"),
            ("TETHER_CELL__URL", "notaurl", "cell.url"),
            ("TETHER_CELL__URL", "ftp://x", "cell.url"),
            ("TETHER_CELL__REGION", "a\tb", "cell.region"),
            ("TETHER_CELL__SLOT_STALE_MS", "1000", "cell.slot_stale_ms"),
            ("TETHER_CELL__SLOT_STALE_MS", "300000", "cell.slot_stale_ms"),
            ("TETHER_CELL__DEAD_MAN_BASE_MS", "18446744073709551615", "cell.dead_man_base_ms"),
            ("TETHER_CELL__DEAD_MAN_SPREAD_MS", "18446744073709551615", "cell.dead_man_spread_ms"),
        ];
        assert_refused(&refused);
        let s = Settings::load_from(
            None,
            &env(&[("TETHER_CELL__ID", "relay-7.eu_west"), ("TETHER_CELL__URL", "https://relay-7.example:8443")]),
        )
        .unwrap();
        assert_eq!(s.cell_id(), "relay-7.eu_west");
        assert!(Settings::load_from(None, &env(&[("TETHER_CELL__ID", "a\u{fffd}b")])).is_err());
    }

    #[test]
    fn an_effective_row_must_stay_fresh_for_the_director_between_writes() {
        let load = |refresh: &str, fresh: &str| {
            Settings::load_from(
                None,
                &env(&[
                    ("TETHER_CELL__EFFECTIVE_REFRESH_MS", refresh),
                    ("TETHER_DIRECTOR__EFFECTIVE_FRESH_MS", fresh),
                    ("TETHER_DIRECTOR__POLL_MS", "2000"),
                ]),
            )
        };
        // A refresh, its tick (500 ms) and a poll (2 s) past the freshness.
        let err = load("2000", "2001").unwrap_err().to_string();
        assert!(err.contains("cell.effective_refresh_ms"), "{err}");
        assert!(load("2000", "4500").is_err());
        assert!(load("2000", "4501").is_ok());
        assert!(load("15000", "45000").is_ok());
    }

    #[test]
    fn unknown_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "[lease]\nttl = 5\n").unwrap();
        let err = Settings::load_from(Some(&path), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("ttl"), "{err}");
    }

    #[test]
    fn tls_paths_come_in_pairs() {
        let err = Settings::load_from(None, &env(&[("TETHER_HTTP__TLS_CERT_PATH", "/c.pem")])).unwrap_err();
        assert!(err.to_string().contains("http.tls_key_path"), "{err}");
        let s = Settings::load_from(
            None,
            &env(&[("TETHER_HTTP__TLS_CERT_PATH", "/c.pem"), ("TETHER_HTTP__TLS_KEY_PATH", "/k.pem")]),
        )
        .unwrap();
        assert_eq!(s.http.tls_key_path, Some(PathBuf::from("/k.pem")));
    }

    #[test]
    fn allowed_origins_from_a_list_or_commas() {
        let s = Settings::load_from(
            None,
            &env(&[("TETHER_HTTP__ALLOWED_ORIGINS", "https://a.example, http://b.example:8080")]),
        )
        .unwrap();
        assert_eq!(s.http.allowed_origins, vec!["https://a.example", "http://b.example:8080"]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "[http]\nallowed_origins = [\"https://c.example\"]\n").unwrap();
        let s = Settings::load_from(Some(&path), &env(&[])).unwrap();
        assert_eq!(s.http.allowed_origins, vec!["https://c.example"]);
        let err =
            Settings::load_from(None, &env(&[("TETHER_HTTP__ALLOWED_ORIGINS", "https://a.example/path")])).unwrap_err();
        assert!(err.to_string().contains("http.allowed_origins"), "{err}");
        let err = Settings::load_from(None, &env(&[("TETHER_HTTP__WEB_DIR", "/nonexistent")])).unwrap_err();
        assert!(err.to_string().contains("http.web_dir"), "{err}");
    }

    #[test]
    fn cluster_nodes_parse() {
        let s = Settings::load_from(None, &env(&[("TETHER_REDIS__CLUSTER_NODES", "127.0.0.1:7000, 127.0.0.1:7001")]))
            .unwrap();
        assert_eq!(s.cluster_nodes().unwrap().len(), 2);
        let err = Settings::load_from(None, &env(&[("TETHER_REDIS__CLUSTER_NODES", "nope")])).unwrap_err();
        assert!(err.to_string().contains("redis.cluster_nodes"), "{err}");
    }
}
