//! The dead-man trip's re-registration (docs/CELLS.md, "The dead-man
//! controller and the writer"): the hosts a reserve cell admitted without a
//! database read (booked, or from memory) have no relay_assignments row
//! that names this cell at their epoch. A tripped cell takes database
//! placements, so it writes those rows: one statement per batch of a third
//! of the full pool, one batch after another, so the re-registration never
//! holds more than one connection and the hellos keep theirs. Nobody is
//! disconnected; a stored higher epoch is kept (`Store::record_assignments`).

use std::sync::Arc;

use uuid::Uuid;

use super::state::CellState;
use crate::store::Store;

/// Writes `batches` (from `CellSeats::from_memory_batches`) one at a time;
/// `voided` is how many bookings the trip voided (for the log).
pub async fn reregister(store: Arc<dyn Store>, cell: Arc<CellState>, voided: usize, batches: Vec<Vec<(Uuid, i64)>>) {
    let hosts: usize = batches.iter().map(Vec::len).sum();
    let mut written = 0u64;
    for batch in &batches {
        match store.record_assignments(&cell.cell_id, batch).await {
            Ok(n) => written += n,
            Err(e) => tracing::error!(error = %e, cell_id = %cell.cell_id, "tether_cell_reregister_failed"),
        }
    }
    metrics::counter!("tether_cell_reregistered_hosts_total").increment(written);
    tracing::info!(cell_id = %cell.cell_id, voided, hosts, written, "tether_cell_reregistered");
}
