//! Admission of a daemon's hello on a cell (docs/CELLS.md, "Admission"): the
//! one step the hello calls before it claims the host, answering accept
//! (and how), wrong cell (with the right cell's URL) or refuse.
//!
//! - Reserve mode: a `hello.booking` whose ticket verifies with the cluster
//!   secret (signed for this host, the hello token's user as its owner,
//!   this cell and the booking's epoch; an
//!   expired ticket still names the epoch of a redial) goes to
//!   [`CellSeats::admit`]: a booking at exactly that epoch admits once,
//!   and a host seated here at that epoch (now, or lately and not with
//!   4409) is admitted from memory. Neither reads the database.
//! - Anything else, and every hello in db mode, is checked in the
//!   database: the host is the token's user's, a daemon token speaks for
//!   it, and when an assignment row names another cell the daemon is sent
//!   there (4409).
//!
//! A daemon token bound to another host never takes the path without the
//! database, and neither does one not bound yet (binding it is a write).
//!
//! The database check of a bound daemon token does not read the host
//! again when the token's lookup at the upgrade already brought it
//! ([`Prefetched`], at most [`PREFETCH_FRESH`] old): a hello after a
//! restart then costs the upgrade's one statement and the hello's one.
//!
//! [`CellSeats::admit`]: super::bookings::CellSeats::admit

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::bookings::{Admission, AdmittedBy};
use super::state::CellState;
use crate::auth::Principal;
use crate::director::ticket::{TicketError, TicketSubject};
use crate::proto::v1::Booking;
use crate::relay::close;
use crate::store::{HostAdmission, Store, StoreError, TokenScope};

/// How old a prefetched host may be for the hello to use it: a daemon says
/// hello one round trip after its upgrade; a later hello reads the host
/// again, so an assignment changed meanwhile is seen.
pub const PREFETCH_FRESH: Duration = Duration::from_secs(2);

/// The host a daemon token is bound to, as the token's lookup at the
/// upgrade read it (`crate::store::Store::token_by_hash`).
#[derive(Debug, Clone)]
pub struct Prefetched {
    pub host_id: Uuid,
    pub host: HostAdmission,
    /// When the lookup answered.
    pub read_at: Instant,
}

impl Prefetched {
    /// The host's row if it is `host_id`'s and fresh at `now`.
    fn of(&self, host_id: Uuid, now: Instant) -> Option<HostAdmission> {
        (self.host_id == host_id && now.saturating_duration_since(self.read_at) <= PREFETCH_FRESH)
            .then(|| self.host.clone())
    }
}

/// What the admission step decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted at `epoch` (the booking's, or the assignment row's; 0 for a
    /// host never placed).
    Accept { by: AdmittedBy, epoch: i64 },
    /// The host is assigned to another cell (4409); `url` is that cell's
    /// registered URL, if it registered.
    WrongCell { cell_id: String, url: Option<String> },
    /// Closed with `code`.
    Refuse { code: u16, reason: &'static str },
}

impl Verdict {
    /// The close reason of a wrong-cell refusal: where to dial. A close
    /// reason holds at most 123 bytes; a URL too long for the prefix goes
    /// alone.
    pub fn wrong_cell_reason(cell_id: &str, url: Option<&str>) -> String {
        match url {
            Some(url) if url.len() + "wrong cell: ".len() <= super::MAX_CELL_URL_BYTES => format!("wrong cell: {url}"),
            Some(url) => url.to_string(),
            None => format!("wrong cell: {cell_id}"),
        }
    }
}

/// Decides the hello of `host_id`, opened with `principal`'s token and
/// carrying `booking`; `prefetched` is what the upgrade read of the
/// token's bound host.
pub async fn admit(
    cell: &CellState,
    store: &dyn Store,
    principal: &Principal,
    prefetched: Option<&Prefetched>,
    host_id: Uuid,
    booking: Option<&Booking>,
    now: Instant,
) -> Verdict {
    let verdict = match admit_without_database(cell, principal, host_id, booking, now) {
        Some(verdict) => verdict,
        None => match check_database(
            cell,
            store,
            principal,
            prefetched.and_then(|p| p.of(host_id, now)),
            host_id,
            booking_epoch(booking),
        )
        .await
        {
            Ok(verdict) => verdict,
            Err(e) => {
                tracing::error!(error = %e, %host_id, "tether_store_error");
                Verdict::Refuse { code: close::INTERNAL, reason: "database error" }
            }
        },
    };
    if let Verdict::Accept { by, .. } = &verdict {
        let path = match by {
            AdmittedBy::Booking => "booking",
            AdmittedBy::Memory => "memory",
            AdmittedBy::Database => "database",
        };
        metrics::counter!("tether_cell_admissions_total", "path" => path).increment(1);
    }
    verdict
}

/// A booked or remembered host in reserve mode; None: check the database.
fn admit_without_database(
    cell: &CellState,
    principal: &Principal,
    host_id: Uuid,
    booking: Option<&Booking>,
    now: Instant,
) -> Option<Verdict> {
    let speaks_without_a_read = principal.scope != TokenScope::Daemon || principal.bound_host == Some(host_id);
    if !speaks_without_a_read {
        return None;
    }
    let epoch = verified_epoch(cell, principal.user_id(), host_id, booking?)?;
    let mode = cell.status().mode;
    match cell.seats().admit(now, host_id, Some(epoch), mode) {
        Admission::Booked => Some(Verdict::Accept { by: AdmittedBy::Booking, epoch }),
        Admission::FromMemory => Some(Verdict::Accept { by: AdmittedBy::Memory, epoch }),
        Admission::CheckDatabase => None,
    }
}

/// The booking's epoch once its ticket verified for this host of
/// `user_id` (the hello token's user) and this cell.
fn verified_epoch(cell: &CellState, user_id: Uuid, host_id: Uuid, booking: &Booking) -> Option<i64> {
    let key = cell.tickets.as_ref()?;
    let epoch = i64::try_from(booking.epoch).ok()?;
    let subject = TicketSubject { host_id, user_id, cell_id: &cell.cell_id, epoch };
    match key.verify(&booking.ticket, &subject, chrono::Utc::now().timestamp_millis()) {
        Ok(_) | Err(TicketError::Expired { .. }) => Some(epoch),
        Err(e) => {
            tracing::info!(error = %e, %host_id, "tether_cell_booking_refused");
            None
        }
    }
}

fn booking_epoch(booking: Option<&Booking>) -> Option<i64> {
    booking.and_then(|b| i64::try_from(b.epoch).ok())
}

/// The database check: owner, token binding, assignment row (the host
/// read now unless the upgrade's lookup brought it).
async fn check_database(
    cell: &CellState,
    store: &dyn Store,
    principal: &Principal,
    prefetched: Option<HostAdmission>,
    host_id: Uuid,
    booking_epoch: Option<i64>,
) -> Result<Verdict, StoreError> {
    let host = match prefetched {
        Some(host) => Some(host),
        None => store.host_admission(host_id).await?,
    };
    let Some(host) = host.filter(|h| h.user_id == principal.user_id()) else {
        return Ok(Verdict::Refuse { code: close::FORBIDDEN, reason: "unknown or foreign host" });
    };
    if let Err(not) = crate::auth::speaks_for(store, principal, host_id).await? {
        return Ok(Verdict::Refuse { code: close::FORBIDDEN, reason: not.close_reason() });
    }
    match host.assignment {
        Some((assigned, _)) if assigned != cell.cell_id => {
            let url = store.list_cells().await?.into_iter().find(|c| c.cell.cell_id == assigned).map(|c| c.cell.url);
            Ok(Verdict::WrongCell { cell_id: assigned, url })
        }
        Some((_, epoch)) => Ok(Verdict::Accept { by: AdmittedBy::Database, epoch }),
        None => Ok(Verdict::Accept { by: AdmittedBy::Database, epoch: booking_epoch.unwrap_or(0) }),
    }
}
