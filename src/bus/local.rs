//! The in-process bus of an instance without Redis: a message published on
//! a channel this instance subscribed to comes straight back to its own
//! inbox; any other channel has no subscriber (0), because no other
//! instance can be reached.

use std::collections::HashSet;
use std::sync::Mutex;

use super::{Inbound, Inbox};
use crate::proto::bus::Envelope;

pub struct LocalBus {
    inbox: Inbox,
    channels: Mutex<HashSet<String>>,
}

impl LocalBus {
    pub fn new(inbox: Inbox) -> Self {
        Self { inbox, channels: Mutex::new(HashSet::new()) }
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn publish(&self, channel: &str, envelope: Envelope) -> u64 {
        if !self.channels().contains(channel) {
            return 0;
        }
        self.inbox.deliver(Inbound::Message { channel: channel.to_string(), envelope });
        1
    }

    pub fn subscribe(&self, channel: &str) {
        self.channels().insert(channel.to_string());
    }

    pub fn unsubscribe(&self, channel: &str) {
        self.channels().remove(channel);
    }
}
