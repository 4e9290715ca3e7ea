//! A cell's seats and bookings (docs/CELLS.md, "Admission"), as
//! plain state: what the cell answers the director's reserve requests, and
//! how it admits a daemon's hello without reading the database.
//!
//! - A reserve request books hosts for at most 30 s each, within the
//!   reserve pool's seat count (seats + live bookings); it is answered
//!   `ok`, `full`, `draining`, `off` (the cell does not admit in reserve
//!   mode) or `seated-newer{epoch}`: the cell already knows the host at
//!   that epoch or a newer one, so the director books at `epoch + 1`.
//! - In reserve mode a hello whose booking is at exactly the booked epoch is
//!   admitted once (the booking is consumed) with no database read; a host
//!   seated here at the same epoch, or that left within `cell.recent_seat_ms`
//!   and not with 4409 (wrong cell), is admitted from memory
//!   ([`CellSeats::seated_here_at`]); anything else, and every hello in db
//!   mode, goes to the database check.
//! - A trip voids every booking and re-registers in relay_assignments the
//!   connected hosts admitted without a database read (booked or from
//!   memory), a third of the pool at a time ([`CellSeats::from_memory_batches`]).
//!
//! Seats are keyed by host and carry the connection that holds them, so the
//! late close of a replaced connection does not unseat its successor.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::AdmitMode;

/// The longest a booking is held (`ttlMs` is capped to it).
pub const MAX_BOOKING_TTL: Duration = Duration::from_secs(30);

/// The close code of a daemon sent to the wrong cell: such a host is not
/// remembered.
pub const CLOSE_WRONG_CELL: u16 = 4409;

/// One item of `POST /internal/v1/reserve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReserveItem {
    pub host_id: Uuid,
    pub epoch: i64,
    pub ttl_ms: u64,
}

/// The cell's answer to one [`ReserveItem`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum ReserveAnswer {
    Ok,
    /// Seats and bookings fill the reserve pool.
    Full,
    /// The instance is draining.
    Draining,
    /// The cell does not admit in reserve mode (switched to db, or tripped).
    Off,
    /// The cell knows the host at `epoch`, which is not older than the one
    /// asked for.
    SeatedNewer {
        epoch: i64,
    },
}

/// How a hello is admitted in reserve mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// A booking at exactly this epoch: admitted, booking consumed.
    Booked,
    /// Seated here at this epoch, now or lately: admitted from memory.
    FromMemory,
    /// Check the token, the host's owner and the assignment row.
    CheckDatabase,
}

/// How a seated host was let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmittedBy {
    Booking,
    Memory,
    Database,
}

/// The seat feed's figures (`GET /internal/v1/seats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeatFigures {
    pub seats: usize,
    pub bookings: usize,
}

#[derive(Debug, Clone, Copy)]
struct Booking {
    epoch: i64,
    expires: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Seat {
    epoch: i64,
    connection: u64,
    by: AdmittedBy,
}

#[derive(Debug, Clone, Copy)]
struct LeftSeat {
    epoch: i64,
    at: Instant,
}

#[derive(Debug)]
pub struct CellSeats {
    capacity: usize,
    recent_seat: Duration,
    bookings: HashMap<Uuid, Booking>,
    seats: HashMap<Uuid, Seat>,
    left: HashMap<Uuid, LeftSeat>,
}

impl CellSeats {
    /// `capacity` is the reserve pool's seat count; `recent_seat` is
    /// `cell.recent_seat_ms`.
    pub fn new(capacity: usize, recent_seat: Duration) -> Self {
        Self { capacity, recent_seat, bookings: HashMap::new(), seats: HashMap::new(), left: HashMap::new() }
    }

    /// Answers a reserve request, item by item. `mode` is the mode the cell
    /// admits in now.
    pub fn reserve(
        &mut self,
        now: Instant,
        items: &[ReserveItem],
        mode: AdmitMode,
        draining: bool,
    ) -> Vec<ReserveAnswer> {
        self.forget_expired(now);
        items.iter().map(|item| self.reserve_one(now, item, mode, draining)).collect()
    }

    fn reserve_one(&mut self, now: Instant, item: &ReserveItem, mode: AdmitMode, draining: bool) -> ReserveAnswer {
        if draining {
            return ReserveAnswer::Draining;
        }
        if mode != AdmitMode::Reserve {
            return ReserveAnswer::Off;
        }
        let booked = self.bookings.get(&item.host_id).map(|booking| booking.epoch);
        if let Some(known) = self.seated_here_at(now, item.host_id) {
            if known >= item.epoch {
                return ReserveAnswer::SeatedNewer { epoch: known };
            }
        }
        if let Some(booked) = booked.filter(|booked| *booked > item.epoch) {
            return ReserveAnswer::SeatedNewer { epoch: booked };
        }
        let needs_a_seat = booked.is_none() && !self.seats.contains_key(&item.host_id);
        if needs_a_seat && self.occupied() >= self.capacity {
            return ReserveAnswer::Full;
        }
        let ttl = Duration::from_millis(item.ttl_ms).min(MAX_BOOKING_TTL);
        self.bookings.insert(item.host_id, Booking { epoch: item.epoch, expires: now + ttl });
        ReserveAnswer::Ok
    }

    /// Seats and bookings of hosts not seated (a seated host's booking
    /// takes over its seat).
    fn occupied(&self) -> usize {
        self.seats.len() + self.bookings.keys().filter(|host| !self.seats.contains_key(host)).count()
    }

    /// How a hello from `host` is admitted. `booking_epoch` is the epoch
    /// of the hello's booking once its ticket verified as signed for this
    /// host and this cell (an expired ticket still names the epoch a
    /// redialing host was seated at; the booking itself expires here).
    pub fn admit(&mut self, now: Instant, host: Uuid, booking_epoch: Option<i64>, mode: AdmitMode) -> Admission {
        let Some(epoch) = booking_epoch.filter(|_| mode == AdmitMode::Reserve) else {
            return Admission::CheckDatabase;
        };
        self.forget_expired(now);
        if self.bookings.get(&host).is_some_and(|booking| booking.epoch == epoch) {
            self.bookings.remove(&host);
            return Admission::Booked;
        }
        if self.seated_here_at(now, host) == Some(epoch) {
            return Admission::FromMemory;
        }
        Admission::CheckDatabase
    }

    /// The epoch `host` is seated at here, or left at within
    /// `recent_seat` (not with 4409).
    pub fn seated_here_at(&self, now: Instant, host: Uuid) -> Option<i64> {
        if let Some(seat) = self.seats.get(&host) {
            return Some(seat.epoch);
        }
        self.left.get(&host).filter(|left| now.duration_since(left.at) < self.recent_seat).map(|left| left.epoch)
    }

    /// The hello of `host` on `connection` was accepted.
    pub fn seated(&mut self, host: Uuid, epoch: i64, connection: u64, by: AdmittedBy) {
        self.left.remove(&host);
        if self.bookings.get(&host).is_some_and(|booking| booking.epoch <= epoch) {
            self.bookings.remove(&host);
        }
        self.seats.insert(host, Seat { epoch, connection, by });
    }

    /// The daemon connection `connection` of `host` closed with `close_code`.
    pub fn left(&mut self, now: Instant, host: Uuid, connection: u64, close_code: u16) {
        let Some(seat) = self.seats.get(&host).filter(|seat| seat.connection == connection).copied() else {
            return;
        };
        self.seats.remove(&host);
        if close_code != CLOSE_WRONG_CELL {
            self.left.insert(host, LeftSeat { epoch: seat.epoch, at: now });
        }
    }

    /// The trip: every booking is void. Returns how many there were.
    pub fn void_bookings(&mut self) -> usize {
        let voided = self.bookings.len();
        self.bookings.clear();
        voided
    }

    /// The connected hosts admitted without a database read (booked or
    /// from memory), with their epochs, in batches of a third of
    /// `pool_size` for re-registration.
    pub fn from_memory_batches(&self, pool_size: usize) -> Vec<Vec<(Uuid, i64)>> {
        let mut hosts: Vec<(Uuid, i64)> = self
            .seats
            .iter()
            .filter(|(_, seat)| seat.by != AdmittedBy::Database)
            .map(|(host, seat)| (*host, seat.epoch))
            .collect();
        hosts.sort_unstable();
        hosts.chunks(pool_size.div_ceil(3).max(1)).map(<[_]>::to_vec).collect()
    }

    /// What the seat feed reports: seats, and bookings of hosts not seated
    /// (a seated host's booking takes no other seat, as in `occupied`).
    pub fn figures(&mut self, now: Instant) -> SeatFigures {
        self.forget_expired(now);
        SeatFigures { seats: self.seats.len(), bookings: self.occupied() - self.seats.len() }
    }

    fn forget_expired(&mut self, now: Instant) {
        self.bookings.retain(|_, booking| booking.expires > now);
        let recent_seat = self.recent_seat;
        self.left.retain(|_, left| now.duration_since(left.at) < recent_seat);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEN_MINUTES: Duration = Duration::from_secs(600);
    const RESERVE: AdmitMode = AdmitMode::Reserve;

    fn host(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn item(n: u128, epoch: i64) -> ReserveItem {
        ReserveItem { host_id: host(n), epoch, ttl_ms: 30_000 }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn bookings_fill_the_reserve_pool_then_are_refused_full() {
        let t0 = Instant::now();
        let mut cell = CellSeats::new(2, TEN_MINUTES);
        cell.seated(host(1), 1, 10, AdmittedBy::Database);
        assert_eq!(
            cell.reserve(t0, &[item(2, 1), item(3, 1)], RESERVE, false),
            [ReserveAnswer::Ok, ReserveAnswer::Full]
        );
        assert_eq!(cell.figures(t0), SeatFigures { seats: 1, bookings: 1 });
        // Re-booking a booked or seated host takes no new seat, and the
        // feed counts neither twice.
        assert_eq!(cell.reserve(t0, &[item(2, 2), item(1, 2)], RESERVE, false), [ReserveAnswer::Ok, ReserveAnswer::Ok]);
        assert_eq!(cell.figures(t0), SeatFigures { seats: 1, bookings: 1 });
        // Bookings expire, and their seats come free.
        assert_eq!(cell.reserve(t0 + secs(30), &[item(3, 1)], RESERVE, false), [ReserveAnswer::Ok]);
    }

    #[test]
    fn a_draining_cell_or_one_off_reserve_books_nothing() {
        let t0 = Instant::now();
        let mut cell = CellSeats::new(10, TEN_MINUTES);
        assert_eq!(cell.reserve(t0, &[item(1, 1)], RESERVE, true), [ReserveAnswer::Draining]);
        assert_eq!(cell.reserve(t0, &[item(1, 1)], AdmitMode::Db, false), [ReserveAnswer::Off]);
        assert_eq!(cell.figures(t0).bookings, 0);
    }

    #[test]
    fn the_ttl_is_capped_at_thirty_seconds() {
        let t0 = Instant::now();
        let mut cell = CellSeats::new(10, TEN_MINUTES);
        let long = ReserveItem { host_id: host(1), epoch: 1, ttl_ms: 3_600_000 };
        cell.reserve(t0, &[long], RESERVE, false);
        assert_eq!(cell.admit(t0 + secs(30), host(1), Some(1), RESERVE), Admission::CheckDatabase);
    }

    #[test]
    fn a_host_known_at_the_same_or_a_newer_epoch_is_answered_seated_newer() {
        let t0 = Instant::now();
        let mut cell = CellSeats::new(10, TEN_MINUTES);
        cell.seated(host(1), 5, 10, AdmittedBy::Booking);
        cell.reserve(t0, &[item(2, 7)], RESERVE, false);
        let answers = cell.reserve(t0, &[item(1, 4), item(1, 5), item(2, 6)], RESERVE, false);
        assert_eq!(
            answers,
            [
                ReserveAnswer::SeatedNewer { epoch: 5 },
                ReserveAnswer::SeatedNewer { epoch: 5 },
                ReserveAnswer::SeatedNewer { epoch: 7 }
            ]
        );
        assert_eq!(cell.reserve(t0, &[item(1, 6)], RESERVE, false), [ReserveAnswer::Ok]);
    }

    #[test]
    fn a_booking_at_exactly_its_epoch_admits_once() {
        let t0 = Instant::now();
        let mut cell = CellSeats::new(10, TEN_MINUTES);
        cell.reserve(t0, &[item(1, 3), item(2, 3)], RESERVE, false);
        assert_eq!(cell.admit(t0, host(1), Some(2), RESERVE), Admission::CheckDatabase, "another epoch");
        assert_eq!(cell.admit(t0, host(1), None, RESERVE), Admission::CheckDatabase, "no booking");
        assert_eq!(cell.admit(t0, host(1), Some(3), RESERVE), Admission::Booked);
        assert_eq!(cell.admit(t0, host(1), Some(3), RESERVE), Admission::CheckDatabase, "consumed");
        assert_eq!(cell.admit(t0 + secs(30), host(2), Some(3), RESERVE), Admission::CheckDatabase, "expired");
    }

    #[test]
    fn db_mode_always_checks_the_database() {
        let t0 = Instant::now();
        let mut cell = CellSeats::new(10, TEN_MINUTES);
        cell.reserve(t0, &[item(1, 3)], RESERVE, false);
        cell.seated(host(2), 3, 20, AdmittedBy::Booking);
        assert_eq!(cell.admit(t0, host(1), Some(3), AdmitMode::Db), Admission::CheckDatabase);
        assert_eq!(cell.admit(t0, host(2), Some(3), AdmitMode::Db), Admission::CheckDatabase);
    }

    #[test]
    fn a_host_seated_here_at_the_same_epoch_is_admitted_from_memory() {
        let t0 = Instant::now();
        let mut cell = CellSeats::new(10, TEN_MINUTES);
        cell.seated(host(1), 4, 10, AdmittedBy::Booking);
        assert_eq!(cell.seated_here_at(t0, host(1)), Some(4));
        assert_eq!(cell.admit(t0, host(1), Some(4), RESERVE), Admission::FromMemory);
        assert_eq!(cell.admit(t0, host(1), Some(3), RESERVE), Admission::CheckDatabase);
    }

    #[test]
    fn a_host_that_left_lately_is_admitted_from_memory_unless_it_left_with_4409() {
        let t0 = Instant::now();
        let mut cell = CellSeats::new(10, TEN_MINUTES);
        cell.seated(host(1), 4, 10, AdmittedBy::Booking);
        cell.seated(host(2), 4, 20, AdmittedBy::Booking);
        cell.left(t0, host(1), 10, 1006);
        cell.left(t0, host(2), 20, CLOSE_WRONG_CELL);
        assert_eq!(cell.admit(t0 + secs(599), host(1), Some(4), RESERVE), Admission::FromMemory);
        assert_eq!(cell.admit(t0 + secs(600), host(1), Some(4), RESERVE), Admission::CheckDatabase);
        assert_eq!(cell.admit(t0 + secs(1), host(2), Some(4), RESERVE), Admission::CheckDatabase);
    }

    #[test]
    fn the_late_close_of_a_replaced_connection_leaves_its_successor_seated() {
        let t0 = Instant::now();
        let mut cell = CellSeats::new(10, TEN_MINUTES);
        cell.seated(host(1), 4, 10, AdmittedBy::Booking);
        cell.seated(host(1), 4, 11, AdmittedBy::Memory);
        cell.left(t0, host(1), 10, 4000);
        assert_eq!(cell.figures(t0).seats, 1);
        assert_eq!(cell.from_memory_batches(9), vec![vec![(host(1), 4)]]);
    }

    #[test]
    fn a_trip_voids_every_booking() {
        let t0 = Instant::now();
        let mut cell = CellSeats::new(10, TEN_MINUTES);
        cell.reserve(t0, &[item(1, 1), item(2, 1)], RESERVE, false);
        assert_eq!(cell.void_bookings(), 2);
        assert_eq!(cell.figures(t0), SeatFigures { seats: 0, bookings: 0 });
        assert_eq!(cell.admit(t0, host(1), Some(1), RESERVE), Admission::CheckDatabase);
    }

    #[test]
    fn hosts_admitted_without_the_database_are_re_registered_a_third_of_the_pool_at_a_time() {
        let t0 = Instant::now();
        let mut cell = CellSeats::new(10, TEN_MINUTES);
        for n in 1..=7 {
            cell.seated(host(n), 2, n as u64, if n % 2 == 0 { AdmittedBy::Memory } else { AdmittedBy::Booking });
        }
        cell.seated(host(8), 2, 8, AdmittedBy::Database);
        cell.seated(host(9), 2, 9, AdmittedBy::Booking);
        cell.left(t0, host(9), 9, 1006);
        let batches = cell.from_memory_batches(9);
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![3, 3, 1]);
        let hosts: Vec<Uuid> = batches.concat().into_iter().map(|(host, _)| host).collect();
        assert_eq!(hosts, (1..=7).map(host).collect::<Vec<_>>(), "connected, not checked in the database");
        assert_eq!(cell.from_memory_batches(1).len(), 7);
    }

    #[test]
    fn answers_and_items_have_their_wire_form() {
        let json = serde_json::to_value([ReserveAnswer::Ok, ReserveAnswer::SeatedNewer { epoch: 9 }]).expect("json");
        assert_eq!(json, serde_json::json!([{"status": "ok"}, {"status": "seated-newer", "epoch": 9}]));
        let item: ReserveItem = serde_json::from_value(serde_json::json!({
            "hostId": "00000000-0000-0000-0000-000000000001", "epoch": 2, "ttlMs": 1000
        }))
        .expect("item");
        assert_eq!(item, ReserveItem { host_id: host(1), epoch: 2, ttl_ms: 1000 });
    }
}
