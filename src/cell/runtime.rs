//! A cell's start (docs/CELLS.md, "Running cells"): it registers itself in
//! relay_cells, reads its switch, and starts the dead-man controller with
//! its effective writer and the switch poll. Roles `combined` and `cell`
//! run it; a director alone does not.

use std::sync::Arc;

use super::controller::{DeadManController, PoolSizes};
use super::state::CellState;
use super::switch_poll::{poll_switch, read_switch};
use super::window::dead_man_window;
use super::writer::CellAdmitEffectiveWriter;
use crate::config::{ms, Settings};
use crate::store::{CellRow, Store, StoreError};

/// Registers the cell as `url` and starts its actors on the current system.
pub async fn start(
    cell: Arc<CellState>,
    store: Arc<dyn Store>,
    settings: &Settings,
    url: String,
) -> Result<(), StoreError> {
    let pools = PoolSizes { full: settings.database.pool_size, reserve: settings.reserve_pool_size() };
    let row = CellRow {
        cell_id: cell.cell_id.clone(),
        url,
        region: settings.cell.region.clone(),
        pool_size: u32::try_from(pools.full).unwrap_or(u32::MAX),
        reserve_pool_size: u32::try_from(pools.reserve).unwrap_or(u32::MAX),
    };
    store.register_cell(&row).await?;
    // Read before the writer's first row, so a reserve cell never starts
    // by writing `db` (which would count as a trip slot it holds).
    let switch = read_switch(store.as_ref(), &cell.cell_id).await?;
    let c = &settings.cell;
    let window = dead_man_window(&cell.cell_id, ms(c.dead_man_base_ms), ms(c.dead_man_spread_ms));
    let controller = DeadManController::new(cell.clone(), store.clone(), pools, window, ms(c.held_retry_ms), switch);
    let wanted = controller.mode();
    let (writer_cell, writer_store) = (cell.clone(), store.clone());
    let (refresh, forced, stale) = (ms(c.effective_refresh_ms), ms(c.effective_forced_ms), ms(c.slot_stale_ms));
    let controller = controller.start_with_writer(move |inbox| {
        CellAdmitEffectiveWriter::new(writer_cell, writer_store, inbox, refresh, forced, stale, wanted)
    });
    cell.attach_controller(controller.clone().recipient());
    tracing::info!(
        cell_id = %cell.cell_id,
        admit_mode = %switch.mode,
        window_ms = window.as_millis() as u64,
        "tether_cell_started"
    );
    actix_rt::spawn(poll_switch(store, cell.cell_id.clone(), ms(c.switch_poll_ms), controller));
    Ok(())
}
