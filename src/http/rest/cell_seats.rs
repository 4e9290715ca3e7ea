//! The cell's side of placement (docs/REST.md, "Cells (cluster secret)";
//! docs/CELLS.md, "The seat feed and the reserve call"): the seat feed a
//! director polls, `GET /internal/v1/seats`, and the reserve call that
//! books hosts here, `POST /internal/v1/reserve`. Only a caller with the
//! cluster secret gets here (`super::super::routes`). A poll, and a reserve
//! call that booked a host, are contact: they restart the dead-man window.

use std::sync::atomic::Ordering;
use std::time::Instant;

use actix_web::{web, HttpResponse};

use crate::cell::feed::{ReserveRequest, ReserveResponse};
use crate::http::body::Json;
use crate::http::error::ApiError;
use crate::http::state::AppState;

/// The most items one reserve call may carry.
pub const MAX_RESERVE_ITEMS: usize = 1000;

/// The largest epoch a booking takes: 2^53.
const MAX_EPOCH: i64 = 1 << 53;

/// `GET /internal/v1/seats`: the seat feed.
pub async fn seats(state: web::Data<AppState>) -> HttpResponse {
    let draining = state.draining.load(Ordering::Relaxed);
    HttpResponse::Ok().json(state.relay.cell.seat_feed(Instant::now(), draining))
}

/// `POST /internal/v1/reserve`: one answer per item, in order.
pub async fn reserve(state: web::Data<AppState>, body: Json<ReserveRequest>) -> Result<HttpResponse, ApiError> {
    let request = body.into_inner();
    if request.items.len() > MAX_RESERVE_ITEMS {
        return Err(ApiError::bad_request(
            "too_many_items",
            format!("at most {MAX_RESERVE_ITEMS} items per reserve call"),
        ));
    }
    // An epoch past 2^53 is no director's (they count up by one from 1)
    // and would not survive a JSON reader that reads numbers as doubles.
    if let Some(item) = request.items.iter().find(|item| !(1..=MAX_EPOCH).contains(&item.epoch)) {
        return Err(ApiError::bad_request(
            "invalid_epoch",
            format!("epoch must be between 1 and {MAX_EPOCH}, not {}", item.epoch),
        ));
    }
    if let Some(item) = request.items.iter().find(|item| item.ttl_ms == 0) {
        return Err(ApiError::bad_request("invalid_ttl", format!("ttlMs of host {} must be positive", item.host_id)));
    }
    let draining = state.draining.load(Ordering::Relaxed);
    let results = state.relay.cell.reserve(Instant::now(), &request.items, draining);
    Ok(HttpResponse::Ok().json(ReserveResponse { results }))
}
