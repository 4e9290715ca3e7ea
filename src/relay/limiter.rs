//! The per-address WebSocket cap (`http.ws_per_address`, per instance):
//! one client address may hold at most that many sockets; past it the
//! socket is closed 4429 (retry later).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Counts open sockets per client address.
#[derive(Clone, Default)]
pub struct AddressLimiter {
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// Holds one slot until dropped.
pub struct AddressGuard {
    limiter: Option<(AddressLimiter, IpAddr)>,
}

impl AddressLimiter {
    /// Takes a slot for `addr`, or `None` when it already holds `max`.
    pub fn acquire(&self, addr: Option<IpAddr>, max: usize) -> Option<AddressGuard> {
        let Some(addr) = addr else { return Some(AddressGuard { limiter: None }) };
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(addr).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(AddressGuard { limiter: Some((self.clone(), addr)) })
    }
}

impl Drop for AddressGuard {
    fn drop(&mut self) {
        let Some((limiter, addr)) = self.limiter.take() else { return };
        let mut counts = limiter.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&addr) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_counted_and_returned() {
        let limiter = AddressLimiter::default();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let a = limiter.acquire(Some(ip), 2).unwrap();
        let _b = limiter.acquire(Some(ip), 2).unwrap();
        assert!(limiter.acquire(Some(ip), 2).is_none());
        drop(a);
        assert!(limiter.acquire(Some(ip), 2).is_some());
    }
}
