//! The interaction stamp (docs/CLUSTER.md, "Interaction stamp"): when a
//! viewer types into a terminal, `terminals.last_interacted_at` is written
//! at most once a minute, across every instance that may own the terminal
//! over time. The store's conditional update decides and answers the
//! stored stamp; this throttle only spares the database a statement per
//! keystroke, and it starts from the stored stamp, not from "now".

use chrono::{DateTime, Duration, Utc};

/// How old the stored stamp must be before it is written again.
pub const PERIOD: Duration = Duration::seconds(60);

#[derive(Debug, Default)]
pub struct InteractionStamp {
    /// No write is tried before this (the stored stamp plus the period).
    next: Option<DateTime<Utc>>,
    in_flight: bool,
}

impl InteractionStamp {
    /// A keystroke at `now`: whether to ask the store to stamp it.
    pub fn due(&mut self, now: DateTime<Utc>) -> bool {
        if self.in_flight || self.next.is_some_and(|next| now < next) {
            return false;
        }
        self.in_flight = true;
        true
    }

    /// The store answered the stored stamp (written now or earlier).
    pub fn stored(&mut self, stamp: DateTime<Utc>) {
        self.in_flight = false;
        self.next = Some(stamp + PERIOD);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).expect("time")
    }

    #[test]
    fn one_question_at_a_time() {
        let mut s = InteractionStamp::default();
        assert!(s.due(at(0)));
        assert!(!s.due(at(10)), "the first question is still out");
        s.stored(at(0));
        assert!(!s.due(at(59_999)));
        assert!(s.due(at(60_000)));
    }

    #[test]
    fn the_throttle_starts_from_the_stored_stamp() {
        // Another instance wrote the stamp 59.7 s before this keystroke.
        let mut s = InteractionStamp::default();
        assert!(s.due(at(59_700)));
        s.stored(at(0));
        assert!(!s.due(at(59_800)), "not again before the stored stamp is a minute old");
        assert!(s.due(at(60_300)), "0.6 s after the first keystroke it is");
    }
}
