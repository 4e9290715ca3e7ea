//! The bus over Redis (fred): PUBLISH/SUBSCRIBE on a standalone server,
//! SPUBLISH/SSUBSCRIBE on a Redis Cluster (docs/CLUSTER.md).
//!
//! Two connections per instance: a client that publishes (and answers
//! readiness pings) and one subscriber. fred hands received messages to a
//! broadcast channel that drops the oldest when a reader lags; a pump task
//! moves them into the instance's bounded inbox at once and turns any lag
//! into a reported gap. A subscription is confirmed by asking Redis how
//! many subscribers the channel has (`PUBSUB NUMSUB` / `SHARDNUMSUB`),
//! because fred's subscribe has been seen to return before another
//! connection's publish counted it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use fred::bytes_utils::Str;
use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::cluster::ClusterRouting;
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::broadcast;

use super::{decode, BusError, Inbound, Inbox};
use crate::config::{ConfigError, Settings};

/// Messages fred may hold for the pump before it counts as lag.
const SUBSCRIBER_BUFFER: usize = 64 * 1024;
/// How long a new subscription may take to show up in Redis's counts.
const CONFIRM: Duration = Duration::from_secs(5);

/// A PUBLISH handed to the connection, waiting for the subscriber count.
pub type Publishing<'a> = Pin<Box<dyn Future<Output = Result<u64, BusError>> + Send + 'a>>;

/// The longest wait between two attempts to reach Redis again. Both
/// clients (the publisher and the subscriber) back off on their own: with
/// a long cap, one of them could come back many seconds after the other,
/// and meanwhile requests across instances read "nobody listens" for hosts
/// that are online. An attempt to reach a Redis that is away costs nothing.
const RECONNECT_MAX_MS: u32 = 2_000;

/// A connected (and reconnecting) Redis client.
#[derive(Clone)]
pub struct RedisLink {
    client: Client,
    clustered: bool,
}

impl RedisLink {
    /// True when Redis answers a PING within a second.
    pub async fn ping(&self) -> Result<(), String> {
        match tokio::time::timeout(Duration::from_secs(1), self.client.ping::<String>(None)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within 1 s".into()),
        }
    }

    /// Whether Redis counts a subscriber on `channel`, asked within a
    /// second (on a Redis Cluster, of the shard that serves the channel):
    /// for `/readyz`, whether this instance is subscribed again after
    /// Redis came back, not only whether Redis answers.
    pub async fn subscribed(&self, channel: &str) -> Result<bool, String> {
        let counts = async {
            if self.clustered {
                self.client.pubsub_shardnumsub::<Vec<(String, i64)>, _>(channel).await
            } else {
                self.client.pubsub_numsub::<Vec<(String, i64)>, _>(channel).await
            }
        };
        match tokio::time::timeout(Duration::from_secs(1), counts).await {
            Ok(Ok(counts)) => Ok(counts.iter().any(|(name, n)| name == channel && *n > 0)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer within 1 s".into()),
        }
    }
}

pub struct RedisBus {
    link: RedisLink,
    subscriber: SubscriberClient,
    clustered: bool,
}

fn redis_error(e: Error) -> BusError {
    BusError::Redis(e.to_string())
}

impl RedisBus {
    /// Builds the clients the settings describe (or `None` without Redis)
    /// and starts connecting in the background, retrying with backoff.
    pub fn from_settings(settings: &Settings, inbox: Inbox) -> Result<Option<Self>, ConfigError> {
        let (config, clustered) = if let Some(url) = &settings.redis.url {
            let config =
                Config::from_url(url).map_err(|e| ConfigError::Invalid { key: "redis.url", message: e.to_string() })?;
            (config, false)
        } else if settings.redis.cluster_nodes.is_some() {
            (Config { server: ServerConfig::new_clustered(settings.cluster_nodes()?), ..Config::default() }, true)
        } else {
            return Ok(None);
        };
        let key = if clustered { "redis.cluster_nodes" } else { "redis.url" };
        let invalid = |e: Error| ConfigError::Invalid { key, message: e.to_string() };
        let policy = ReconnectPolicy::new_exponential(0, 100, RECONNECT_MAX_MS, 2);
        let client = Builder::from_config(config.clone()).set_policy(policy.clone()).build().map_err(invalid)?;
        let subscriber = Builder::from_config(config)
            .with_performance_config(|p| p.broadcast_channel_capacity = SUBSCRIBER_BUFFER)
            .set_policy(policy)
            .build_subscriber_client()
            .map_err(invalid)?;
        let messages = subscriber.message_rx();
        tokio::spawn(log_connection_errors(client.error_rx()));
        let _connection = client.connect();
        // Before connecting, so that the first connection's announcement is heard.
        tokio::spawn(resubscribe(subscriber.clone(), clustered));
        let _subscriber_connection = subscriber.connect();
        tokio::spawn(pump(messages, inbox));
        Ok(Some(Self { link: RedisLink { client, clustered }, subscriber, clustered }))
    }

    pub fn link(&self) -> &RedisLink {
        &self.link
    }
}

/// How often at most a connection error of the bus is logged.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(30);

/// Logs the publishing client's connection errors (Redis refused, reset,
/// unreachable), at most one line per [`ERROR_LOG_EVERY`] with how many
/// came since the last: an instance whose Redis is away says why in its
/// log, not only in `/readyz`. The subscriber's connection fails the same
/// way and is not logged twice.
async fn log_connection_errors(mut errors: broadcast::Receiver<(Error, Option<Server>)>) {
    let mut logged: Option<std::time::Instant> = None;
    let mut unlogged = 0u64;
    loop {
        match errors.recv().await {
            Ok((error, server)) => {
                unlogged += 1;
                if logged.is_none_or(|at| at.elapsed() >= ERROR_LOG_EVERY) {
                    let server = server.map(|s| s.to_string());
                    tracing::warn!(%error, ?server, errors = unlogged, "tether_bus_connection_error");
                    logged = Some(std::time::Instant::now());
                    unlogged = 0;
                }
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => unlogged += missed,
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

impl RedisBus {
    /// Hands a PUBLISH of `payload` to the connection's command queue now
    /// and returns what waits for Redis's answer. fred queues a command
    /// when its future is first polled, so one poll here (with a waker that
    /// does nothing; the caller's await polls it again with its own) puts
    /// it on the wire in the order of the calls, which `Bus::publish` makes
    /// the order of the sequence numbers. tests/bus.rs checks that order
    /// with several threads publishing on one channel.
    ///
    /// With `fail_fast`, a PUBLISH that finds the connection away fails at
    /// once, and one in flight when it drops fails rather than being sent
    /// again after the reconnect: for a request whose caller answers its
    /// client, which must not be carried out after that answer said it
    /// failed. Without it, fred holds the command until Redis is back.
    pub fn hand_over<'a>(&'a self, channel: &'a str, payload: Bytes, fail_fast: bool) -> Publishing<'a> {
        let mut publishing: Publishing<'a> = Box::pin(self.publish(channel, payload, fail_fast));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match publishing.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(answer) => Box::pin(std::future::ready(answer)),
            std::task::Poll::Pending => publishing,
        }
    }

    async fn publish(&self, channel: &str, payload: Bytes, fail_fast: bool) -> Result<u64, BusError> {
        let client = self.link.client.with_options(&Options { fail_fast, ..Options::default() });
        let receivers: i64 = if self.clustered {
            client.spublish(channel, payload).await.map_err(redis_error)?
        } else {
            client.publish(channel, payload).await.map_err(redis_error)?
        };
        Ok(u64::try_from(receivers).unwrap_or(0))
    }

    pub async fn subscribe(&self, channel: &str) -> Result<(), BusError> {
        if self.clustered {
            self.subscriber.ssubscribe(channel).await.map_err(redis_error)?;
        } else {
            self.subscriber.subscribe(channel).await.map_err(redis_error)?;
        }
        self.confirm(channel).await
    }

    /// Waits until Redis counts a subscriber on `channel`.
    async fn confirm(&self, channel: &str) -> Result<(), BusError> {
        let deadline = tokio::time::Instant::now() + CONFIRM;
        loop {
            let counts: Result<Vec<(String, i64)>, Error> = if self.clustered {
                self.link.client.pubsub_shardnumsub(channel).await
            } else {
                self.link.client.pubsub_numsub(channel).await
            };
            if counts.is_ok_and(|c| c.iter().any(|(name, n)| name == channel && *n > 0)) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(BusError::NotConfirmed(channel.to_string()));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn unsubscribe(&self, channel: &str) {
        let result = if self.clustered {
            self.subscriber.sunsubscribe(channel).await
        } else {
            self.subscriber.unsubscribe(channel).await
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, %channel, "tether_bus_unsubscribe_failed");
        }
    }

    /// The cluster's slot map, from a fresh read (one CLUSTER SLOTS);
    /// `None` on a standalone server or when the map cannot be read now.
    pub async fn slot_map(&self) -> Option<SlotMap> {
        if !self.clustered {
            return None;
        }
        if let Err(e) = self.link.client.sync_cluster().await {
            tracing::warn!(error = %e, "tether_bus_slot_map_failed");
            return None;
        }
        let routing = self.link.client.cached_cluster_state()?;
        Some(SlotMap(routing.slots().iter().map(|r| (r.start, r.end, r.primary.to_string())).collect()))
    }

    pub fn is_clustered(&self) -> bool {
        self.clustered
    }

    /// Subscribes `channels` again (`subscribe_again`).
    pub async fn reassert(&self, channels: &[String]) {
        if self.clustered {
            // Route by the cluster's current slot map, not a stale one.
            if let Err(e) = self.subscriber.sync_cluster().await {
                tracing::warn!(error = %e, "tether_bus_slot_map_failed");
            }
        }
        subscribe_again(&self.subscriber, self.clustered, channels.iter().map(|c| Str::from(c.as_str())).collect())
            .await;
        metrics::counter!("tether_bus_reasserts_total").increment(1);
    }
}

/// Hash slots in a Redis Cluster.
const SLOTS: usize = 16384;

/// A Redis Cluster's slot map as one read showed it: ranges of hash slots,
/// each with the address of the primary that serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMap(Vec<(u16, u16, String)>);

impl SlotMap {
    /// The primary of each hash slot (`None`: no primary serves it).
    fn owners(&self) -> Vec<Option<&str>> {
        let mut owners = vec![None; SLOTS];
        for (start, end, primary) in &self.0 {
            for owner in owners.iter_mut().take(usize::from(*end) + 1).skip(usize::from(*start)) {
                *owner = Some(primary.as_str());
            }
        }
        owners
    }

    /// Which hash slots a primary serves now that another primary (or
    /// none) served in `before`, indexed by slot; `None` when no slot
    /// moved. An unchanged map is one comparison of its few ranges, so
    /// the slot watcher's tick does not grow with the subscriptions.
    pub fn moved_since(&self, before: &SlotMap) -> Option<Vec<bool>> {
        if self == before {
            return None;
        }
        let (now, was) = (self.owners(), before.owners());
        let moved: Vec<bool> = now.iter().zip(&was).map(|(now, was)| now.is_some() && now != was).collect();
        moved.contains(&true).then_some(moved)
    }

    /// The hash slot of a channel.
    pub fn slot_of(channel: &str) -> usize {
        usize::from(ClusterRouting::hash_key(channel.as_bytes()))
    }
}

/// Channels per SUBSCRIBE when a standalone server's subscriptions are
/// sent again.
const SUBSCRIBE_BATCH: usize = 1000;
/// SSUBSCRIBEs in flight at once when a cluster's subscriptions are sent
/// again.
const SSUBSCRIBE_WINDOW: usize = 256;

/// Subscribes `channels` again. Sends nothing for no channels; a failure is
/// logged, and a later re-assertion tries again.
///
/// - Standalone: up to `SUBSCRIBE_BATCH` channels per SUBSCRIBE. fred
///   writes a SUBSCRIBE and expects no answer, so a batch is one command.
/// - Cluster: one channel per SSUBSCRIBE, since channels in different
///   slots cannot share one. They go pipelined, `SSUBSCRIBE_WINDOW` at a
///   time, as plain commands that each wait for their one answer (the
///   `ssubscribe` confirmation, or the error). fred's own `ssubscribe`
///   waits for each answer before it writes the next command, which made
///   re-asserting 19,000 channels cost about 40 µs of the instance's CPU
///   per channel (docs/BENCHMARKS.md). A MOVED answer is followed like any
///   other command's. The channels were subscribed through fred's
///   `ssubscribe` first, so fred's set of channels to restore after a
///   reconnect already holds them.
async fn subscribe_again(subscriber: &SubscriberClient, clustered: bool, channels: Vec<Str>) {
    if clustered {
        let ssubscribe = CustomCommand::new_static("SSUBSCRIBE", ClusterHash::FirstKey, false);
        for window in channels.chunks(SSUBSCRIBE_WINDOW) {
            let answers = futures_util::future::join_all(
                window.iter().map(|channel| subscriber.custom::<Value, _>(ssubscribe.clone(), vec![channel.clone()])),
            )
            .await;
            for (channel, answer) in window.iter().zip(answers) {
                if let Err(e) = answer {
                    tracing::warn!(error = %e, channel = &**channel, "tether_bus_resubscribe_failed");
                }
            }
        }
        return;
    }
    for batch in channels.chunks(SUBSCRIBE_BATCH) {
        if let Err(e) = subscriber.subscribe(batch.to_vec()).await {
            tracing::warn!(error = %e, "tether_bus_resubscribe_failed");
        }
    }
}

/// Subscribes again, after each (re)connection of the subscriber, the
/// channels fred tracks for it (those subscribed and not unsubscribed).
///
/// fred's own `manage_subscriptions` is not used: it sends SUBSCRIBE and
/// PSUBSCRIBE even with nothing to subscribe, Redis refuses an empty one,
/// and on a cluster that stray error is taken as the answer to whatever
/// SSUBSCRIBE waits next on that node's connection, failing it; it also
/// stops for good when its announcements lag. Here nothing is sent for an
/// empty set, a cluster node's reconnection subscribes only the channels
/// whose slots it serves, and a lag subscribes all.
async fn resubscribe(subscriber: SubscriberClient, clustered: bool) {
    let mut reconnects = subscriber.reconnect_rx();
    loop {
        let server = match reconnects.recv().await {
            Ok(server) => Some(server),
            Err(broadcast::error::RecvError::Lagged(_)) => None,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let tracked = if clustered { subscriber.tracked_shard_channels() } else { subscriber.tracked_channels() };
        // A cluster node's reconnection needs only the channels it serves;
        // a node the slot map does not name as a primary gets them all.
        let only = match (clustered, server) {
            (true, Some(server)) => subscriber
                .cached_cluster_state()
                .filter(|routing| routing.unique_primary_nodes().contains(&server))
                .map(|routing| (routing, server)),
            _ => None,
        };
        let served = |channel: &Str| {
            only.as_ref().is_none_or(|(routing, server)| {
                routing.get_server(ClusterRouting::hash_key(channel.as_bytes())).is_none_or(|owner| owner == server)
            })
        };
        subscribe_again(&subscriber, clustered, tracked.into_iter().filter(served).collect()).await;
    }
}

/// Moves messages from fred's broadcast channel to the inbox.
async fn pump(mut messages: broadcast::Receiver<fred::types::Message>, inbox: Inbox) {
    loop {
        match messages.recv().await {
            Ok(message) => {
                let channel = message.channel.to_string();
                let item = match message.value.as_bytes() {
                    Some(payload) => decode(channel, payload),
                    None => Inbound::Gap { lost: 1, channels: Some(vec![channel]) },
                };
                inbox.deliver(item);
            }
            Err(broadcast::error::RecvError::Lagged(lost)) => {
                tracing::warn!(lost, "tether_bus_subscriber_lagged");
                inbox.deliver(Inbound::Gap { lost, channels: None });
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SlotMap;

    fn map(ranges: &[(u16, u16, &str)]) -> SlotMap {
        SlotMap(ranges.iter().map(|(start, end, primary)| (*start, *end, primary.to_string())).collect())
    }

    #[test]
    fn an_unchanged_slot_map_moves_nothing_whatever_the_order_of_its_ranges() {
        let a = map(&[(0, 5460, "a:1"), (5461, 10922, "b:2"), (10923, 16383, "c:3")]);
        let reordered = map(&[(10923, 16383, "c:3"), (0, 5460, "a:1"), (5461, 10922, "b:2")]);
        assert_eq!(a.moved_since(&a.clone()), None);
        assert_eq!(reordered.moved_since(&a), None);
    }

    #[test]
    fn a_migrated_slot_and_a_slot_served_again_are_moved_and_no_other() {
        let before = map(&[(0, 5460, "a:1"), (5461, 10922, "b:2"), (10923, 16382, "c:3")]);
        // Slot 100 migrated from a to c; slot 16383 (unserved before) is served now.
        let now =
            map(&[(0, 99, "a:1"), (100, 100, "c:3"), (101, 5460, "a:1"), (5461, 10922, "b:2"), (10923, 16383, "c:3")]);
        let moved = now.moved_since(&before).expect("moved");
        let slots: Vec<usize> = (0..moved.len()).filter(|s| moved[*s]).collect();
        assert_eq!(slots, vec![100, 16383]);
        // A slot no primary serves now is not subscribed anywhere.
        let unserved = map(&[(0, 5460, "a:1"), (10923, 16382, "c:3")]);
        assert_eq!(unserved.moved_since(&before), None);
    }
}
