//! `/internal/v1/cells` (docs/REST.md, "Cells (cluster secret)"): the
//! operators' view of the relay cells and their admit-mode switch, doing
//! what `tether cell set` does. Only a caller with the cluster secret gets
//! here (`super::super::routes`).

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Deserializer};
use serde_json::json;

use crate::cell::AdmitMode;
use crate::http::body::Json;
use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::store::MAX_TRIP_SLOTS;

/// `PUT .../admit-mode`: either field may be left out (kept as stored);
/// `"deadManTripSlots": null` removes the cap; `"admitMode": null` means
/// nothing and is refused (400 `bad_json`), not taken as "keep".
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SwitchBody {
    #[serde(default, deserialize_with = "mode_not_null")]
    admit_mode: Option<AdmitMode>,
    #[serde(default, deserialize_with = "present")]
    dead_man_trip_slots: Option<Option<i64>>,
}

/// Tells a field given as `null` (`Some(None)`) from one left out (`None`).
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Option<i64>>, D::Error> {
    Option::<i64>::deserialize(deserializer).map(Some)
}

/// A mode that is given is a mode: `null` fails like an unknown one.
fn mode_not_null<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<AdmitMode>, D::Error> {
    AdmitMode::deserialize(deserializer).map(Some)
}

/// Every registered cell with its switch and its effective row.
pub async fn list(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let cells = state.store.list_cells().await?;
    Ok(HttpResponse::Ok().json(json!({ "cells": cells })))
}

/// Writes a cell's switch (bumping its generation) and answers it.
pub async fn set_admit_mode(
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: Json<SwitchBody>,
) -> Result<HttpResponse, ApiError> {
    let cell_id = path.into_inner();
    if !crate::config::valid_cell_id(&cell_id) {
        return Err(ApiError::bad_request(
            "invalid_cell_id",
            "a cell id is 1 to 128 characters without `#`, `/`, spaces or control characters",
        ));
    }
    let body = body.into_inner();
    let slots = match body.dead_man_trip_slots {
        None => None,
        Some(None) => Some(None),
        Some(Some(n)) => Some(Some(u8::try_from(n).ok().filter(|n| *n <= MAX_TRIP_SLOTS).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_trip_slots",
                format!("`deadManTripSlots` must be 0..={MAX_TRIP_SLOTS} or null, not {n}"),
            )
        })?)),
    };
    let switch = state.store.set_cell_switch(&cell_id, body.admit_mode, slots).await?;
    Ok(HttpResponse::Ok().json(json!({ "switch": switch })))
}
