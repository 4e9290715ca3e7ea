//! When a lapsed lease may be believed (docs/OPERATIONS.md, "Faults").
//!
//! A lease lapses when its holder does not renew it, and while the
//! database is away nobody can: when it is back every lease may have
//! lapsed, though every holder is alive and renews at its next chance (its
//! registry retries failed renewals within a quarter second). So a reader
//! whose own database calls failed waits one lease TTL after the database
//! answers again before it acts on a lapsed lease (marks a host offline or
//! a run lost, closes a viewer whose owner seems gone). A lease that
//! another holder took is news at once, and is believed at once.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct LapseGrace {
    ttl: Duration,
    /// The last call to the database failed.
    failing: bool,
    /// Lapses are believed again from then on.
    believe_from: Option<Instant>,
}

impl LapseGrace {
    /// A grace of one lease TTL.
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, failing: false, believe_from: None }
    }

    /// A call to the database failed: it may be away.
    pub fn failed(&mut self) {
        self.failing = true;
    }

    /// A call to the database answered at `now`.
    pub fn answered(&mut self, now: Instant) {
        if self.failing {
            self.failing = false;
            self.believe_from = Some(now + self.ttl);
        }
    }

    /// Whether a lapsed lease means its holder is gone.
    pub fn believe_lapses(&self, now: Instant) -> bool {
        !self.failing && self.believe_from.is_none_or(|from| now >= from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lapses_are_believed_one_ttl_after_the_database_answers_again() {
        let ttl = Duration::from_secs(3);
        let t0 = Instant::now();
        let mut grace = LapseGrace::new(ttl);
        assert!(grace.believe_lapses(t0), "nothing failed");
        grace.answered(t0);
        assert!(grace.believe_lapses(t0), "answers alone change nothing");
        grace.failed();
        assert!(!grace.believe_lapses(t0), "while it fails");
        let back = t0 + Duration::from_secs(20);
        grace.answered(back);
        assert!(!grace.believe_lapses(back + ttl - Duration::from_millis(1)), "within a TTL of its return");
        grace.answered(back + Duration::from_secs(1));
        assert!(!grace.believe_lapses(back + Duration::from_secs(2)), "later answers do not restart or end it");
        assert!(grace.believe_lapses(back + ttl));
    }
}
