//! The director's view of the cells (docs/CELLS.md, "Running a director"),
//! as plain state: what [`super::placement`] places by. The poller
//! ([`super::poller`]) feeds it two things each `director.poll_ms`:
//!
//! - the registry read (`Store::list_cells`): which cells exist, their url,
//!   switch and effective row. The effective row's `updated_at` is the
//!   database's clock; it is moved onto the director's clock by its age at
//!   the read (`read_at - updated_at`), so a skewed director clock cannot
//!   make a stale row look fresh or the other way round;
//! - each cell's seat feed (`GET /internal/v1/seats`): when it last
//!   answered, and its seats and bookings. A failed poll changes nothing:
//!   the cell simply stops being fresh once `director.fresh_ms` passes.
//!
//! Times are unix milliseconds on the director's clock.

use std::collections::BTreeMap;

use super::placement::{CellState, EffectiveRow};
use crate::cell::bookings::SeatFigures;
use crate::cell::feed::SeatFeed;
use crate::store::CellView;

/// One registered cell: where it is and what the director knows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FleetCell {
    url: String,
    state: CellState,
}

/// Why a seat feed was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeedRefused {
    #[error("the cell is not registered (any more)")]
    Unknown,
    /// The url of the row answers for another cell (a misconfigured url).
    #[error("the feed at this cell's url is cell {0}'s")]
    OtherCell(String),
}

#[derive(Debug, Default)]
pub struct Fleet {
    cells: BTreeMap<String, FleetCell>,
}

impl Fleet {
    /// Takes a registry read made when the director's clock said
    /// `read_local_ms`: cells no longer registered are forgotten, new ones
    /// start never polled, every switch and effective row is replaced.
    pub fn listed(&mut self, views: &[CellView], read_local_ms: i64) {
        let mut cells = BTreeMap::new();
        for view in views {
            let cell_id = view.cell.cell_id.clone();
            let (polled_at_ms, figures) = match self.cells.remove(&cell_id) {
                Some(known) => (known.state.polled_at_ms, known.state.figures),
                None => (None, SeatFigures { seats: 0, bookings: 0 }),
            };
            let effective = view.effective.as_ref().map(|row| EffectiveRow {
                mode: row.mode,
                updated_at_ms: read_local_ms - (view.read_at - row.updated_at).num_milliseconds(),
            });
            let state = CellState {
                cell_id: cell_id.clone(),
                switch: view.admit_mode(),
                effective,
                polled_at_ms,
                poll_failing: false,
                figures,
            };
            cells.insert(cell_id, FleetCell { url: view.cell.url.clone(), state });
        }
        self.cells = cells;
    }

    /// `cell_id`'s seat feed answered `feed` at `at_ms`.
    pub fn polled(&mut self, cell_id: &str, feed: &SeatFeed, at_ms: i64) -> Result<(), FeedRefused> {
        let cell = self.cells.get_mut(cell_id).ok_or(FeedRefused::Unknown)?;
        if feed.cell_id != cell_id {
            return Err(FeedRefused::OtherCell(feed.cell_id.clone()));
        }
        cell.state.polled_at_ms = Some(at_ms);
        cell.state.figures = feed.figures;
        Ok(())
    }

    /// The director booked a host on `cell_id`: it counts against the cell
    /// until its next feed says otherwise.
    pub fn booked(&mut self, cell_id: &str) {
        if let Some(cell) = self.cells.get_mut(cell_id) {
            cell.state.figures.bookings += 1;
        }
    }

    /// Every cell's state, by cell id.
    pub fn states(&self) -> Vec<CellState> {
        self.cells.values().map(|cell| cell.state.clone()).collect()
    }

    /// Every cell's (id, url): what to poll.
    pub fn targets(&self) -> Vec<(String, String)> {
        self.cells.iter().map(|(id, cell)| (id.clone(), cell.url.clone())).collect()
    }

    pub fn url(&self, cell_id: &str) -> Option<&str> {
        self.cells.get(cell_id).map(|cell| cell.url.as_str())
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Duration, Utc};

    use super::*;
    use crate::cell::AdmitMode;
    use crate::store::{CellEffective, CellRow, CellSwitch};

    const LOCAL: i64 = 1_800_000_000_000;

    fn db_time(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(ms).expect("time")
    }

    fn view(id: &str, switch: Option<AdmitMode>, row: Option<(AdmitMode, i64)>, read_at: i64) -> CellView {
        CellView {
            cell: CellRow {
                cell_id: id.into(),
                url: format!("http://{id}:8080"),
                region: "eu".into(),
                pool_size: 10,
                reserve_pool_size: 4,
            },
            switch: switch.map(|admit_mode| CellSwitch {
                cell_id: id.into(),
                admit_mode,
                dead_man_trip_slots: None,
                generation: 1,
                updated_at: db_time(read_at),
            }),
            effective: row.map(|(mode, at)| CellEffective {
                mode,
                cell_incarnation: "boot".into(),
                updated_at: db_time(at),
            }),
            read_at: db_time(read_at),
        }
    }

    fn feed(id: &str, seats: usize) -> SeatFeed {
        SeatFeed {
            cell_id: id.into(),
            mode: AdmitMode::Reserve,
            tripped: false,
            held: false,
            draining: false,
            capacity: 8,
            figures: SeatFigures { seats, bookings: 1 },
        }
    }

    #[test]
    fn effective_rows_are_aged_by_the_database_clock_not_the_directors() {
        // The database's clock runs an hour ahead of the director's; the
        // row was written 10 s before the read.
        let db_now = LOCAL + Duration::hours(1).num_milliseconds();
        let mut fleet = Fleet::default();
        fleet.listed(&[view("a", Some(AdmitMode::Reserve), Some((AdmitMode::Db, db_now - 10_000)), db_now)], LOCAL);
        let state = &fleet.states()[0];
        assert_eq!(state.effective, Some(EffectiveRow { mode: AdmitMode::Db, updated_at_ms: LOCAL - 10_000 }));
        assert_eq!(state.switch, AdmitMode::Reserve);
        // No switch row: the cell admits through the database.
        fleet.listed(&[view("b", None, None, db_now)], LOCAL);
        assert_eq!(fleet.states()[0].switch, AdmitMode::Db);
    }

    #[test]
    fn polls_survive_registry_reads_and_unregistered_cells_are_forgotten() {
        let mut fleet = Fleet::default();
        let both = [view("a", Some(AdmitMode::Reserve), None, LOCAL), view("b", Some(AdmitMode::Reserve), None, LOCAL)];
        fleet.listed(&both, LOCAL);
        assert_eq!(fleet.states().iter().map(|s| s.polled_at_ms).collect::<Vec<_>>(), [None, None]);
        fleet.polled("a", &feed("a", 3), LOCAL + 5).expect("a's feed");
        fleet.booked("a");
        fleet.listed(&both, LOCAL + 10);
        let a = &fleet.states()[0];
        assert_eq!((a.polled_at_ms, a.figures), (Some(LOCAL + 5), SeatFigures { seats: 3, bookings: 2 }));
        fleet.polled("a", &feed("a", 4), LOCAL + 20).expect("a's feed");
        assert_eq!(fleet.states()[0].figures, SeatFigures { seats: 4, bookings: 1 }, "the feed replaces bookings");

        fleet.listed(&both[1..], LOCAL + 30);
        assert_eq!(fleet.targets(), [("b".to_string(), "http://b:8080".to_string())]);
        assert_eq!(fleet.polled("a", &feed("a", 1), LOCAL + 40), Err(FeedRefused::Unknown));
    }

    #[test]
    fn a_feed_answering_for_another_cell_is_not_taken() {
        let mut fleet = Fleet::default();
        fleet.listed(&[view("a", Some(AdmitMode::Reserve), None, LOCAL)], LOCAL);
        assert_eq!(fleet.polled("a", &feed("b", 0), LOCAL), Err(FeedRefused::OtherCell("b".into())));
        assert_eq!(fleet.states()[0].polled_at_ms, None);
        assert_eq!(fleet.url("a"), Some("http://a:8080"));
    }
}
