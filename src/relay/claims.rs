//! One claim of a host at a time on this instance (docs/CLUSTER.md,
//! "Ownership: the host lease"): a daemon's hello registers with the
//! `HostRegistry`, subscribes and seizes the lease while holding its host's
//! turn, so the connection the registry keeps is always the one whose seize
//! committed last. Without the turn, two hellos for one host could commit
//! in the other order: the older connection ended up holding the lease,
//! released it as it was replaced, and left the kept one acknowledged but
//! lease-less.
//!
//! Turns are per host, so hellos of different hosts never wait for each
//! other, and a host's entry lives only while one of its claims is in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as TurnLock, OwnedMutexGuard};
use uuid::Uuid;

/// The hosts whose claims are in flight on this instance.
#[derive(Clone, Default)]
pub struct HostClaims {
    turns: Arc<Mutex<HashMap<Uuid, Arc<TurnLock<()>>>>>,
}

/// A host's turn to be claimed; the next claim of the host starts when it
/// is dropped.
pub struct ClaimTurn {
    host_id: Uuid,
    claims: HostClaims,
    guard: Option<OwnedMutexGuard<()>>,
}

impl HostClaims {
    /// Waits until no other claim of `host_id` is in flight here; claims
    /// take their turns in the order they asked.
    pub async fn turn(&self, host_id: Uuid) -> ClaimTurn {
        let lock = self.map().entry(host_id).or_default().clone();
        let guard = lock.lock_owned().await;
        ClaimTurn { host_id, claims: self.clone(), guard: Some(guard) }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Arc<TurnLock<()>>>> {
        self.turns.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for ClaimTurn {
    fn drop(&mut self) {
        let mut turns = self.claims.map();
        // The guard goes while the map is held: a claim that asked
        // meanwhile holds the lock too (a second reference) and the entry
        // stays for it; with none waiting, the entry goes.
        self.guard.take();
        if turns.get(&self.host_id).is_some_and(|lock| Arc::strong_count(lock) == 1) {
            turns.remove(&self.host_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_hosts_claims_take_turns_and_leave_nothing_behind() {
        let claims = HostClaims::default();
        let host = Uuid::new_v4();
        let first = claims.turn(host).await;
        // Another host's claim does not wait.
        let other = tokio::time::timeout(Duration::from_millis(100), claims.turn(Uuid::new_v4())).await;
        assert!(other.is_ok(), "another host's claim goes on");
        drop(other);
        let second = tokio::spawn({
            let claims = claims.clone();
            async move { drop(claims.turn(host).await) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "the second claim waits for the first");
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), second).await.expect("the second claim goes").expect("task");
        assert!(claims.map().is_empty(), "no entry is left once the claims are done");
    }
}
