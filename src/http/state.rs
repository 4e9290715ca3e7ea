//! What every request handler shares: settings, the store, this instance's
//! identity and the metrics handle; token authentication and the `AuthUser`
//! extractor.

use std::sync::Arc;

use actix::{Actor, Addr};
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use uuid::Uuid;

use super::error::ApiError;
use crate::auth::{self, Principal};
use crate::bus::Bus;
use crate::cell::state::CellState;
use crate::config::ConfigError;
use crate::config::{ms, Settings};
use crate::director::ticket::TicketKey;
use crate::jobs::runs::RunDispatcher;
use crate::jobs::sweep::Sweeper;
use crate::metrics::Metrics;
use crate::relay::arbiter::ArbiterConfig;
use crate::relay::grid::GridTimings;
use crate::relay::limiter::AddressLimiter;
use crate::relay::registry::HostRegistry;
use crate::relay::requests::{serve_bus, PendingRequests};
use crate::relay::RelayContext;
use crate::store::{HostAdmission, Store};

/// The role a `tether serve` process plays (docs/ARCHITECTURE.md, "Processes and roles").
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Serves everything.
    Combined,
    /// Serves the relay.
    Cell,
    /// Serves placement only.
    Director,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Combined => "combined",
            Role::Cell => "cell",
            Role::Director => "director",
        }
    }
}

/// This process's identity in the cluster.
#[derive(Debug, Clone)]
pub struct Instance {
    /// `<cell id>#<6 hex chars, new each boot>`.
    pub instance_id: String,
    pub cell_id: String,
    pub role: Role,
}

impl Instance {
    pub fn new(cell_id: String, role: Role) -> Self {
        let suffix = &Uuid::new_v4().simple().to_string()[..6];
        Self { instance_id: format!("{cell_id}#{suffix}"), cell_id, role }
    }
}

/// Shared by all handlers (`web::Data<AppState>`).
pub struct AppState {
    pub settings: Arc<Settings>,
    pub store: Arc<dyn Store>,
    pub instance: Instance,
    pub metrics: Metrics,
    pub relay: RelayContext,
    pub limiter: AddressLimiter,
    /// Every token lookup of this instance goes through it (folded).
    pub token_lookups: super::token_lookups::TokenLookups,
    /// `http.trusted_proxies`, parsed.
    pub trusted_proxies: Vec<super::client_addr::Cidr>,
    pub runs: Addr<RunDispatcher>,
    /// Set when the drain starts: no new socket is taken from then on.
    pub draining: std::sync::atomic::AtomicBool,
}

impl AppState {
    /// Starts this instance's relay actors (the registry, the run
    /// dispatcher) and its bus on the current actix system.
    pub fn start(
        settings: Arc<Settings>,
        store: Arc<dyn Store>,
        instance: Instance,
    ) -> Result<web::Data<Self>, ConfigError> {
        let (bus, inbox) = Bus::from_settings(&settings, &instance.instance_id)?;
        let bus = Arc::new(bus);
        // Daemon-reported facts not stored yet, waited for by the drain.
        let owed_writes: Arc<crate::relay::owed::Owed> = Arc::default();
        let arbiter_config = ArbiterConfig {
            timings: GridTimings {
                in_use: ms(settings.viewer.in_use_ms),
                fresh: ms(settings.viewer.fresh_ms),
                ping_timeout: ms(settings.viewer.ping_timeout_ms),
            },
            ring_bytes: 512 * 1024,
            soft_queue_bytes: settings.viewer.queue_bytes / 2,
            slow: ms(settings.viewer.slow_ms),
            input_queue_limit: crate::relay::INPUT_QUEUE_LIMIT,
            run_log_max_bytes: settings.runs.log_max_bytes,
            window_bytes: settings.daemon.window_bytes,
            max_viewers: settings.viewer.max_per_terminal,
            owed_writes: owed_writes.clone(),
        };
        let registry = HostRegistry::new(
            store.clone(),
            instance.instance_id.clone(),
            ms(settings.lease.ttl_ms),
            ms(settings.lease.renew_ms),
            ms(settings.daemon.idle_timeout_ms),
            arbiter_config,
            bus.clone(),
        )
        .start();
        let tickets = settings.cluster.secret.as_deref().and_then(|s| TicketKey::new(s.as_bytes()).ok());
        let cell = CellState::new(
            instance.cell_id.clone(),
            instance.instance_id.clone(),
            tickets,
            settings.cell.seat_capacity,
            ms(settings.cell.recent_seat_ms),
        );
        let relay = RelayContext {
            store: store.clone(),
            registry,
            settings: settings.clone(),
            instance_id: instance.instance_id.clone(),
            cell_id: instance.cell_id.clone(),
            cell: Arc::new(cell),
            bus: bus.clone(),
            requests: Arc::new(PendingRequests::default()),
            remotes: Arc::new(crate::relay::remote::Remotes::default()),
            audit: crate::audit::AuditLog::start(store.clone(), instance.instance_id.clone()),
            tokens: Arc::new(crate::relay::token_watch::TokenWatch::default()),
            claims: crate::relay::claims::HostClaims::default(),
            releases: crate::relay::releases::LeaseReleases::start(store.clone()),
            writes: owed_writes,
        };
        actix_rt::spawn(relay.tokens.clone().run(store.clone(), ms(settings.auth.revocation_check_ms)));
        actix_rt::spawn(serve_bus(relay.clone(), inbox));
        actix_rt::spawn(crate::relay::remote::heartbeat(relay.clone()));
        actix_rt::spawn(crate::relay::remote::watch_waiting(relay.clone()));
        let runs = RunDispatcher::new(relay.clone()).start();
        Sweeper::new(relay.clone()).start();
        crate::jobs::credentials::CredentialsRefresher::new(relay.clone()).start();
        let metrics = Metrics::install(instance.role != Role::Director);
        Ok(web::Data::new(Self {
            trusted_proxies: super::client_addr::trusted(&settings.http.trusted_proxies),
            token_lookups: super::token_lookups::TokenLookups::start(store.clone()),
            settings,
            store,
            instance,
            metrics,
            relay,
            limiter: AddressLimiter::default(),
            runs,
            draining: std::sync::atomic::AtomicBool::new(false),
        }))
    }
}

impl AppState {
    /// Starts the bus subscriber (docs/CLUSTER.md, "The bus"): called once
    /// the HTTP listener is bound, so an instance is never heard on the bus
    /// before it can serve what it hears.
    pub fn start_bus_subscriber(&self) {
        actix_rt::spawn(subscribe_replies(self.relay.clone()));
    }
}

/// Subscribes this instance's reply channel, retrying with backoff until
/// Redis confirms it, then re-asserts a slice of the subscriptions each
/// `bus.heartbeat_ms`, every one of them once in `bus::REASSERT_SLICES`
/// heartbeats (a slot migration can drop a shard subscription without a
/// reconnect), and on a Redis Cluster at once those whose slot moved
/// (`bus.slot_check_ms`).
async fn subscribe_replies(relay: RelayContext) {
    let channel = relay.bus.reply_channel(&relay.instance_id);
    let mut delay = std::time::Duration::from_millis(100);
    loop {
        match relay.bus.subscribe(&channel).await {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(error = %e, "tether_bus_subscribe_failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(10));
            }
        }
    }
    tracing::info!(%channel, "tether_bus_subscribed");
    if !relay.bus.is_shared() {
        return;
    }
    let watcher = relay.clone();
    tokio::spawn(async move { watcher.bus.watch_slots(ms(watcher.settings.bus.slot_check_ms)).await });
    let mut every = tokio::time::interval(ms(relay.settings.bus.heartbeat_ms));
    every.tick().await;
    for tick in 0.. {
        every.tick().await;
        relay.bus.reassert(tick).await;
    }
}

/// The principal of a request the route table let through
/// (`super::routes`): its user, token id and scope.
pub struct AuthUser(pub Principal);

impl AuthUser {
    /// The caller's user id.
    pub fn id(&self) -> Uuid {
        self.0.user.id
    }
}

/// The principal of a presented token: 401 unless the token exists, is
/// not revoked and has not expired. The same round trip (shared with the
/// lookups of concurrent requests, `super::token_lookups`) stamps the
/// token's last use (at most once a minute, `store::LAST_USED_EVERY`) and,
/// for a token bound to a host, reads that host as a daemon's hello checks
/// it.
pub async fn authenticate(
    state: &AppState,
    token: Option<String>,
) -> Result<(Principal, Option<HostAdmission>), ApiError> {
    let token = token.filter(|t| auth::looks_like_token(t)).ok_or_else(ApiError::unauthorized)?;
    let hash = auth::hash_token(&token);
    let found = state.token_lookups.find(hash).await?.ok_or_else(ApiError::unauthorized)?;
    Ok((Principal::new(found.user, &found.token), found.bound_host))
}

impl FromRequest for AuthUser {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, Self::Error>>;

    /// Set by the route table's middleware before any other extractor runs;
    /// a handler outside the table has none (a bug: 500, never a pass).
    fn from_request(req: &HttpRequest, _payload: &mut actix_web::dev::Payload) -> Self::Future {
        std::future::ready(req.extensions().get::<Principal>().cloned().map(AuthUser).ok_or_else(|| {
            tracing::error!(path = req.path(), "tether_route_without_principal");
            ApiError::internal()
        }))
    }
}
