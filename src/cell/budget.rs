//! The fleet's database connection budget in a director outage
//! (docs/CELLS.md, "The connection budget"), as `tether cell budget`
//! prints it.
//!
//! A db cell always holds its full pool. A reserve cell holds its small
//! reserve pool until its dead-man trip, then its full pool. Without a slot
//! cap every reserve cell may trip, so the worst case is every cell at its
//! full pool. With a cap of N trip slots at most N flagged reserve cells
//! are tripped at once, so the worst case is every cell at its own pool
//! plus the N largest steps from reserve pool to full pool.

use std::fmt;

use super::AdmitMode;
use crate::store::CellView;

/// What the budget needs of one cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetCell {
    /// The switch's mode (db when the cell has no switch row).
    pub mode: AdmitMode,
    pub pool_size: u32,
    pub reserve_pool_size: u32,
    /// The switch's `dead_man_trip_slots`.
    pub trip_slots: Option<u8>,
}

impl From<&CellView> for BudgetCell {
    fn from(view: &CellView) -> Self {
        Self {
            mode: view.admit_mode(),
            pool_size: view.cell.pool_size,
            reserve_pool_size: view.cell.reserve_pool_size,
            trip_slots: view.trip_slots(),
        }
    }
}

impl BudgetCell {
    /// Connections once tripped (a pool smaller than the reserve pool never shrinks below it).
    fn tripped(self) -> u64 {
        u64::from(self.pool_size.max(self.reserve_pool_size))
    }

    /// Connections while held in reserve.
    fn held(self) -> u64 {
        u64::from(self.reserve_pool_size)
    }
}

/// The worst case of a fleet in a director outage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub db_cells: usize,
    /// Connections of the db cells (their full pools).
    pub db_connections: u64,
    pub reserve_cells: usize,
    /// Connections of the reserve cells while none has tripped.
    pub reserve_held: u64,
    /// Connections of the reserve cells once all have tripped.
    pub reserve_tripped: u64,
    /// Every reserve cell tripped: db cells + every reserve cell at its full pool.
    pub uncapped: u64,
    /// The bound the slot cap gives, when any reserve cell has one.
    pub capped: Option<CappedBudget>,
}

/// The worst case under the fleet's slot cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CappedBudget {
    /// The cap: the largest `dead_man_trip_slots` of any reserve cell.
    pub slots: u8,
    /// Every distinct cap set on reserve cells, ascending (more than one: a rollout in progress).
    pub distinct_slots: Vec<u8>,
    /// Reserve cells without a cap: they trip without a slot, so they are counted at their full pool.
    pub uncapped_cells: usize,
    pub total: u64,
}

/// Computes the worst case of `cells` in a director outage.
pub fn worst_case(cells: &[BudgetCell]) -> Budget {
    let (db, reserve): (Vec<BudgetCell>, Vec<BudgetCell>) =
        cells.iter().copied().partition(|c| c.mode == AdmitMode::Db);
    let db_connections: u64 = db.iter().map(|c| c.tripped()).sum();
    let reserve_held: u64 = reserve.iter().map(|c| c.held()).sum();
    let reserve_tripped: u64 = reserve.iter().map(|c| c.tripped()).sum();
    let mut distinct_slots: Vec<u8> = reserve.iter().filter_map(|c| c.trip_slots).collect();
    distinct_slots.sort_unstable();
    distinct_slots.dedup();
    let capped = distinct_slots.last().copied().map(|slots| {
        let (flagged, unflagged): (Vec<BudgetCell>, Vec<BudgetCell>) =
            reserve.iter().copied().partition(|c| c.trip_slots.is_some());
        let mut steps: Vec<u64> = flagged.iter().map(|c| c.tripped() - c.held()).collect();
        steps.sort_unstable_by(|a, b| b.cmp(a));
        let largest_steps: u64 = steps.iter().take(usize::from(slots)).sum();
        let total = db_connections
            + unflagged.iter().map(|c| c.tripped()).sum::<u64>()
            + flagged.iter().map(|c| c.held()).sum::<u64>()
            + largest_steps;
        CappedBudget { slots, distinct_slots: distinct_slots.clone(), uncapped_cells: unflagged.len(), total }
    });
    Budget {
        db_cells: db.len(),
        db_connections,
        reserve_cells: reserve.len(),
        reserve_held,
        reserve_tripped,
        uncapped: db_connections + reserve_tripped,
        capped,
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "db cells: {}, {} connections at their full pools", self.db_cells, self.db_connections)?;
        writeln!(
            f,
            "reserve cells: {}, {} connections at their reserve pools, {} at their full pools",
            self.reserve_cells, self.reserve_held, self.reserve_tripped
        )?;
        writeln!(
            f,
            "worst case in a director outage without a slot cap (every reserve cell tripped): {} connections",
            self.uncapped
        )?;
        let Some(capped) = &self.capped else {
            return writeln!(
                f,
                "no reserve cell has dead_man_trip_slots: every reserve cell may trip, so the worst case is {}",
                self.uncapped
            );
        };
        writeln!(
            f,
            "worst case with dead_man_trip_slots = {} (at most {} reserve cells tripped at once): {} connections",
            capped.slots, capped.slots, capped.total
        )?;
        if capped.distinct_slots.len() > 1 {
            let values: Vec<String> = capped.distinct_slots.iter().map(u8::to_string).collect();
            writeln!(f, "note: reserve cells have different caps ({}); the largest counts", values.join(", "))?;
        }
        if capped.uncapped_cells > 0 {
            let (n, what) = match capped.uncapped_cells {
                1 => {
                    (1, "reserve cell has no dead_man_trip_slots: it trips without a slot and counts at its full pool")
                }
                n => (
                    n,
                    "reserve cells have no dead_man_trip_slots: they trip without a slot and count at their full pools",
                ),
            };
            writeln!(f, "note: {n} {what}")?;
        }
        writeln!(
            f,
            "note: the cap holds only once every reserve cell runs a build that honours dead_man_trip_slots (docs/CELLS.md, \"Rollout\")"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells(count: usize, mode: AdmitMode, pool: u32, reserve: u32, slots: Option<u8>) -> Vec<BudgetCell> {
        vec![BudgetCell { mode, pool_size: pool, reserve_pool_size: reserve, trip_slots: slots }; count]
    }

    /// The fleet of docs/CELLS.md's worked example, with `slots` on every reserve cell.
    fn example(slots: Option<u8>) -> Vec<BudgetCell> {
        let mut fleet = cells(6, AdmitMode::Db, 10, 10, None);
        fleet.extend(cells(16, AdmitMode::Reserve, 8, 8, slots));
        fleet.extend(cells(7, AdmitMode::Reserve, 16, 12, slots));
        fleet
    }

    #[test]
    fn the_worked_example_is_300_without_a_cap_and_280_with_two_slots() {
        let budget = worst_case(&example(None));
        assert_eq!((budget.db_cells, budget.db_connections), (6, 60));
        assert_eq!((budget.reserve_cells, budget.reserve_held, budget.reserve_tripped), (23, 212, 240));
        assert_eq!(budget.uncapped, 300);
        assert_eq!(budget.capped, None);

        let budget = worst_case(&example(Some(2)));
        assert_eq!(budget.uncapped, 300);
        let capped = budget.capped.expect("a cap");
        assert_eq!((capped.slots, capped.total, capped.uncapped_cells), (2, 280, 0));
        // 60 + 16 * 8 + 7 * 12 + 2 * (16 - 12)
        assert_eq!(capped.total, 60 + 128 + 84 + 8);
    }

    #[test]
    fn slot_zero_keeps_every_reserve_cell_at_its_reserve_pool() {
        assert_eq!(worst_case(&example(Some(0))).capped.expect("a cap").total, 60 + 212);
    }

    #[test]
    fn mixed_caps_count_the_largest_and_uncapped_cells_their_full_pool() {
        let mut fleet = cells(1, AdmitMode::Db, 10, 10, None);
        fleet.extend(cells(3, AdmitMode::Reserve, 20, 5, Some(1)));
        fleet.extend(cells(1, AdmitMode::Reserve, 20, 5, Some(2)));
        fleet.extend(cells(1, AdmitMode::Reserve, 30, 4, None));
        let capped = worst_case(&fleet).capped.expect("a cap");
        assert_eq!((capped.slots, capped.distinct_slots.clone(), capped.uncapped_cells), (2, vec![1, 2], 1));
        // db 10 + the uncapped cell's full 30 + four flagged at 5 + the two largest steps of 15
        assert_eq!(capped.total, 10 + 30 + 20 + 30);
    }
}
