//! The WebSocket caps (docs/CONFIG.md, `http.ws_per_address` and
//! `http.ws_per_user`, per instance): one user may hold at most
//! `ws_per_address` sockets from one client address and `ws_per_user` in
//! all; past either the socket is closed 4429 (retry later). Counting by
//! user keeps one user's sockets from exhausting another's behind a shared
//! NAT or proxy. A `read` token is counted as a user of its own
//! (`Principal::cap_holder`).

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

/// Open sockets counted by key.
struct Counts<K>(Mutex<HashMap<K, usize>>);

impl<K> Default for Counts<K> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<K: Hash + Eq + Clone> Counts<K> {
    fn take(&self, key: &K, max: usize) -> bool {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(key.clone()).or_insert(0);
        if *count >= max {
            if *count == 0 {
                counts.remove(key);
            }
            return false;
        }
        *count += 1;
        true
    }

    fn give_back(&self, key: &K) {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                counts.remove(key);
            }
        }
    }
}

/// Counts open sockets per (user, client address) and per user.
#[derive(Clone, Default)]
pub struct AddressLimiter {
    per_address: Arc<Counts<(Uuid, IpAddr)>>,
    per_user: Arc<Counts<Uuid>>,
}

/// The caps a socket is held to.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub per_address: usize,
    pub per_user: usize,
}

/// Which cap refused a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapReached {
    Address,
    User,
}

impl CapReached {
    /// The close reason sent with 4429.
    pub fn reason(self) -> &'static str {
        match self {
            CapReached::Address => "too many connections from this address",
            CapReached::User => "too many connections of this user",
        }
    }
}

/// Holds one slot until dropped.
pub struct AddressGuard {
    limiter: Option<(AddressLimiter, Uuid, Option<IpAddr>)>,
}

impl AddressLimiter {
    /// Takes a slot for `user` at `addr` (None: the address is unknown and
    /// only the user cap applies).
    pub fn acquire(&self, user: Uuid, addr: Option<IpAddr>, caps: Caps) -> Result<AddressGuard, CapReached> {
        if !self.per_user.take(&user, caps.per_user) {
            return Err(CapReached::User);
        }
        if let Some(addr) = addr {
            if !self.per_address.take(&(user, addr), caps.per_address) {
                self.per_user.give_back(&user);
                return Err(CapReached::Address);
            }
        }
        Ok(AddressGuard { limiter: Some((self.clone(), user, addr)) })
    }
}

impl Drop for AddressGuard {
    fn drop(&mut self) {
        let Some((limiter, user, addr)) = self.limiter.take() else { return };
        if let Some(addr) = addr {
            limiter.per_address.give_back(&(user, addr));
        }
        limiter.per_user.give_back(&user);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: Caps = Caps { per_address: 2, per_user: 3 };

    #[test]
    fn slots_are_counted_and_returned() {
        let limiter = AddressLimiter::default();
        let ann = Uuid::new_v4();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let a = limiter.acquire(ann, Some(ip), CAPS).unwrap();
        let _b = limiter.acquire(ann, Some(ip), CAPS).unwrap();
        assert_eq!(limiter.acquire(ann, Some(ip), CAPS).err(), Some(CapReached::Address));
        drop(a);
        assert!(limiter.acquire(ann, Some(ip), CAPS).is_ok());
    }

    #[test]
    fn one_users_sockets_leave_another_users_slots_alone() {
        let limiter = AddressLimiter::default();
        let (ann, bob) = (Uuid::new_v4(), Uuid::new_v4());
        let nat: IpAddr = "203.0.113.1".parse().unwrap();
        let _held: Vec<_> = (0..2).map(|_| limiter.acquire(ann, Some(nat), CAPS).unwrap()).collect();
        assert_eq!(limiter.acquire(ann, Some(nat), CAPS).err(), Some(CapReached::Address));
        assert!(limiter.acquire(bob, Some(nat), CAPS).is_ok(), "bob behind the same address is served");
    }

    #[test]
    fn the_user_cap_spans_addresses() {
        let limiter = AddressLimiter::default();
        let ann = Uuid::new_v4();
        let _held: Vec<_> =
            (1..=3u8).map(|i| limiter.acquire(ann, Some(IpAddr::from([10, 0, 0, i])), CAPS).unwrap()).collect();
        assert_eq!(limiter.acquire(ann, Some(IpAddr::from([10, 0, 0, 9])), CAPS).err(), Some(CapReached::User));
        // A refusal by the address cap gives the user slot back.
        let bob = Uuid::new_v4();
        let ip = IpAddr::from([10, 0, 0, 1]);
        let _b: Vec<_> = (0..2).map(|_| limiter.acquire(bob, Some(ip), CAPS).unwrap()).collect();
        assert_eq!(limiter.acquire(bob, Some(ip), CAPS).err(), Some(CapReached::Address));
        assert!(limiter.acquire(bob, Some(IpAddr::from([10, 0, 0, 2])), CAPS).is_ok(), "third user slot still free");
    }
}
