//! The bus: messages between instances (docs/CLUSTER.md).
//!
//! One `Bus` per instance, chosen in one place ([`Bus::from_settings`]):
//! - with `redis.url`, Redis PUBLISH/SUBSCRIBE;
//! - with `redis.cluster_nodes`, Redis Cluster SPUBLISH/SSUBSCRIBE (one
//!   ordered shard per channel, hash-tagged channel names);
//! - with neither, an in-process bus: the instance only talks to itself.
//!
//! Every message is a protobuf `Envelope` (`proto/tether/v1/bus.proto`)
//! stamped with the sender's instance id and a per-channel sequence number,
//! so a receiver detects lost messages. Subscriptions are counted per
//! channel (two connections of one host share one), and a subscription
//! counts only once Redis reports it: `publish` answers how many
//! subscribers heard a message, and "0 = nobody owns this" must never be
//! said of a live owner. Subscribing and unsubscribing are ordered per
//! channel, not across channels: one slow subscription (a cluster node
//! that is slow to answer) does not hold up the hellos of other hosts.
//!
//! Received messages go to one bounded inbox, read by the relay's bus
//! dispatcher (`relay::requests`); a full inbox or a lagging subscriber is
//! reported to it as a gap on the channels that lost messages (or on every
//! channel, when fred cannot say which), never hidden.

mod local;
mod redis;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use prost::Message as _;
use tokio::sync::mpsc;

use crate::config::{ConfigError, Settings};
use crate::proto::bus::{envelope, Envelope};

pub use self::redis::RedisLink;

/// Something the bus received.
#[derive(Debug)]
pub enum Inbound {
    Message {
        channel: String,
        envelope: Envelope,
    },
    /// Messages were lost before they reached the inbox: on `channels`, or
    /// on any channel when `channels` is `None` (subscriber lag, an
    /// undecodable payload).
    Gap {
        lost: u64,
        channels: Option<Vec<String>>,
    },
    /// This instance (un)subscribed `channel`: sequence numbers seen on it
    /// before say nothing about what comes next.
    Reset {
        channel: String,
    },
}

/// The sequence numbers one sender used on one channel, as a receiver saw
/// them: the highest, and which of the 64 below it came. Redis may deliver
/// a message twice (fred sends a command again after a failover, and a
/// stalled primary that resumes delivers its own copy), so a number seen
/// before is a duplicate, never served again.
#[derive(Debug, Default)]
pub struct SeenSequence {
    last: u64,
    /// Bit `i` set: `last - 1 - i` came.
    below: u64,
}

/// What a sequence number means to the receiver.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    /// New: serve it; `missed` numbers between the last one and it never
    /// came (a gap, 0 when in order).
    Fresh { missed: u64 },
    /// A number that was missed when a later one came, arriving late.
    Late,
    /// Seen before, or older than what is remembered: drop it.
    Duplicate,
}

impl SeenSequence {
    pub fn arrive(&mut self, seq: u64) -> Arrival {
        if self.last == 0 {
            self.last = seq;
            return Arrival::Fresh { missed: 0 };
        }
        if seq > self.last {
            let ahead = seq - self.last;
            self.below = if ahead > 64 { 0 } else { (self.below << (ahead - 1) << 1) | 1 << (ahead - 1) };
            self.last = seq;
            return Arrival::Fresh { missed: ahead - 1 };
        }
        let behind = self.last - seq;
        if behind == 0 || behind > 64 || self.below & 1 << (behind - 1) != 0 {
            return Arrival::Duplicate;
        }
        self.below |= 1 << (behind - 1);
        Arrival::Late
    }
}

/// The bounded inbox, as the backends fill it. A message that finds it
/// full is lost; its channel is remembered and reported as a gap as soon
/// as there is room again.
#[derive(Clone)]
pub(crate) struct Inbox {
    tx: mpsc::Sender<Inbound>,
    dropped: Arc<Mutex<Dropped>>,
}

/// What a full inbox lost and has not reported yet.
#[derive(Default)]
struct Dropped {
    lost: u64,
    /// Channels that lost messages.
    channels: HashSet<String>,
    /// Channels whose `Reset` was lost (reported as resets, not gaps).
    resets: Vec<String>,
    /// Lost messages whose channel nobody knows.
    anywhere: bool,
}

impl Inbox {
    fn new(capacity: usize) -> (Self, mpsc::Receiver<Inbound>) {
        let (tx, rx) = mpsc::channel(capacity);
        (Self { tx, dropped: Arc::default() }, rx)
    }

    /// Puts an item in the inbox; a full inbox loses it, and says so.
    pub(crate) fn deliver(&self, item: Inbound) {
        let Err(mpsc::error::TrySendError::Full(item)) = self.tx.try_send(item) else { return };
        tracing::warn!("tether_bus_inbox_full");
        let mut dropped = self.dropped.lock().unwrap_or_else(|e| e.into_inner());
        let first = dropped.lost == 0 && dropped.resets.is_empty() && !dropped.anywhere;
        match item {
            Inbound::Message { channel, .. } => {
                dropped.lost += 1;
                dropped.channels.insert(channel);
            }
            Inbound::Gap { lost, channels } => {
                dropped.lost += lost;
                match channels {
                    Some(channels) => dropped.channels.extend(channels),
                    None => dropped.anywhere = true,
                }
            }
            Inbound::Reset { channel } => dropped.resets.push(channel),
        }
        if first {
            // One reporter at a time: it waits for room, then reports
            // everything lost meanwhile.
            let inbox = self.clone();
            tokio::spawn(async move {
                let Ok(permit) = inbox.tx.reserve().await else { return };
                let dropped = std::mem::take(&mut *inbox.dropped.lock().unwrap_or_else(|e| e.into_inner()));
                if dropped.lost > 0 || dropped.anywhere {
                    let channels = (!dropped.anywhere).then(|| dropped.channels.into_iter().collect());
                    permit.send(Inbound::Gap { lost: dropped.lost, channels });
                } else {
                    drop(permit);
                }
                for channel in dropped.resets {
                    if inbox.tx.send(Inbound::Reset { channel }).await.is_err() {
                        return;
                    }
                }
            });
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("redis: {0}")]
    Redis(String),
    #[error("the subscription to {0} was not confirmed in time")]
    NotConfirmed(String),
}

enum Backend {
    Local(local::LocalBus),
    Redis(redis::RedisBus),
}

/// Heartbeats in which every subscription is re-asserted once
/// ([`Bus::reassert`]).
pub const REASSERT_SLICES: u64 = 6;

pub struct Bus {
    backend: Backend,
    instance_id: String,
    prefix: String,
    /// Subscribers per channel on this instance, each count behind its
    /// channel's own lock (held across that channel's Redis calls). A
    /// channel is in the map from its first subscribe until its last
    /// unsubscribe, or until a failed first subscribe gives it up.
    subscriptions: Mutex<HashMap<String, Arc<tokio::sync::Mutex<usize>>>>,
    /// Next sequence number per channel this instance publishes on.
    seqs: Mutex<HashMap<String, u64>>,
    /// Stale channels whose unsubscribe is under way ([`Bus::drop_stale`]):
    /// the messages still in flight on one start no second unsubscribe.
    dropping: Mutex<HashSet<String>>,
    inbox: Inbox,
}

impl Bus {
    /// The bus the settings ask for, and the inbox of what it receives.
    pub fn from_settings(
        settings: &Settings,
        instance_id: &str,
    ) -> Result<(Self, mpsc::Receiver<Inbound>), ConfigError> {
        let (inbox, rx) = Inbox::new(settings.bus.inbox_messages);
        let backend = match redis::RedisBus::from_settings(settings, inbox.clone())? {
            Some(redis) => Backend::Redis(redis),
            None => Backend::Local(local::LocalBus::new(inbox.clone())),
        };
        let bus = Self {
            backend,
            instance_id: instance_id.to_string(),
            prefix: settings.bus.prefix.clone(),
            subscriptions: Mutex::new(HashMap::new()),
            seqs: Mutex::new(HashMap::new()),
            dropping: Mutex::new(HashSet::new()),
            inbox,
        };
        Ok((bus, rx))
    }

    /// True when other instances can be reached (Redis is configured).
    pub fn is_shared(&self) -> bool {
        matches!(self.backend, Backend::Redis(_))
    }

    /// The Redis connection, for readiness checks.
    pub fn redis(&self) -> Option<&RedisLink> {
        match &self.backend {
            Backend::Redis(r) => Some(r.link()),
            Backend::Local(_) => None,
        }
    }

    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// Inbound channel of a host's owner.
    pub fn host_channel(&self, host_id: uuid::Uuid) -> String {
        format!("{}:host:{{{host_id}}}:in", self.prefix)
    }

    /// Outbound channel of a terminal, read by the homes of its remote viewers.
    pub fn terminal_channel(&self, terminal_id: uuid::Uuid) -> String {
        format!("{}:term:{{{terminal_id}}}:out", self.prefix)
    }

    /// Reply channel of an instance.
    pub fn reply_channel(&self, instance_id: &str) -> String {
        format!("{}:reply:{{{instance_id}}}", self.prefix)
    }

    /// The terminal whose outbound channel `channel` is.
    pub fn channel_terminal(&self, channel: &str) -> Option<uuid::Uuid> {
        self.tagged(channel, ":term:")
    }

    /// The host whose inbound channel `channel` is.
    pub fn channel_host(&self, channel: &str) -> Option<uuid::Uuid> {
        self.tagged(channel, ":host:")
    }

    /// The id in braces of a `<prefix><kind>{<id>}...` channel.
    fn tagged(&self, channel: &str, kind: &str) -> Option<uuid::Uuid> {
        let rest = channel.strip_prefix(&self.prefix)?.strip_prefix(kind)?.strip_prefix('{')?;
        uuid::Uuid::parse_str(rest.split_once('}')?.0).ok()
    }

    /// The kind of a channel (`host`, `reply`, `term`), for metrics labels.
    pub fn kind(&self, channel: &str) -> &'static str {
        let rest = channel.strip_prefix(&self.prefix).unwrap_or(channel);
        if rest.starts_with(":host:") {
            "host"
        } else if rest.starts_with(":reply:") {
            "reply"
        } else if rest.starts_with(":term:") {
            "term"
        } else {
            "other"
        }
    }

    /// Publishes `body` on `channel`; answers how many subscribers heard it.
    ///
    /// The sequence number is taken and the message handed to the backend
    /// under one lock, so messages leave in the order of their numbers even
    /// when several threads publish on one channel at once; otherwise a
    /// receiver would take a reordering for a loss (a gap) and close viewers
    /// that lost nothing.
    pub async fn publish(&self, channel: &str, body: envelope::Body) -> Result<u64, BusError> {
        self.publish_with(channel, body, false).await
    }

    /// Publishes like [`Bus::publish`], but fails at once while Redis is
    /// away instead of waiting for it, and is never sent after it failed:
    /// for requests whose caller answers a client that it failed.
    pub async fn publish_or_fail(&self, channel: &str, body: envelope::Body) -> Result<u64, BusError> {
        self.publish_with(channel, body, true).await
    }

    async fn publish_with(&self, channel: &str, body: envelope::Body, fail_fast: bool) -> Result<u64, BusError> {
        let handed = {
            let mut seqs = self.seqs.lock().unwrap_or_else(|e| e.into_inner());
            let next = seqs.entry(channel.to_string()).or_insert(0);
            *next += 1;
            let envelope = Envelope { sender: self.instance_id.clone(), seq: *next, body: Some(body) };
            match &self.backend {
                Backend::Local(local) => Ok(local.publish(channel, envelope)),
                Backend::Redis(redis) => {
                    Err(redis.hand_over(channel, Bytes::from(envelope.encode_to_vec()), fail_fast))
                }
            }
        };
        let receivers = match handed {
            Ok(receivers) => receivers,
            Err(answer) => answer.await?,
        };
        metrics::counter!("tether_bus_published_total", "kind" => self.kind(channel)).increment(1);
        Ok(receivers)
    }

    /// Subscribes (once per channel however many callers), returning once
    /// the subscription is confirmed.
    pub async fn subscribe(&self, channel: &str) -> Result<(), BusError> {
        loop {
            let slot = self.channels().entry(channel.to_string()).or_default().clone();
            let mut count = slot.lock().await;
            if !self.holds(channel, &slot) {
                // Given up (unsubscribed, or its first subscribe failed)
                // while this call waited: start over with a fresh entry.
                continue;
            }
            if *count > 0 {
                *count += 1;
                return Ok(());
            }
            // Before the first message of the new subscription can arrive.
            self.inbox.deliver(Inbound::Reset { channel: channel.to_string() });
            let subscribed = match &self.backend {
                Backend::Local(local) => {
                    local.subscribe(channel);
                    Ok(())
                }
                Backend::Redis(redis) => redis.subscribe(channel).await,
            };
            match subscribed {
                Ok(()) => *count = 1,
                Err(_) => self.give_up(channel, &slot),
            }
            metrics::gauge!("tether_bus_subscriptions").set(self.channels().len() as f64);
            return subscribed;
        }
    }

    /// Drops one subscriber of `channel`; the last one unsubscribes.
    pub async fn unsubscribe(&self, channel: &str) {
        let Some(slot) = self.channels().get(channel).cloned() else { return };
        let mut count = slot.lock().await;
        if !self.holds(channel, &slot) || *count == 0 {
            return;
        }
        *count -= 1;
        if *count > 0 {
            return;
        }
        // Still holding the channel's lock, so a subscribe that comes now
        // goes out after this unsubscribe.
        self.backend_unsubscribe(channel).await;
        self.give_up(channel, &slot);
        metrics::gauge!("tether_bus_subscriptions").set(self.channels().len() as f64);
        self.inbox.deliver(Inbound::Reset { channel: channel.to_string() });
    }

    /// Whether this instance subscribed `channel` (or is subscribing it).
    /// A message on any other channel comes from a subscription Redis
    /// still holds for it: one whose unsubscribe failed while Redis was
    /// away, which the client subscribes again when it reconnects.
    pub fn is_subscribed(&self, channel: &str) -> bool {
        self.channels().contains_key(channel)
    }

    /// Whether to drop the stale subscription of `channel` now: true for
    /// the first message on it since the last drop ended, false while one
    /// is under way.
    pub fn starts_dropping(&self, channel: &str) -> bool {
        self.dropping.lock().unwrap_or_else(|e| e.into_inner()).insert(channel.to_string())
    }

    /// Unsubscribes `channel` in Redis if this instance has no subscriber
    /// of it ([`Bus::is_subscribed`]), under the channel's lock: a
    /// subscribe that comes meanwhile goes out after this unsubscribe.
    /// Called once [`Bus::starts_dropping`] said so.
    pub async fn drop_stale(&self, channel: &str) {
        let slot = self.channels().entry(channel.to_string()).or_default().clone();
        let count = slot.lock().await;
        if self.holds(channel, &slot) && *count == 0 {
            tracing::info!(%channel, "tether_bus_stale_subscription_dropped");
            self.backend_unsubscribe(channel).await;
            self.give_up(channel, &slot);
        }
        self.dropping.lock().unwrap_or_else(|e| e.into_inner()).remove(channel);
    }

    async fn backend_unsubscribe(&self, channel: &str) {
        match &self.backend {
            Backend::Local(local) => local.unsubscribe(channel),
            Backend::Redis(redis) => redis.unsubscribe(channel).await,
        }
    }

    /// The subscribed channels (and those being subscribed).
    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<usize>>>> {
        self.subscriptions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `slot` is still `channel`'s entry.
    fn holds(&self, channel: &str, slot: &Arc<tokio::sync::Mutex<usize>>) -> bool {
        self.channels().get(channel).is_some_and(|s| Arc::ptr_eq(s, slot))
    }

    /// Removes `channel`'s entry if it is still `slot`.
    fn give_up(&self, channel: &str, slot: &Arc<tokio::sync::Mutex<usize>>) {
        let mut channels = self.channels();
        if channels.get(channel).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            channels.remove(channel);
        }
    }

    /// Subscribes again the channels of slice `tick` of
    /// [`REASSERT_SLICES`] (a channel's slice is its hash slot's remainder),
    /// in case something dropped one without a word; returns how many.
    /// Called every `bus.heartbeat_ms` with the next tick, it re-asserts
    /// every channel once in `REASSERT_SLICES` heartbeats, a slice at a
    /// time. Not more often: the slot watcher and the re-subscription
    /// after a reconnect answer the drops that are known at once, and each
    /// re-asserted channel costs this instance and Redis a command.
    pub async fn reassert(&self, tick: u64) -> usize {
        let slice = usize::try_from(tick % REASSERT_SLICES).unwrap_or(0);
        let channels: Vec<String> = (self.channels().keys())
            .filter(|channel| redis::SlotMap::slot_of(channel) % REASSERT_SLICES as usize == slice)
            .cloned()
            .collect();
        if let Backend::Redis(redis) = &self.backend {
            redis.reassert(&channels).await;
        }
        channels.len()
    }
}

impl Bus {
    /// On a Redis Cluster, subscribes again at once every channel whose
    /// hash slot moved to another primary. The old owner of a migrated
    /// slot drops its shard subscriptions with an unsolicited SUNSUBSCRIBE
    /// that fred does not pass on, so without this a moved channel would
    /// stay deaf until the next periodic re-assertion; what was published
    /// on it meanwhile reached nobody and shows up as a sequence gap. Reads
    /// the slot map every `every` and looks at the subscriptions only when
    /// a slot moved since the last read; returns at once without a cluster.
    pub async fn watch_slots(&self, every: std::time::Duration) {
        let Backend::Redis(redis) = &self.backend else { return };
        if !redis.is_clustered() {
            return;
        }
        let mut before: Option<redis::SlotMap> = None;
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let Some(now) = redis.slot_map().await else { continue };
            let moved_slots = before.as_ref().and_then(|before| now.moved_since(before));
            before = Some(now);
            let Some(moved_slots) = moved_slots else { continue };
            let moved: Vec<String> = (self.channels().keys())
                .filter(|channel| moved_slots[redis::SlotMap::slot_of(channel)])
                .cloned()
                .collect();
            if !moved.is_empty() {
                tracing::info!(channels = moved.len(), "tether_bus_slots_moved");
                metrics::counter!("tether_bus_slot_moves_total").increment(moved.len() as u64);
                redis.reassert(&moved).await;
            }
        }
    }
}

/// Decodes a received payload into an inbox item (a payload that is not
/// an `Envelope` is counted as one lost message).
pub fn decode(channel: String, payload: &[u8]) -> Inbound {
    match Envelope::decode(payload) {
        Ok(envelope) => Inbound::Message { channel, envelope },
        Err(_) => {
            tracing::warn!(%channel, "tether_bus_bad_envelope");
            Inbound::Gap { lost: 1, channels: Some(vec![channel]) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Arrival, SeenSequence};

    #[test]
    fn a_number_seen_before_is_a_duplicate_and_a_missed_one_may_come_late() {
        let mut seen = SeenSequence::default();
        assert_eq!(seen.arrive(5), Arrival::Fresh { missed: 0 }, "the first one starts the count");
        assert_eq!(seen.arrive(6), Arrival::Fresh { missed: 0 });
        assert_eq!(seen.arrive(6), Arrival::Duplicate);
        assert_eq!(seen.arrive(5), Arrival::Duplicate);
        assert_eq!(seen.arrive(9), Arrival::Fresh { missed: 2 });
        assert_eq!(seen.arrive(8), Arrival::Late);
        assert_eq!(seen.arrive(8), Arrival::Duplicate, "a late one counts as seen");
        assert_eq!(seen.arrive(7), Arrival::Late);
        assert_eq!(seen.arrive(6), Arrival::Duplicate);
        assert_eq!(seen.arrive(9 + 64), Arrival::Fresh { missed: 63 });
        assert_eq!(seen.arrive(9), Arrival::Duplicate, "64 below the last is remembered");
        assert_eq!(seen.arrive(8), Arrival::Duplicate, "older ones are dropped");
        assert_eq!(seen.arrive(10), Arrival::Late);
        assert_eq!(seen.arrive(1000), Arrival::Fresh { missed: 1000 - 73 - 1 });
        assert_eq!(seen.arrive(73), Arrival::Duplicate, "a jump past the window forgets it");
    }
}
