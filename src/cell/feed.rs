//! The wire types between the director, the cells and the daemons
//! (docs/CELLS.md): the seat feed a director polls, the reserve call that
//! books hosts onto a cell, and the director's answer to `POST /v1/assign`.
//! JSON, camelCase; both sides use these types so they cannot drift.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::bookings::{ReserveAnswer, ReserveItem, SeatFigures};
use super::AdmitMode;

/// `GET /internal/v1/seats` on a cell (cluster secret): what the director
/// places by. Each successful poll is "contact" for the cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeatFeed {
    pub cell_id: String,
    /// How the cell admits hellos now: its switch, unless the dead-man
    /// trip made it `db`.
    pub mode: AdmitMode,
    /// The dead-man trip fired and is latched.
    pub tripped: bool,
    /// The director went quiet and the cell found no free trip slot.
    pub held: bool,
    pub draining: bool,
    /// Seats of the reserve pool (seats + bookings never exceed it).
    pub capacity: usize,
    #[serde(flatten)]
    pub figures: SeatFigures,
}

/// `POST /internal/v1/reserve` on a cell (cluster secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReserveRequest {
    pub items: Vec<ReserveItem>,
}

/// The cell's answers, one per item, in the items' order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReserveResponse {
    pub results: Vec<ReserveResult>,
}

/// One host's answer: `{"hostId": ..., "status": "ok" | "full" | "draining"
/// | "off" | "seated-newer", "epoch": N (seated-newer only)}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReserveResult {
    pub host_id: Uuid,
    #[serde(flatten)]
    pub answer: ReserveAnswer,
}

/// `POST /v1/assign` on the director (a daemon's token): where the daemon
/// dials, and the booking it presents in its hello (`Hello.booking`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssignAnswer {
    pub cell_id: String,
    /// The cell's base URL (`cell.url`), as `tether daemon --server` takes it.
    pub cell_url: String,
    pub epoch: i64,
    /// HMAC booking ticket over (host id, cell id, epoch, expiry); empty
    /// when the host was placed through the database (no booking).
    pub ticket: String,
    pub expires_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_feed_and_the_reserve_answers_read_as_documented() {
        let feed = SeatFeed {
            cell_id: "cell-1".into(),
            mode: AdmitMode::Reserve,
            tripped: false,
            held: true,
            draining: false,
            capacity: 8,
            figures: SeatFigures { seats: 3, bookings: 1 },
        };
        let value = serde_json::to_value(&feed).expect("json");
        assert_eq!(
            value,
            json!({"cellId": "cell-1", "mode": "reserve", "tripped": false, "held": true, "draining": false,
                   "capacity": 8, "seats": 3, "bookings": 1})
        );
        assert_eq!(serde_json::from_value::<SeatFeed>(value).expect("back"), feed);

        let host = Uuid::nil();
        let results = ReserveResponse {
            results: vec![
                ReserveResult { host_id: host, answer: ReserveAnswer::Ok },
                ReserveResult { host_id: host, answer: ReserveAnswer::SeatedNewer { epoch: 4 } },
            ],
        };
        assert_eq!(
            serde_json::to_value(&results).expect("json"),
            json!({"results": [{"hostId": host, "status": "ok"}, {"hostId": host, "status": "seated-newer", "epoch": 4}]})
        );
    }
}
