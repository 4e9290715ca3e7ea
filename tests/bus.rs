//! The bus between instances (docs/CLUSTER.md) against real Redis servers
//! from the harness: a standalone Redis (PUBLISH/SUBSCRIBE) and the
//! three-master Redis Cluster (SPUBLISH/SSUBSCRIBE). Two `Bus` values in
//! one process stand for two instances.

mod support;

use std::time::Duration;

use tether::bus::{Bus, Inbound};
use tether::config::Settings;
use tether::proto::bus::{envelope, reply, Ack, Reply};
use tokio::sync::mpsc;

fn settings(standalone: bool) -> Settings {
    let mut s = Settings::default();
    if standalone {
        s.redis.url = Some(support::redis_url());
    } else {
        s.redis.cluster_nodes = Some(support::redis_cluster_nodes());
    }
    s.bus.prefix = support::unique_prefix();
    s
}

fn reply(n: u64) -> envelope::Body {
    envelope::Body::Reply(Reply { request_id: n.to_string(), outcome: Some(reply::Outcome::Ack(Ack {})) })
}

/// The next message or gap of an inbox (skipping the markers of this
/// instance's own (un)subscriptions), or a panic naming what was expected.
async fn next(inbox: &mut mpsc::Receiver<Inbound>, what: &str) -> Inbound {
    loop {
        let item = tokio::time::timeout(Duration::from_secs(20), inbox.recv())
            .await
            .unwrap_or_else(|_| panic!("nothing received: {what}"))
            .expect("bus inbox closed");
        if !matches!(item, Inbound::Reset { .. }) {
            return item;
        }
    }
}

async fn ordered_delivery(standalone: bool) {
    let s = settings(standalone);
    let (sender, _sender_inbox) = Bus::from_settings(&s, "a#000001").expect("bus a");
    let (receiver, mut inbox) = Bus::from_settings(&s, "b#000002").expect("bus b");
    let channel = receiver.reply_channel("b#000002");
    // Before anybody subscribes, a publish reaches nobody: that is "offline".
    let nobody = sender.publish(&sender.host_channel(uuid::Uuid::new_v4()), reply(0)).await.expect("publish");
    assert_eq!(nobody, 0);
    receiver.subscribe(&channel).await.expect("subscribe");
    // Confirmed by Redis: the very next publish counts the subscriber.
    assert_eq!(sender.publish(&channel, reply(1)).await.expect("publish"), 1);

    const N: u64 = 100_000;
    let reading = tokio::spawn(async move {
        let mut expected = 1u64;
        while expected <= N {
            match next(&mut inbox, "ordered messages").await {
                Inbound::Message { envelope, .. } => {
                    assert_eq!(envelope.sender, "a#000001");
                    assert_eq!(envelope.seq, expected, "a message was lost or reordered");
                    match envelope.body {
                        Some(envelope::Body::Reply(r)) => assert_eq!(r.request_id, expected.to_string()),
                        other => panic!("unexpected body {other:?}"),
                    }
                    expected += 1;
                }
                Inbound::Gap { lost, .. } => panic!("a gap of {lost} at {expected}"),
                Inbound::Reset { .. } => unreachable!("skipped by next()"),
            }
        }
    });
    for n in 2..=N {
        sender.publish(&channel, reply(n)).await.expect("publish");
    }
    tokio::time::timeout(Duration::from_secs(120), reading).await.expect("all delivered").expect("reader");
    receiver.unsubscribe(&channel).await;
}

#[actix_rt::test]
async fn standalone_delivers_100k_messages_in_order() {
    ordered_delivery(true).await;
}

#[actix_rt::test]
async fn cluster_delivers_100k_messages_in_order() {
    ordered_delivery(false).await;
}

/// Four threads publish on one channel at once, as an instance's workers
/// do when several viewers of one host type or report credit: the
/// receiver sees the sender's sequence numbers in order, with no jump. A
/// number taken before another but handed to Redis after it would read as
/// a loss, and the owner would close viewers that lost nothing.
async fn concurrent_publishers_keep_the_order(backend: Option<bool>) {
    let mut s = match backend {
        Some(standalone) => settings(standalone),
        None => Settings::default(),
    };
    // Room for everything: this test is about order, not a full inbox.
    s.bus.inbox_messages = 32_768;
    let (sender, sender_inbox) = Bus::from_settings(&s, "a#000001").expect("bus a");
    let sender = std::sync::Arc::new(sender);
    // Without Redis the instance hears only itself.
    let (receiver, mut inbox) = match backend {
        Some(_) => {
            let (receiver, inbox) = Bus::from_settings(&s, "b#000002").expect("bus b");
            (Some(receiver), inbox)
        }
        None => (None, sender_inbox),
    };
    let channel = sender.host_channel(uuid::Uuid::new_v4());
    receiver.as_ref().unwrap_or(&sender).subscribe(&channel).await.expect("subscribe");

    const THREADS: u64 = 4;
    const EACH: u64 = 5_000;
    let publishers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (sender, channel) = (sender.clone(), channel.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                runtime.block_on(async {
                    for n in 0..EACH {
                        assert_eq!(sender.publish(&channel, reply(n)).await.expect("publish"), 1);
                    }
                });
            })
        })
        .collect();
    let mut last = 0;
    while last < THREADS * EACH {
        match next(&mut inbox, "messages of four publishers").await {
            Inbound::Message { envelope, .. } => {
                assert_eq!(envelope.seq, last + 1, "a message was reordered or lost after {last}");
                last = envelope.seq;
            }
            Inbound::Gap { lost, .. } => panic!("a gap of {lost} after {last}"),
            Inbound::Reset { .. } => unreachable!("skipped by next()"),
        }
    }
    tokio::task::spawn_blocking(move || publishers.into_iter().for_each(|p| p.join().expect("publisher")))
        .await
        .expect("publishers");
}

#[actix_rt::test]
async fn concurrent_publishers_keep_the_order_in_process() {
    concurrent_publishers_keep_the_order(None).await;
}

#[actix_rt::test]
async fn concurrent_publishers_keep_the_order_on_standalone() {
    concurrent_publishers_keep_the_order(Some(true)).await;
}

#[actix_rt::test]
async fn concurrent_publishers_keep_the_order_on_a_cluster() {
    concurrent_publishers_keep_the_order(Some(false)).await;
}

/// Two subscribers of one channel on one instance share one subscription:
/// the first unsubscribe keeps it, the last one ends it.
#[actix_rt::test]
async fn subscriptions_are_counted() {
    let s = settings(false);
    let (sender, _) = Bus::from_settings(&s, "a#000001").expect("bus a");
    let (receiver, mut inbox) = Bus::from_settings(&s, "b#000002").expect("bus b");
    let channel = receiver.host_channel(uuid::Uuid::new_v4());
    receiver.subscribe(&channel).await.expect("subscribe");
    receiver.subscribe(&channel).await.expect("subscribe again");
    receiver.unsubscribe(&channel).await;
    assert_eq!(sender.publish(&channel, reply(1)).await.expect("publish"), 1, "one subscriber left");
    assert!(matches!(next(&mut inbox, "still subscribed").await, Inbound::Message { .. }));
    receiver.unsubscribe(&channel).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sender.publish(&channel, reply(2)).await.expect("publish") != 0 {
        assert!(tokio::time::Instant::now() < deadline, "the last unsubscribe did not end the subscription");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A full inbox loses messages and says so: the loss comes back as a gap
/// naming the channel, once there is room again, and nothing else is lost.
#[actix_rt::test]
async fn a_full_inbox_reports_the_channel() {
    let mut s = settings(true);
    s.bus.inbox_messages = 3;
    let (sender, _) = Bus::from_settings(&s, "a#000001").expect("bus a");
    let (receiver, mut inbox) = Bus::from_settings(&s, "b#000002").expect("bus b");
    let channel = receiver.terminal_channel(uuid::Uuid::new_v4());
    receiver.subscribe(&channel).await.expect("subscribe");
    const N: u64 = 20;
    for n in 1..=N {
        sender.publish(&channel, reply(n)).await.expect("publish");
    }
    // Nobody reads while the messages arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mut received, mut lost) = (0, 0);
    while received + lost < N {
        match next(&mut inbox, "messages or the gap").await {
            Inbound::Message { .. } => received += 1,
            Inbound::Gap { lost: n, channels } => {
                assert_eq!(channels, Some(vec![channel.clone()]), "the gap names the channel");
                lost += n;
            }
            Inbound::Reset { .. } => unreachable!("skipped by next()"),
        }
    }
    assert!(lost > 0, "a three-message inbox held {received} of {N}");
    assert_eq!(received + lost, N, "every message either arrived or was reported lost");
}

/// Two instances' buses (a sender and a receiver) on a test's own
/// cluster, and the receiver's inbox.
fn two_instances_on(cluster: &support::OwnRedisCluster) -> (Bus, std::sync::Arc<Bus>, mpsc::Receiver<Inbound>) {
    let mut s = Settings::default();
    s.redis.cluster_nodes = Some(cluster.nodes());
    s.bus.prefix = support::unique_prefix();
    let (sender, _) = Bus::from_settings(&s, "a#000001").expect("bus a");
    let (receiver, inbox) = Bus::from_settings(&s, "b#000002").expect("bus b");
    (sender, std::sync::Arc::new(receiver), inbox)
}

/// A live slot migration on a Redis Cluster (the cluster is this test's
/// own): a channel's slot moves to another master while messages flow on
/// it. The old owner drops the shard subscription without a word to the
/// client; the receiving instance sees the slot move in its slot map and
/// subscribes again (the periodic re-assertion does not run here), so
/// publishes are heard again within a few checks. Every message whose
/// publish reported a receiver arrives, in order; the ones published while
/// the channel was deaf reached nobody, which the sequence numbers reveal
/// to the instance's dispatcher. Without the slot watcher the channel
/// stays deaf and this test fails.
#[actix_rt::test]
async fn a_live_slot_migration_keeps_the_channel() {
    let cluster = support::OwnRedisCluster::start();
    let (sender, receiver, mut inbox) = two_instances_on(&cluster);
    let channel = receiver.reply_channel("b#000002");
    receiver.subscribe(&channel).await.expect("subscribe");
    let watcher = receiver.clone();
    tokio::spawn(async move { watcher.watch_slots(Duration::from_millis(100)).await });

    let mut heard = Vec::new();
    for n in 1..=50 {
        assert_eq!(sender.publish(&channel, reply(n)).await.expect("publish"), 1);
        heard.push(n);
    }
    // The watcher has read the slot map with the channel on its first owner.
    tokio::time::sleep(Duration::from_millis(400)).await;
    cluster.migrate_slot(fred::types::cluster::ClusterRouting::hash_key(channel.as_bytes()));

    let (mut n, mut deaf, mut after) = (50, 0, 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while after < 50 {
        assert!(tokio::time::Instant::now() < deadline, "the channel stayed deaf after its slot moved");
        n += 1;
        match sender.publish(&channel, reply(n)).await.expect("publish") {
            0 => deaf += 1,
            _ => {
                heard.push(n);
                after += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut received = Vec::new();
    while received.len() < heard.len() {
        match next(&mut inbox, "the heard messages").await {
            Inbound::Message { envelope, .. } => received.push(envelope.seq),
            Inbound::Gap { lost, .. } => panic!("a gap of {lost} in the inbox"),
            Inbound::Reset { .. } => unreachable!("skipped by next()"),
        }
    }
    assert_eq!(received, heard, "every message a receiver heard arrived, in order ({deaf} reached nobody)");
}

/// One stalled subscription does not hold up another channel's: with the
/// cluster node that serves one channel stopped (SIGSTOP), a subscription
/// on another node completes while the first waits, and the first
/// completes once its node runs again. One lock over every subscription,
/// held across each one's Redis calls, made every hello on an instance
/// wait for the slowest subscription (a reconnect storm on a cluster was
/// admitted at the pace of one SSUBSCRIBE and one SHARDNUMSUB at a time);
/// with it this test times out.
#[actix_rt::test]
async fn a_stalled_subscription_does_not_hold_up_another_channels() {
    let cluster = support::OwnRedisCluster::start();
    let (sender, receiver, _inbox) = two_instances_on(&cluster);
    let served_by = |port: u16| loop {
        let channel = receiver.host_channel(uuid::Uuid::new_v4());
        if cluster.owner(fred::types::cluster::ClusterRouting::hash_key(channel.as_bytes())) == port {
            break channel;
        }
    };
    let (stopped, running) = (cluster.ports()[0], cluster.ports()[1]);
    let (stalled, free) = (served_by(stopped), served_by(running));
    // Both instances connected to every node before one stops.
    for port in [stopped, running] {
        let warm = served_by(port);
        receiver.subscribe(&warm).await.expect("subscribe");
        assert_eq!(sender.publish(&warm, reply(1)).await.expect("publish"), 1);
    }

    cluster.pause(stopped);
    let first = {
        let (receiver, stalled) = (receiver.clone(), stalled.clone());
        tokio::spawn(async move { receiver.subscribe(&stalled).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!first.is_finished(), "a subscription on a stopped node completed");
    let second = tokio::time::timeout(Duration::from_secs(10), receiver.subscribe(&free)).await;
    cluster.resume(stopped);
    second.expect("the subscription on a running node waited for the one on the stopped node").expect("subscribe");
    first.await.expect("join").expect("the stalled subscription, once its node runs again");
    for channel in [&free, &stalled] {
        assert_eq!(sender.publish(channel, reply(2)).await.expect("publish"), 1, "{channel} is heard");
    }
}

/// The subscriber's connections are cut (CLIENT KILL on every node, as a
/// proxy or a failover would). fred reconnects and the instance subscribes
/// every channel again by itself: each is heard again without the periodic
/// re-assertion, which does not run here. Nothing sent on the way is
/// refused: an empty SUBSCRIBE or PSUBSCRIBE (as fred's own
/// re-subscription sends on every connection) is counted by Redis as a
/// rejected call, and on a cluster its stray error used to fail the next
/// SSUBSCRIBE on that node.
async fn a_cut_subscriber_subscribes_everything_again(settings: Settings, ports: &[u16]) {
    let (sender, _) = Bus::from_settings(&settings, "a#000001").expect("bus a");
    let (receiver, _inbox) = Bus::from_settings(&settings, "b#000002").expect("bus b");
    let channels: Vec<String> = (0..8).map(|_| receiver.host_channel(uuid::Uuid::new_v4())).collect();
    for channel in &channels {
        receiver.subscribe(channel).await.expect("subscribe");
    }
    for port in ports {
        support::redis_command(*port, &["CLIENT", "KILL", "TYPE", "pubsub"]).expect("CLIENT KILL");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    for channel in &channels {
        while sender.publish(channel, reply(1)).await.expect("publish") == 0 {
            assert!(tokio::time::Instant::now() < deadline, "{channel} stayed deaf after the reconnect");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for port in ports {
        for command in ["subscribe", "psubscribe", "ssubscribe"] {
            let (_, refused) = support::command_stats(*port, command);
            assert_eq!(refused, 0, "node {port} refused {refused} {command}");
        }
    }
}

#[actix_rt::test]
async fn a_cut_subscriber_subscribes_everything_again_on_standalone() {
    let redis = support::OwnRedis::start();
    let mut s = Settings::default();
    s.redis.url = Some(redis.url());
    a_cut_subscriber_subscribes_everything_again(s, &[redis.port()]).await;
}

#[actix_rt::test]
async fn a_cut_subscriber_subscribes_everything_again_on_a_cluster() {
    let cluster = support::OwnRedisCluster::start();
    let mut s = Settings::default();
    s.redis.cluster_nodes = Some(cluster.nodes());
    a_cut_subscriber_subscribes_everything_again(s, cluster.ports()).await;
}

/// The periodic re-assertion on a standalone Redis sends the instance's
/// channels in batches, not one SUBSCRIBE per channel, and a slice of them
/// per heartbeat, each channel once in `REASSERT_SLICES` heartbeats: an
/// instance with 19,000 daemons holds 19,000 host channels, and one
/// command each every `bus.heartbeat_ms` cost a measurable share of its
/// idle CPU (docs/BENCHMARKS.md). Every channel is still subscribed
/// afterwards.
#[actix_rt::test]
async fn the_reassertion_batches_a_standalone_servers_channels_a_slice_at_a_time() {
    const CHANNELS: usize = 7_000;
    let redis = support::OwnRedis::start();
    let mut s = Settings::default();
    s.redis.url = Some(redis.url());
    let (sender, _) = Bus::from_settings(&s, "a#000001").expect("bus a");
    let (receiver, _inbox) = Bus::from_settings(&s, "b#000002").expect("bus b");
    let channels: Vec<String> = (0..CHANNELS).map(|_| receiver.host_channel(uuid::Uuid::new_v4())).collect();
    for channel in &channels {
        receiver.subscribe(channel).await.expect("subscribe");
    }
    support::redis_command(redis.port(), &["CONFIG", "RESETSTAT"]).expect("CONFIG RESETSTAT");
    let mut slices = Vec::new();
    for tick in 0..tether::bus::REASSERT_SLICES {
        slices.push(receiver.reassert(tick).await);
    }
    // A SUBSCRIBE is done once written; Redis runs one connection's commands
    // in order, so once a later subscription is confirmed, the
    // re-assertion's have all been counted.
    receiver.subscribe(&receiver.host_channel(uuid::Uuid::new_v4())).await.expect("subscribe after");
    assert_eq!(slices.iter().sum::<usize>(), CHANNELS, "every channel once in {slices:?}");
    assert!(slices.iter().all(|n| *n < CHANNELS / 3), "a slice at a time: {slices:?}");
    let batches: usize = slices.iter().map(|n| n.div_ceil(1_000)).sum();
    let (calls, _) = support::command_stats(redis.port(), "subscribe");
    assert_eq!(calls, batches as u64 + 1, "slices {slices:?} in SUBSCRIBEs of at most 1,000, then one more");
    for channel in &channels {
        assert_eq!(sender.publish(channel, reply(1)).await.expect("publish"), 1, "{channel} is subscribed");
    }
}
