//! Reconnect delays: 1 s doubling to 30 s, plus random jitter (docs/PROTOCOL.md,
//! "Close codes (daemon's reaction)").
//!
//! Jitter spreads the redials of many daemons after an instance dies, so
//! they do not all arrive at the survivors in the same second.

use std::time::Duration;

const FIRST_DELAY: Duration = Duration::from_secs(1);
const MAX_DELAY: Duration = Duration::from_secs(30);

/// Exponential backoff state for the reconnect loop.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    pub fn new() -> Self {
        Self { next: FIRST_DELAY }
    }

    /// The delay before the next attempt: the current step plus up to a
    /// quarter of it as random jitter. Advances the step.
    pub fn next_delay(&mut self) -> Duration {
        let jitter_cap_ms = u64::try_from(self.next.as_millis() / 4).unwrap_or(u64::MAX);
        let jitter = Duration::from_millis(rand::random_range(0..=jitter_cap_ms));
        self.next_step() + jitter
    }

    /// Back to the first step, after a connection that proved healthy.
    pub fn reset(&mut self) {
        self.next = FIRST_DELAY;
    }

    fn next_step(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(MAX_DELAY);
        step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_double_up_to_thirty_seconds() {
        let mut backoff = Backoff::new();
        let steps: Vec<u64> = (0..8).map(|_| backoff.next_step().as_secs()).collect();
        assert_eq!(steps, [1, 2, 4, 8, 16, 30, 30, 30]);
        backoff.reset();
        assert_eq!(backoff.next_step(), FIRST_DELAY);
    }

    #[test]
    fn jitter_stays_within_a_quarter_of_the_step() {
        let mut backoff = Backoff::new();
        for step_secs in [1u64, 2, 4, 8, 16, 30, 30] {
            let delay = backoff.next_delay();
            let step = Duration::from_secs(step_secs);
            assert!(delay >= step && delay <= step + step / 4, "{delay:?} for step {step:?}");
        }
    }
}
