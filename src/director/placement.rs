//! Placement (docs/CELLS.md, "Placement"), as plain state: which cell the
//! director gives a daemon that asks `POST /v1/assign`, and at which epoch.
//!
//! A [`Placement`] is one assign request. The caller asks it for the next
//! [`Step`], carries the step out (a `POST /internal/v1/reserve` to the cell,
//! or a relay_assignments write) and reports each booking answer back:
//! - a host connected to a cell that looks held to the director (its row
//!   says `reserve`, its switch says `reserve`, and its seat feed has not
//!   answered within `director.fresh_ms`) is never re-placed: it is told to
//!   stay, at its assignment epoch (0 when it has none: a host booked
//!   there, whose booking wrote no assignment row), and a redial there is
//!   admitted from memory or by the database check;
//! - reserve placement: the candidates are the cells whose switch says
//!   `reserve`, whose row does not say `db` (a tripped cell answers `off`)
//!   and whose seat feed answered within `director.fresh_ms`; of two picked
//!   at random, the one with fewer seats + bookings is booked; at most 3
//!   booking attempts. `full`, `draining` and `off` rule that cell out for
//!   this request. `seated-newer{epoch}` says the cell already knows the
//!   host at `epoch`: the next attempt books at `epoch + 1` (and may go to
//!   the same cell, which did not refuse a seat);
//! - otherwise the database path: only cells whose switch says `db`, or
//!   whose own effective row says `db` and was written within
//!   `director.effective_fresh_ms`, and never a cell whose row says
//!   `reserve` (a held cell keeps writing `reserve`); the same two choices
//!   pick among them, and the caller writes relay_assignments at the epoch.
//!   A cell that counts by its switch must also be alive: its latest poll
//!   did not fail, and its effective row was written within
//!   `director.effective_fresh_ms` or its seat feed answered within
//!   `director.fresh_ms`. A cell that stopped stays listed in relay_cells,
//!   and with no switch row it reads `db`: without this, daemons were sent
//!   to cells long gone. A tripped cell counts by its fresh row alone: it
//!   tripped because the director did not reach it. Cells whose latest
//!   poll answered are picked from first; the others only when none did.
//!
//! The epoch is the host's assignment epoch + 1 (1 for a host never placed).
//! Times are unix milliseconds: the effective rows carry database time.

use std::collections::HashSet;

use rand::Rng;

use crate::cell::bookings::{ReserveAnswer, SeatFigures};
use crate::cell::AdmitMode;

/// Booking attempts per assign request before the database path.
pub const MAX_BOOKING_ATTEMPTS: u8 = 3;

/// A cell's own effective row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectiveRow {
    pub mode: AdmitMode,
    pub updated_at_ms: i64,
}

/// What the director knows of one cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellState {
    pub cell_id: String,
    pub switch: AdmitMode,
    pub effective: Option<EffectiveRow>,
    /// When its seat feed last answered.
    pub polled_at_ms: Option<i64>,
    /// Its latest poll failed (refused, timed out, a bad answer).
    pub poll_failing: bool,
    /// What its seat feed last said (plus the bookings made since).
    pub figures: SeatFigures,
}

impl CellState {
    fn row_says(&self, mode: AdmitMode) -> bool {
        self.effective.is_some_and(|row| row.mode == mode)
    }

    fn polled_within(&self, now_ms: i64, fresh_ms: i64) -> bool {
        self.polled_at_ms.is_some_and(|at| now_ms - at <= fresh_ms)
    }

    /// Its effective row says `mode` and was written within `fresh_ms`.
    fn row_fresh(&self, now_ms: i64, fresh_ms: i64) -> Option<AdmitMode> {
        self.effective.filter(|row| now_ms - row.updated_at_ms <= fresh_ms).map(|row| row.mode)
    }

    fn load(&self) -> usize {
        self.figures.seats + self.figures.bookings
    }
}

/// `director.fresh_ms` and `director.effective_fresh_ms`.
#[derive(Debug, Clone, Copy)]
pub struct Freshness {
    pub fresh_ms: i64,
    pub effective_fresh_ms: i64,
}

/// The host asking to be placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    /// Its assignment epoch, if it was ever placed.
    pub epoch: Option<i64>,
    /// The cell holding its live connection, if any.
    pub connected_on: Option<String>,
}

/// What the caller does next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Step {
    /// Book the host on this cell at this epoch, and report the answer.
    Book { cell_id: String, epoch: i64 },
    /// The host stays on the held cell it is connected to, at its epoch.
    Stay { cell_id: String, epoch: i64 },
    /// Write relay_assignments: the host goes to this cell at this epoch.
    Database { cell_id: String, epoch: i64 },
    /// No cell can take the host now.
    NoCell,
}

#[derive(Debug)]
pub struct Placement {
    freshness: Freshness,
    host: HostView,
    epoch: i64,
    attempts: u8,
    ruled_out: HashSet<String>,
}

impl Placement {
    pub fn new(host: HostView, freshness: Freshness) -> Self {
        let epoch = host.epoch.map_or(1, |epoch| epoch.saturating_add(1));
        Self { freshness, host, epoch, attempts: 0, ruled_out: HashSet::new() }
    }

    /// The epoch the next booking or assignment is made at.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    pub fn next<R: Rng + ?Sized>(&mut self, cells: &[CellState], now_ms: i64, rng: &mut R) -> Step {
        if let Some(step) = self.stay_on_held_cell(cells, now_ms) {
            return step;
        }
        let Freshness { fresh_ms, effective_fresh_ms } = self.freshness;
        if self.attempts < MAX_BOOKING_ATTEMPTS {
            let reserve: Vec<&CellState> = cells
                .iter()
                .filter(|cell| {
                    cell.switch == AdmitMode::Reserve
                        && !cell.row_says(AdmitMode::Db)
                        && cell.polled_within(now_ms, fresh_ms)
                        && !self.ruled_out.contains(&cell.cell_id)
                })
                .collect();
            if let Some(cell) = lighter_of_two(&reserve, rng) {
                self.attempts += 1;
                return Step::Book { cell_id: cell.cell_id.clone(), epoch: self.epoch };
            }
        }
        let database: Vec<&CellState> = cells
            .iter()
            .filter(|cell| {
                let fresh_row = cell.row_fresh(now_ms, effective_fresh_ms);
                // A reserve cell whose own row says db. A db cell writes a
                // db row too, but counts by its switch: it must be alive.
                let tripped = cell.switch == AdmitMode::Reserve && fresh_row == Some(AdmitMode::Db);
                let alive = !cell.poll_failing && (fresh_row.is_some() || cell.polled_within(now_ms, fresh_ms));
                !cell.row_says(AdmitMode::Reserve) && (tripped || (cell.switch == AdmitMode::Db && alive))
            })
            .collect();
        // Cells that answer their feed first: a tripped cell the director
        // cannot reach may be one that just stopped, its row still fresh.
        let answering: Vec<&CellState> = database.iter().copied().filter(|cell| !cell.poll_failing).collect();
        let pool = if answering.is_empty() { &database } else { &answering };
        match lighter_of_two(pool, rng) {
            Some(cell) => Step::Database { cell_id: cell.cell_id.clone(), epoch: self.epoch },
            None => Step::NoCell,
        }
    }

    /// The cell's answer to [`Step::Book`]; `true` once the host is booked
    /// (at [`Self::epoch`]).
    pub fn answered(&mut self, cell_id: &str, answer: ReserveAnswer) -> bool {
        match answer {
            ReserveAnswer::Ok => return true,
            ReserveAnswer::Full | ReserveAnswer::Draining | ReserveAnswer::Off => {
                self.ruled_out.insert(cell_id.to_owned());
            }
            ReserveAnswer::SeatedNewer { epoch } => self.epoch = self.epoch.max(epoch.saturating_add(1)),
        }
        false
    }

    /// The reserve request to `cell_id` failed: that cell is out.
    pub fn unreachable(&mut self, cell_id: &str) {
        self.ruled_out.insert(cell_id.to_owned());
    }

    fn stay_on_held_cell(&self, cells: &[CellState], now_ms: i64) -> Option<Step> {
        let connected_on = self.host.connected_on.as_deref()?;
        let epoch = self.host.epoch.unwrap_or(0);
        let cell = cells.iter().find(|cell| cell.cell_id == connected_on)?;
        let held = cell.switch == AdmitMode::Reserve
            && cell.row_says(AdmitMode::Reserve)
            && !cell.polled_within(now_ms, self.freshness.fresh_ms);
        held.then(|| Step::Stay { cell_id: cell.cell_id.clone(), epoch })
    }
}

/// Power of two choices: of two distinct cells picked at random, the one
/// with fewer seats + bookings (the first on a tie).
fn lighter_of_two<'a, R: Rng + ?Sized>(cells: &[&'a CellState], rng: &mut R) -> Option<&'a CellState> {
    match cells.len() {
        0 => None,
        1 => Some(cells[0]),
        n => {
            let picked = rand::seq::index::sample(rng, n, 2);
            let (a, b) = (cells[picked.index(0)], cells[picked.index(1)]);
            Some(if b.load() < a.load() { b } else { a })
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;

    const NOW: i64 = 1_800_000_000_000;
    const FRESHNESS: Freshness = Freshness { fresh_ms: 3_000, effective_fresh_ms: 45_000 };

    fn cell(
        id: &str,
        switch: AdmitMode,
        row: Option<(AdmitMode, i64)>,
        polled_ago: Option<i64>,
        load: usize,
    ) -> CellState {
        CellState {
            cell_id: id.to_owned(),
            switch,
            effective: row.map(|(mode, ago)| EffectiveRow { mode, updated_at_ms: NOW - ago }),
            polled_at_ms: polled_ago.map(|ago| NOW - ago),
            poll_failing: false,
            figures: SeatFigures { seats: load, bookings: 0 },
        }
    }

    /// A reserve cell writing its row and polled `polled_ago` ms ago.
    fn reserve(id: &str, polled_ago: i64, load: usize) -> CellState {
        cell(id, AdmitMode::Reserve, Some((AdmitMode::Reserve, 1_000)), Some(polled_ago), load)
    }

    fn new_host() -> HostView {
        HostView { epoch: Some(4), connected_on: None }
    }

    /// Where the first step of a new placement goes, over many seeds.
    fn first_steps(cells: &[CellState], host: &HostView) -> HashSet<Step> {
        (0..200)
            .map(|seed| Placement::new(host.clone(), FRESHNESS).next(cells, NOW, &mut StdRng::seed_from_u64(seed)))
            .collect()
    }

    fn book(id: &str, epoch: i64) -> Step {
        Step::Book { cell_id: id.to_owned(), epoch }
    }

    fn database(id: &str, epoch: i64) -> Step {
        Step::Database { cell_id: id.to_owned(), epoch }
    }

    #[test]
    fn only_reserve_cells_polled_in_the_last_three_seconds_are_booked() {
        let cells = [
            reserve("fresh", 3_000, 50),
            reserve("stale", 3_001, 0),
            cell("switched", AdmitMode::Db, Some((AdmitMode::Db, 1_000)), Some(0), 0),
            cell("tripped", AdmitMode::Reserve, Some((AdmitMode::Db, 1_000)), Some(0), 0),
        ];
        assert_eq!(first_steps(&cells, &new_host()), HashSet::from([book("fresh", 5)]));
    }

    #[test]
    fn of_two_cells_picked_the_lighter_is_booked() {
        let cells = [reserve("light", 0, 0), reserve("middle", 0, 5), reserve("heavy", 0, 10)];
        let steps = first_steps(&cells, &new_host());
        assert_eq!(steps, HashSet::from([book("light", 5), book("middle", 5)]), "the heaviest never wins a pair");
    }

    #[test]
    fn after_three_refusals_the_host_goes_the_database_path() {
        let mut cells: Vec<CellState> = (0..5).map(|n| reserve(&format!("r{n}"), 0, n)).collect();
        cells.push(cell("db", AdmitMode::Db, Some((AdmitMode::Db, 1_000)), None, 0));
        let mut rng = StdRng::seed_from_u64(1);
        let mut placement = Placement::new(new_host(), FRESHNESS);
        let mut booked = HashSet::new();
        let answers = [ReserveAnswer::Full, ReserveAnswer::Draining, ReserveAnswer::Off];
        for answer in answers {
            let Step::Book { cell_id, epoch } = placement.next(&cells, NOW, &mut rng) else { panic!("a booking") };
            assert_eq!(epoch, 5);
            assert!(booked.insert(cell_id.clone()), "a refusing cell is not asked again");
            assert!(!placement.answered(&cell_id, answer));
        }
        assert_eq!(placement.next(&cells, NOW, &mut rng), database("db", 5));
    }

    #[test]
    fn seated_newer_books_at_its_epoch_plus_one() {
        let cells = [reserve("only", 0, 0)];
        let mut rng = StdRng::seed_from_u64(1);
        let mut placement = Placement::new(new_host(), FRESHNESS);
        assert_eq!(placement.next(&cells, NOW, &mut rng), book("only", 5));
        assert!(!placement.answered("only", ReserveAnswer::SeatedNewer { epoch: 7 }));
        assert_eq!(placement.next(&cells, NOW, &mut rng), book("only", 8));
        assert!(placement.answered("only", ReserveAnswer::Ok));
        assert_eq!(placement.epoch(), 8);
        // A never-placed host starts at epoch 1.
        let fresh = HostView { epoch: None, connected_on: None };
        assert_eq!(Placement::new(fresh, FRESHNESS).next(&cells, NOW, &mut rng), book("only", 1));
    }

    #[test]
    fn the_database_path_places_only_on_db_cells_never_on_a_row_that_says_reserve() {
        let cells = [
            cell("switched", AdmitMode::Db, Some((AdmitMode::Db, 1_000)), None, 0),
            // A tripped slot holder: its row says db, written 44 s ago.
            cell("tripped", AdmitMode::Reserve, Some((AdmitMode::Db, 44_000)), Some(60_000), 0),
            cell("tripped-stale", AdmitMode::Reserve, Some((AdmitMode::Db, 46_000)), None, 0),
            // Held: no poll for a minute, and it keeps writing reserve.
            cell("held", AdmitMode::Reserve, Some((AdmitMode::Reserve, 1_000)), Some(60_000), 0),
            cell("switched-not-yet-written", AdmitMode::Db, Some((AdmitMode::Reserve, 1_000)), None, 0),
        ];
        assert_eq!(first_steps(&cells, &new_host()), HashSet::from([database("switched", 5), database("tripped", 5)]));
        assert_eq!(first_steps(&cells[3..], &new_host()), HashSet::from([Step::NoCell]));
    }

    /// A db cell must be alive to be given a host: its row written lately
    /// or its feed answering. Cells that stopped stay in relay_cells, read
    /// `db` with no switch row, and used to get most database placements.
    #[test]
    fn the_database_path_places_only_on_cells_that_are_alive() {
        let cells = [
            cell("gone", AdmitMode::Db, Some((AdmitMode::Db, 120_000)), None, 0),
            cell("gone-never-wrote", AdmitMode::Db, None, Some(60_000), 0),
            cell("writing", AdmitMode::Db, Some((AdmitMode::Db, 45_000)), None, 5),
            cell("answering", AdmitMode::Db, None, Some(3_000), 5),
        ];
        assert_eq!(first_steps(&cells, &new_host()), HashSet::from([database("writing", 5), database("answering", 5)]));
        assert_eq!(first_steps(&cells[..2], &new_host()), HashSet::from([Step::NoCell]));
        // It answered a moment ago, but its latest poll failed: it just went
        // away. A tripped cell whose feed fails still counts by its row.
        let mut refusing = cells[3].clone();
        refusing.poll_failing = true;
        // So is one whose own db row is fresh: every db cell writes one.
        let mut frozen = cell("frozen", AdmitMode::Db, Some((AdmitMode::Db, 1_000)), Some(3_000), 0);
        frozen.poll_failing = true;
        assert_eq!(first_steps(&[refusing.clone(), frozen.clone()], &new_host()), HashSet::from([Step::NoCell]));
        let mut tripped = cell("tripped", AdmitMode::Reserve, Some((AdmitMode::Db, 1_000)), None, 0);
        tripped.poll_failing = true;
        assert_eq!(
            first_steps(&[refusing, frozen, tripped.clone()], &new_host()),
            HashSet::from([database("tripped", 5)])
        );
        // ... but a cell that answers goes first, however loaded.
        let answering = cell("answering", AdmitMode::Db, Some((AdmitMode::Db, 1_000)), Some(0), 50);
        assert_eq!(first_steps(&[tripped, answering], &new_host()), HashSet::from([database("answering", 5)]));
    }

    #[test]
    fn a_connected_host_of_a_held_cell_stays_there() {
        let cells = [
            cell("held", AdmitMode::Reserve, Some((AdmitMode::Reserve, 1_000)), Some(60_000), 0),
            cell("db", AdmitMode::Db, None, None, 0),
            reserve("fresh", 0, 0),
        ];
        let connected = HostView { epoch: Some(4), connected_on: Some("held".into()) };
        assert_eq!(first_steps(&cells, &connected), HashSet::from([Step::Stay { cell_id: "held".into(), epoch: 4 }]));
        // Booked there, so never given an assignment row: it stays too.
        let booked = HostView { epoch: None, connected_on: Some("held".into()) };
        assert_eq!(first_steps(&cells, &booked), HashSet::from([Step::Stay { cell_id: "held".into(), epoch: 0 }]));
        // Once the director hears from the cell again, it is not held.
        let mut heard = cells.clone();
        heard[0].polled_at_ms = Some(NOW);
        let steps = first_steps(&heard, &connected);
        assert!(steps.iter().all(|step| matches!(step, Step::Book { .. })), "{steps:?}");
    }
}
