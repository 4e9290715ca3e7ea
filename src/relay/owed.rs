//! Work an instance owes before it may exit, counted, and a wait for the
//! count to reach zero (docs/ARCHITECTURE.md, "Drain"): the lease releases
//! of connections that ended ([`super::releases`]), the daemon writes not
//! yet stored ([`super::daemon_conn::writes`]), the audit events not
//! yet written ([`crate::audit`]) and the WebSockets whose last bytes are
//! not out yet ([`crate::http::upgraded`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// How many pieces of work are owed.
#[derive(Debug, Default)]
pub struct Owed {
    count: AtomicUsize,
    /// Woken whenever `count` drops to zero.
    none: Notify,
}

impl Owed {
    /// `n` more are owed.
    pub fn add(&self, n: usize) {
        self.count.fetch_add(n, Ordering::AcqRel);
    }

    /// `n` owed ones are done (or will never be done).
    pub fn settle(&self, n: usize) {
        if n > 0 && self.count.fetch_sub(n, Ordering::AcqRel) == n {
            self.none.notify_waiters();
        }
    }

    /// How many are owed now.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Returns once nothing is owed.
    pub async fn settled(&self) {
        loop {
            let none = self.none.notified();
            if self.count() == 0 {
                return;
            }
            none.await;
        }
    }

    /// One more is owed until the returned guard drops.
    pub fn one(self: &Arc<Self>) -> OwedOne {
        self.add(1);
        OwedOne(self.clone())
    }
}

/// One owed piece of work, settled when dropped.
pub struct OwedOne(Arc<Owed>);

impl Drop for OwedOne {
    fn drop(&mut self) {
        self.0.settle(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn settled_waits_until_the_last_owed_one_is_done() {
        let owed = Arc::new(Owed::default());
        owed.settled().await;
        let one = owed.one();
        owed.add(2);
        assert_eq!(owed.count(), 3);
        let waiting = tokio::spawn({
            let owed = owed.clone();
            async move { owed.settled().await }
        });
        owed.settle(2);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "one is still owed");
        drop(one);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("settled once nothing is owed")
            .expect("the waiting task");
        assert_eq!(owed.count(), 0);
    }
}
