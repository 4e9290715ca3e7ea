//! Cell rows (docs/CELLS.md, "Tables"): the registry of relay cells, the
//! operator's switch of each cell, the mode each cell says it admits in,
//! and the slot claim's rule. Both backends read their rows into these
//! types and decide a claim with [`slot_claim`], so only the SQL differs
//! between them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::StoreError;
use crate::cell::AdmitMode;

/// The most trip slots a switch may allow (the column's CHECK says the same).
pub const MAX_TRIP_SLOTS: u8 = 64;

/// A cell as it registers itself at start (`relay_cells`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CellRow {
    pub cell_id: String,
    pub url: String,
    pub region: String,
    /// Database connections the cell opens in db mode (and after a trip).
    pub pool_size: u32,
    /// Database connections the cell opens in reserve mode.
    pub reserve_pool_size: u32,
}

/// The operator's switch of one cell (`relay_cell_admit_modes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CellSwitch {
    pub cell_id: String,
    pub admit_mode: AdmitMode,
    /// How many reserve cells may have tripped at once; None: no cap (trip at once).
    pub dead_man_trip_slots: Option<u8>,
    /// Bumped by every write; a new generation re-arms a latched dead-man trip.
    pub generation: i64,
    /// When the switch was last written, by the database's clock.
    pub updated_at: DateTime<Utc>,
}

/// The mode a cell says it admits in (`relay_cell_admit_effective`;
/// written only by that cell).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CellEffective {
    pub mode: AdmitMode,
    /// The writing process's boot id, so a restart is told from a refresh.
    pub cell_incarnation: String,
    /// When the cell last wrote the row, by the database's clock.
    pub updated_at: DateTime<Utc>,
}

/// A registered cell with its switch and its effective row, if any: the
/// director's and `tether cell budget`'s input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CellView {
    #[serde(flatten)]
    pub cell: CellRow,
    pub switch: Option<CellSwitch>,
    pub effective: Option<CellEffective>,
    /// The database's clock when the rows were read: freshness of
    /// `effective` is judged against it, not against the reader's clock.
    pub read_at: DateTime<Utc>,
}

impl CellView {
    /// The switch's mode; a cell without a switch row admits through the database.
    pub fn admit_mode(&self) -> AdmitMode {
        self.switch.as_ref().map_or(AdmitMode::Db, |s| s.admit_mode)
    }

    /// The switch's slot cap (None: no switch, or no cap).
    pub fn trip_slots(&self) -> Option<u8> {
        self.switch.as_ref().and_then(|s| s.dead_man_trip_slots)
    }
}

/// The answer of a trip-slot claim (docs/CELLS.md, "The slot claim").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotClaim {
    /// Fewer than the cap held a slot: this cell's row now says `db`.
    Won,
    /// `holders` other live cells hold the slots: nothing was written.
    Refused { holders: u32 },
    /// Another cell was claiming at that moment: nothing was written; ask again.
    Busy,
}

/// The claim's rule, the same on both backends: with `holders` other live
/// slot holders, a cell wins only below the cap, so a cap of 0 never wins.
pub fn slot_claim(slots: u8, holders: i64) -> SlotClaim {
    if holders < i64::from(slots) {
        SlotClaim::Won
    } else {
        SlotClaim::Refused { holders: u32::try_from(holders).unwrap_or(u32::MAX) }
    }
}

/// Refuses a slot cap outside 0..=64 before anything is written.
pub fn check_trip_slots(slots: Option<Option<u8>>) -> Result<(), StoreError> {
    match slots {
        Some(Some(n)) if n > MAX_TRIP_SLOTS => Err(StoreError::Invalid(format!(
            "dead_man_trip_slots must be between 0 and {MAX_TRIP_SLOTS} (or none), not {n}"
        ))),
        _ => Ok(()),
    }
}

/// A batch of (host, epoch) with each host once, at its highest epoch: one
/// upsert statement may touch a row only once.
pub(crate) fn highest_epochs(hosts: &[(Uuid, i64)]) -> Vec<(Uuid, i64)> {
    let mut highest: BTreeMap<Uuid, i64> = BTreeMap::new();
    for &(host, epoch) in hosts {
        let entry = highest.entry(host).or_insert(epoch);
        *entry = (*entry).max(epoch);
    }
    highest.into_iter().collect()
}

/// Reads a stored mode.
pub(crate) fn admit_mode(text: &str) -> Result<AdmitMode, StoreError> {
    text.parse().map_err(|e| StoreError::Corrupt(format!("{e}")))
}

/// Reads a stored slot cap (the column's CHECK keeps it in 0..=64).
pub(crate) fn trip_slots(stored: Option<i64>) -> Result<Option<u8>, StoreError> {
    stored
        .map(|n| u8::try_from(n).ok().filter(|n| *n <= MAX_TRIP_SLOTS).ok_or(n))
        .transpose()
        .map_err(|n| StoreError::Corrupt(format!("dead_man_trip_slots {n}")))
}

/// Reads a stored pool size.
pub(crate) fn pool_size(stored: i64) -> Result<u32, StoreError> {
    u32::try_from(stored).map_err(|_| StoreError::Corrupt(format!("pool size {stored}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_wins_only_below_the_cap() {
        assert_eq!(slot_claim(2, 0), SlotClaim::Won);
        assert_eq!(slot_claim(2, 1), SlotClaim::Won);
        assert_eq!(slot_claim(2, 2), SlotClaim::Refused { holders: 2 });
        assert_eq!(slot_claim(0, 0), SlotClaim::Refused { holders: 0 }, "slot 0 never wins");
    }

    #[test]
    fn a_batch_names_each_host_once_at_its_highest_epoch() {
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        assert_eq!(highest_epochs(&[(b, 3), (a, 5), (b, 7), (a, 2)]), vec![(a, 5), (b, 7)]);
    }

    #[test]
    fn slot_caps_stay_in_range() {
        assert!(check_trip_slots(Some(Some(64))).is_ok());
        assert!(check_trip_slots(Some(None)).is_ok());
        assert!(check_trip_slots(None).is_ok());
        let err = check_trip_slots(Some(Some(65))).expect_err("65 is refused");
        assert!(err.to_string().contains("between 0 and 64"), "{err}");
        assert_eq!(trip_slots(Some(3)).expect("3"), Some(3));
        assert!(trip_slots(Some(65)).is_err());
        assert!(trip_slots(Some(-1)).is_err());
    }
}
