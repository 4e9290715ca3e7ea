//! Reads the cell's own switch (`relay_cell_admit_modes`) every
//! `cell.switch_poll_ms` and hands it to the dead-man controller
//! (docs/CELLS.md, "Operating the switch"): a new generation re-arms a
//! latched trip, a new cap applies to the next claim, `db` turns the
//! controller off. A cell without a switch row admits through the database.

use std::time::Duration;

use actix::Addr;

use super::controller::{DeadManController, SwitchRead};
use super::deadman::Switch;
use super::AdmitMode;
use crate::store::{CellSwitch, Store, StoreResult};

/// The switch of `cell_id` as the controller takes it; generation 0 when
/// the operator never wrote one.
pub async fn read_switch(store: &dyn Store, cell_id: &str) -> StoreResult<Switch> {
    Ok(store.cell_switch(cell_id).await?.map_or(
        Switch { mode: AdmitMode::Db, trip_slots: None, generation: 0 },
        |s: CellSwitch| Switch { mode: s.admit_mode, trip_slots: s.dead_man_trip_slots, generation: s.generation },
    ))
}

/// Polls until the controller stops. A failed read is logged once until a
/// read succeeds again (the previous switch stays in force meanwhile).
pub async fn poll_switch(
    store: std::sync::Arc<dyn Store>,
    cell_id: String,
    every: Duration,
    controller: Addr<DeadManController>,
) {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    while controller.connected() {
        interval.tick().await;
        match read_switch(store.as_ref(), &cell_id).await {
            Ok(switch) => {
                failing = false;
                controller.do_send(SwitchRead(switch));
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, %cell_id, "tether_cell_switch_read_failed");
            }
            Err(_) => {}
        }
    }
}
