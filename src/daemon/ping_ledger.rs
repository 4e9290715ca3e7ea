//! Knowing when the server has a finished terminal's last frames.
//!
//! Writing Snapshot/Exit/Usage into the socket proves nothing: a server
//! that is closing the connection drops what is in flight. The protocol has
//! no per-frame acknowledgement, but the server handles a connection's frames
//! strictly in order and answers every Ping with a Pong, so the n-th Pong
//! confirms everything queued before the n-th Ping. The daemon queues a Ping
//! right after each terminal's final frames and forgets the terminal only
//! when the matching Pong arrives; until then the frames are re-sent after
//! every reconnect (the server's handling of Exit compares state, so a
//! repeat is harmless).

use std::collections::VecDeque;

/// Per-connection count of Pings and Pongs, and the terminals waiting on them.
#[derive(Debug, Default)]
pub struct PingLedger {
    pings_queued: u64,
    pongs_received: u64,
    /// (number of the Ping that confirms them, terminal id), in queue order.
    awaiting: VecDeque<(u64, String)>,
}

impl PingLedger {
    /// A Ping went into the connection's queue.
    pub fn ping_queued(&mut self) {
        self.pings_queued += 1;
    }

    /// A terminal's final frames went into the queue; the next Ping queued
    /// will confirm them.
    pub fn final_frames_queued(&mut self, terminal_id: String) {
        self.awaiting.push_back((self.pings_queued + 1, terminal_id));
    }

    /// A Pong arrived: the terminals whose final frames the server now has.
    pub fn pong_received(&mut self) -> Vec<String> {
        self.pongs_received += 1;
        let mut confirmed = Vec::new();
        while let Some((ping, _)) = self.awaiting.front() {
            if *ping > self.pongs_received {
                break;
            }
            if let Some((_, terminal_id)) = self.awaiting.pop_front() {
                confirmed.push(terminal_id);
            }
        }
        confirmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pong_confirms_only_what_preceded_its_ping() {
        let mut ledger = PingLedger::default();
        ledger.ping_queued(); // periodic ping #1
        ledger.final_frames_queued("a".to_owned());
        ledger.ping_queued(); // #2 confirms a
        ledger.final_frames_queued("b".to_owned());
        ledger.final_frames_queued("c".to_owned());
        ledger.ping_queued(); // #3 confirms b and c

        assert!(ledger.pong_received().is_empty(), "pong #1 predates every final frame");
        assert_eq!(ledger.pong_received(), ["a"]);
        assert_eq!(ledger.pong_received(), ["b", "c"]);
        assert!(ledger.pong_received().is_empty());
    }
}
