//! How the clients ride out a server they cannot reach (docs/CLI.md): a
//! restart, a frozen instance, a network change. `tether attach`, the
//! output follower of `tether run` and `tether logs --follow`, and the
//! REST calls those make while they wait keep trying with a growing,
//! jittered delay, and give up only once nothing got through for
//! [`PATIENCE`] and at least [`MIN_ATTEMPTS`] attempts failed.

use std::time::Duration;

use tokio::time::Instant;

/// How long a client keeps trying after its last success: long enough for
/// a server's restart or a frozen instance's replacement, bounded so that a
/// server gone for good ends a command nobody watches.
pub const PATIENCE: Duration = Duration::from_secs(10 * 60);

/// Failed attempts made before giving up, however long they took (a
/// laptop that slept through the patience still tries a few times on
/// waking).
pub const MIN_ATTEMPTS: u32 = 5;

/// First delay; doubles per failed attempt up to [`MAX_DELAY`].
const BASE_DELAY: Duration = Duration::from_millis(250);
const MAX_DELAY: Duration = Duration::from_secs(4);

/// One stretch of failed attempts.
#[derive(Debug)]
pub struct Outage {
    since: Instant,
    attempts: u32,
}

impl Default for Outage {
    fn default() -> Self {
        Self { since: Instant::now(), attempts: 0 }
    }
}

impl Outage {
    /// Something got through (a connection went live, a call answered):
    /// the next failure starts a new outage.
    pub fn over(&mut self) {
        *self = Self::default();
    }

    /// One more attempt failed: how long to wait before the next, or
    /// `None` to give up.
    pub fn next_delay(&mut self) -> Option<Duration> {
        if self.attempts >= MIN_ATTEMPTS && self.since.elapsed() >= PATIENCE {
            return None;
        }
        self.attempts += 1;
        Some(delay(self.attempts))
    }

    /// Failed attempts so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

/// Exponential backoff with up to 25% jitter, so clients closed together
/// by a draining instance do not all redial in the same instant.
fn delay(attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(16);
    let base = BASE_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY);
    let jitter_ms = base.as_millis() as u64 / 4;
    base + Duration::from_millis(rand::random_range(0..=jitter_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_grows_and_is_capped() {
        for attempt in 1..=20 {
            let delay = delay(attempt);
            let base = BASE_DELAY.saturating_mul(1 << (attempt - 1).min(16)).min(MAX_DELAY);
            assert!(delay >= base && delay <= base + base / 4, "{attempt}: {delay:?}");
        }
        assert!(delay(1) < Duration::from_millis(320));
    }

    #[test]
    fn an_outage_ends_after_its_patience_and_the_attempts() {
        let long_ago = |outage: &mut Outage| outage.since = Instant::now() - PATIENCE;
        let mut outage = Outage::default();
        for _ in 0..MIN_ATTEMPTS {
            assert!(outage.next_delay().is_some(), "the first attempts are always made");
        }
        assert!(outage.next_delay().is_some(), "still within the patience");
        long_ago(&mut outage);
        assert_eq!(outage.next_delay(), None, "past the patience with enough attempts");
        outage.over();
        assert_eq!(outage.attempts(), 0);
        long_ago(&mut outage);
        for _ in 0..MIN_ATTEMPTS {
            assert!(outage.next_delay().is_some(), "a laptop waking up still tries");
        }
        assert_eq!(outage.next_delay(), None);
    }
}
