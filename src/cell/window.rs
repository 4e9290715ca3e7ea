//! The length of a cell's dead-man window (docs/CELLS.md, "The dead-man
//! trip"): how long a reserve cell waits without hearing from the director
//! before it falls back to database admission.
//!
//! The window is `base + (first 4 bytes of sha256(cell id), big-endian, mod
//! (spread + 1))` milliseconds (settings `cell.dead_man_base_ms` and
//! `cell.dead_man_spread_ms`, 60 s each by default, so 60-120 s). It is
//! spread by a hash of the cell id rather than drawn at random so that every
//! restart of a cell keeps the same window, while a fleet that loses its
//! director at one instant does not reach its deadlines at one instant.

use std::time::Duration;

use sha2::{Digest, Sha256};

/// The dead-man window of the cell `cell_id`.
pub fn dead_man_window(cell_id: &str, base: Duration, spread: Duration) -> Duration {
    let digest = Sha256::digest(cell_id.as_bytes());
    let prefix = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    let spread_ms = u64::try_from(spread.as_millis()).unwrap_or(u64::MAX);
    let offset_ms = u64::from(prefix) % spread_ms.saturating_add(1);
    base + Duration::from_millis(offset_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn the_window_is_base_plus_the_hash_prefix_mod_spread_plus_one() {
        // sha256("cell-a") starts 73 33 45 53: 0x73334553 = 1932739923,
        // and 1932739923 mod 60001 = 47712.
        assert_eq!(dead_man_window("cell-a", MINUTE, MINUTE), Duration::from_millis(107_712));
        // sha256("cell-b") starts 45 80 52 f1: 1166037745 mod 60001 = 38312.
        assert_eq!(dead_man_window("cell-b", MINUTE, MINUTE), Duration::from_millis(98_312));
    }

    #[test]
    fn the_window_is_stable_and_stays_within_base_and_base_plus_spread() {
        for n in 0..500 {
            let id = format!("cell-{n}");
            let window = dead_man_window(&id, MINUTE, MINUTE);
            assert!(window >= MINUTE && window <= 2 * MINUTE, "{id}: {window:?}");
            assert_eq!(window, dead_man_window(&id, MINUTE, MINUTE));
        }
    }

    #[test]
    fn no_spread_gives_the_base_exactly() {
        assert_eq!(dead_man_window("cell-a", MINUTE, Duration::ZERO), MINUTE);
    }

    #[test]
    fn cells_spread_over_the_window() {
        let windows: std::collections::HashSet<_> =
            (0..50).map(|n| dead_man_window(&format!("cell-{n}"), MINUTE, MINUTE)).collect();
        assert!(windows.len() > 45, "50 cells share only {} windows", windows.len());
    }
}
