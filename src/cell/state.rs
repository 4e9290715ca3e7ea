//! What the parts of a cell share (docs/CELLS.md, "Admission"): its seats
//! and bookings, the mode it admits in, and what the dead-man controller
//! last decided. The hello's admission step, the seat feed and the reserve
//! endpoint read it synchronously; the controller writes the status and is
//! told of every contact with the director.
//!
//! Every lock is held only for plain state changes, never across an await.

use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use actix::Recipient;
use chrono::{DateTime, Utc};

use super::bookings::{CellSeats, ReserveAnswer, ReserveItem};
use super::feed::{ReserveResult, SeatFeed};
use super::AdmitMode;
use crate::director::ticket::TicketKey;

/// The director was heard from (a seat-feed poll or a real booking).
#[derive(actix::Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct Contact(pub Instant);

/// What the dead-man controller decided last, for admission, the seat feed
/// and `GET /api/v1/instance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellStatus {
    /// The operator's switch (db until it is read).
    pub switch: AdmitMode,
    /// The mode the cell admits in: the switch, unless the trip made it db.
    pub mode: AdmitMode,
    pub tripped: bool,
    pub held: bool,
    /// The switch's `dead_man_trip_slots` (`None`: no cap): a tripped cell
    /// with a cap holds a slot, which its row's refresh checks it still has.
    pub trip_slots: Option<u8>,
}

/// One cell's shared state; one per process.
pub struct CellState {
    pub cell_id: String,
    /// This process's boot id, written with the effective row.
    pub incarnation: String,
    /// Checks booking tickets; None without `cluster.secret` (every
    /// booking then goes to the database check).
    pub tickets: Option<TicketKey>,
    /// The reserve pool's seat count (`cell.seat_capacity`).
    pub capacity: usize,
    seats: Mutex<CellSeats>,
    status: Mutex<CellStatus>,
    heard_from_director: Mutex<Option<DateTime<Utc>>>,
    controller: OnceLock<Recipient<Contact>>,
}

impl CellState {
    pub fn new(
        cell_id: String,
        incarnation: String,
        tickets: Option<TicketKey>,
        capacity: usize,
        recent_seat: Duration,
    ) -> Self {
        let status =
            CellStatus { switch: AdmitMode::Db, mode: AdmitMode::Db, tripped: false, held: false, trip_slots: None };
        Self {
            cell_id,
            incarnation,
            tickets,
            capacity,
            seats: Mutex::new(CellSeats::new(capacity, recent_seat)),
            status: Mutex::new(status),
            heard_from_director: Mutex::new(None),
            controller: OnceLock::new(),
        }
    }

    /// The seats and bookings (a poisoned lock still holds consistent
    /// plain state: every change is one call).
    pub fn seats(&self) -> MutexGuard<'_, CellSeats> {
        self.seats.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn status(&self) -> CellStatus {
        *self.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn set_status(&self, status: CellStatus) {
        *self.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = status;
    }

    /// When a director last polled the seat feed or booked a host here.
    pub fn heard_from_director(&self) -> Option<DateTime<Utc>> {
        *self.heard_from_director.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The controller that is told of contact (set once, at start).
    pub fn attach_controller(&self, controller: Recipient<Contact>) {
        let _ = self.controller.set(controller);
    }

    /// The director was heard from: the dead-man window restarts.
    pub fn contact(&self, now: Instant) {
        *self.heard_from_director.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Utc::now());
        if let Some(controller) = self.controller.get() {
            controller.do_send(Contact(now));
        }
    }

    /// `GET /internal/v1/seats`: the feed, which is contact.
    pub fn seat_feed(&self, now: Instant, draining: bool) -> SeatFeed {
        self.contact(now);
        let status = self.status();
        let figures = self.seats().figures(now);
        SeatFeed {
            cell_id: self.cell_id.clone(),
            mode: status.mode,
            tripped: status.tripped,
            held: status.held,
            draining,
            capacity: self.capacity,
            figures,
        }
    }

    /// `POST /internal/v1/reserve`: books what fits; a booking made is contact.
    pub fn reserve(&self, now: Instant, items: &[ReserveItem], draining: bool) -> Vec<ReserveResult> {
        let mode = self.status().mode;
        let answers = self.seats().reserve(now, items, mode, draining);
        let booked = answers.iter().filter(|a| **a == ReserveAnswer::Ok).count();
        if booked > 0 {
            metrics::counter!("tether_cell_bookings_total").increment(booked as u64);
            self.contact(now);
        }
        items.iter().zip(answers).map(|(item, answer)| ReserveResult { host_id: item.host_id, answer }).collect()
    }
}
