//! Smoke tests for the Redis pieces the bus is built on, through fred 10.1
//! against real servers from the harness: plain pub/sub on a standalone
//! Redis, and sharded pub/sub (SSUBSCRIBE/SPUBLISH) across the shards of a
//! three-master Redis Cluster.

mod support;

use std::{collections::BTreeSet, future::Future, time::Duration};

use fred::{
    clients::SubscriberClient,
    prelude::*,
    types::{Message, MessageKind},
};
use tokio::sync::broadcast;

/// Bound on any single step, so a broken server or client fails the test instead of hanging it.
const STEP: Duration = Duration::from_secs(10);

async fn bounded<T>(what: &str, step: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, step).await.unwrap_or_else(|_| panic!("{what}: no answer within {STEP:?}"))
}

async fn next_message(what: &str, messages: &mut broadcast::Receiver<Message>) -> Message {
    bounded(what, messages.recv()).await.unwrap_or_else(|e| panic!("{what}: subscriber stream failed: {e}"))
}

fn text(message: &Message) -> String {
    message
        .value
        .as_string()
        .unwrap_or_else(|| panic!("message on {} is not text: {:?}", message.channel, message.value))
}

#[actix_rt::test]
async fn standalone_publish_reaches_subscriber() {
    let config = Config::from_url(&support::redis_url()).expect("parse the harness's redis URL");
    let subscriber: SubscriberClient =
        Builder::from_config(config.clone()).build_subscriber_client().expect("build subscriber client");
    let publisher: Client = Builder::from_config(config).build().expect("build publisher client");
    bounded("subscriber init", subscriber.init()).await.expect("connect subscriber");
    bounded("publisher init", publisher.init()).await.expect("connect publisher");

    let mut messages = subscriber.message_rx();
    let channel = format!("{}:greetings", support::unique_prefix());
    bounded("subscribe", subscriber.subscribe(channel.as_str())).await.expect("SUBSCRIBE");

    // fred's subscribe() has been seen to return before another connection's
    // PUBLISH counts the subscriber (1 run in 3 under load); wait until
    // Redis itself reports it, so the receiver count below is meaningful.
    bounded("subscription visible", async {
        loop {
            let counts: Vec<(String, i64)> = publisher.pubsub_numsub(channel.as_str()).await.expect("PUBSUB NUMSUB");
            if counts.iter().any(|(c, n)| c == &channel && *n == 1) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    let receivers: i64 = bounded("publish", publisher.publish(channel.as_str(), "hello")).await.expect("PUBLISH");
    assert_eq!(receivers, 1, "PUBLISH should reach exactly our one subscriber");

    let message = next_message("receive the published message", &mut messages).await;
    assert_eq!(message.channel, channel.as_str());
    assert_eq!(message.kind, MessageKind::Message);
    assert_eq!(text(&message), "hello");

    let _ = publisher.quit().await;
    let _ = subscriber.quit().await;
}

#[actix_rt::test]
async fn cluster_sharded_pubsub_across_three_shards() {
    let hosts = support::redis_cluster_hosts();
    assert_eq!(hosts.len(), 3, "harness should give three cluster masters: {hosts:?}");
    let config = Config { server: ServerConfig::new_clustered(hosts), ..Default::default() };
    let subscriber: SubscriberClient = Builder::from_config(config.clone())
        .with_performance_config(|performance| performance.broadcast_channel_capacity = 1024)
        .build_subscriber_client()
        .expect("build clustered subscriber client");
    let publisher: Client = Builder::from_config(config).build().expect("build clustered publisher client");
    bounded("subscriber init", subscriber.init()).await.expect("connect subscriber to the cluster");
    bounded("publisher init", publisher.init()).await.expect("connect publisher to the cluster");

    // One channel per master: pick hash tags until each of the three
    // primaries owns one, so every shard is exercised.
    let routing = publisher.cached_cluster_state().expect("clustered client knows the slot map");
    let primaries = routing.unique_primary_nodes();
    assert_eq!(primaries.len(), 3, "cluster should have three primaries: {primaries:?}");
    let prefix = support::unique_prefix();
    let mut channels: Vec<(String, Server)> = Vec::new();
    for n in 0.. {
        let channel = format!("{{{prefix}-{n}}}:events");
        let slot = fred::util::redis_keyslot(channel.as_bytes());
        let owner = routing.get_server(slot).expect("every slot has an owner").clone();
        if !channels.iter().any(|(_, taken)| *taken == owner) {
            channels.push((channel, owner));
        }
        if channels.len() == primaries.len() {
            break;
        }
    }

    let mut messages = subscriber.message_rx();
    for (channel, _) in &channels {
        // One channel per SSUBSCRIBE: fred routes it by the first channel's slot.
        bounded("ssubscribe", subscriber.ssubscribe(channel.as_str())).await.expect("SSUBSCRIBE");
        // As in the standalone test: wait until the shard counts the
        // subscriber before relying on SPUBLISH's receiver count.
        bounded("shard subscription visible", async {
            loop {
                let counts: Vec<(String, i64)> =
                    publisher.pubsub_shardnumsub(channel.as_str()).await.expect("PUBSUB SHARDNUMSUB");
                if counts.iter().any(|(c, n)| c == channel && *n == 1) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    }

    const PER_CHANNEL: usize = 20;
    for i in 0..PER_CHANNEL {
        for (channel, _) in &channels {
            let receivers: i64 =
                bounded("spublish", publisher.spublish(channel.as_str(), format!("{i}"))).await.expect("SPUBLISH");
            assert_eq!(receivers, 1, "SPUBLISH to {channel} should reach our one subscriber");
        }
    }

    let mut received: Vec<Vec<String>> = vec![Vec::new(); channels.len()];
    let mut servers = BTreeSet::new();
    for _ in 0..PER_CHANNEL * channels.len() {
        let message = next_message("receive sharded messages", &mut messages).await;
        assert_eq!(message.kind, MessageKind::SMessage);
        let index = channels
            .iter()
            .position(|(channel, _)| message.channel == channel.as_str())
            .unwrap_or_else(|| panic!("message on a channel we did not subscribe to: {}", message.channel));
        servers.insert(message.server.to_string());
        received[index].push(text(&message));
    }
    let expected: Vec<String> = (0..PER_CHANNEL).map(|i| i.to_string()).collect();
    for ((channel, _), got) in channels.iter().zip(&received) {
        assert_eq!(got, &expected, "messages on {channel} missing or out of order");
    }
    assert_eq!(servers.len(), 3, "messages should come from three different shards: {servers:?}");

    let nobody = format!("{{{prefix}-nobody}}:events");
    let receivers: i64 =
        bounded("spublish to an idle channel", publisher.spublish(nobody.as_str(), "void")).await.expect("SPUBLISH");
    assert_eq!(receivers, 0, "SPUBLISH to a channel nobody listens on reaches no one");

    let _ = publisher.quit().await;
    let _ = subscriber.quit().await;
}
