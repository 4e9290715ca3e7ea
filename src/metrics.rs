//! Prometheus metrics (`GET /metrics`): the `metrics` facade with the
//! Prometheus exporter's recorder, installed once per process.
//!
//! Metric names are stable: `tether_http_requests_total`,
//! `tether_http_request_duration_seconds`, `tether_store_pool_*`,
//! `tether_store_queries_total`, and the
//! relay's own counters as they are added.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::store::Store;

/// Counters an operator alerts on when they increase: exported at 0 from
/// the start, so the first increase is a change a rule can see (a counter
/// that first appears at 4934 has no increase to alert on).
const ALERT_COUNTERS: &[&str] = &[
    "tether_audit_events_dropped_total",
    "tether_bus_gaps_total",
    "tether_bus_duplicates_total",
    "tether_stream_gaps_total",
    "tether_run_log_gap_bytes_total",
    "tether_launch_timeouts_total",
    "tether_runs_lost_total",
    "tether_daemon_frames_dropped_total",
    "tether_daemon_replaced_total",
    "tether_viewer_slow_closed_total",
    "tether_token_sockets_closed_total",
];

/// What a cell exports at 0 from the start as [`ALERT_COUNTERS`] and
/// [`GAUGES`] do; a director-only instance runs no cell and exports none
/// of them, so `count(tether_cell_held)` counts cells.
const CELL_COUNTERS: &[&str] = &["tether_cell_trips_total"];
const CELL_LABELLED_COUNTERS: &[(&str, &str, &str)] = &[("tether_cell_slot_claims_total", "outcome", "failed")];
const CELL_GAUGES: &[&str] = &["tether_cell_tripped", "tether_cell_held"];

/// The unlabelled gauges of docs/OPERATIONS.md, exported at 0 from the
/// start: an alert that compares two of them (`tether_leases_held` against
/// `tether_daemon_connections`) or sums one over pods must not find it
/// missing on a pod that has not used it yet.
const GAUGES: &[&str] = &[
    "tether_daemon_connections",
    "tether_viewer_connections",
    "tether_leases_held",
    "tether_terminal_arbiters",
    "tether_viewer_queue_high_water_bytes",
    "tether_home_viewers",
    "tether_remote_viewers",
];

/// A handle that renders the process's metrics.
#[derive(Clone)]
pub struct Metrics {
    handle: PrometheusHandle,
}

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

impl Metrics {
    /// Installs the recorder on first use; later calls share it (tests run
    /// several servers in one process). `runs_a_cell`: not a director-only
    /// instance (which exports no cell metrics).
    pub fn install(runs_a_cell: bool) -> Self {
        let handle = HANDLE
            .get_or_init(|| {
                let recorder = PrometheusBuilder::new()
                    .set_buckets(&[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
                    .map(PrometheusBuilder::build_recorder)
                    .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
                let handle = recorder.handle();
                // Fails only if another recorder was installed first; the
                // handle then renders nothing but the process keeps running.
                if metrics::set_global_recorder(recorder).is_err() {
                    tracing::warn!("tether_metrics_recorder_taken");
                }
                let (cell_counters, cell_labelled, cell_gauges) = if runs_a_cell {
                    (CELL_COUNTERS, CELL_LABELLED_COUNTERS, CELL_GAUGES)
                } else {
                    (&[][..], &[][..], &[][..])
                };
                for name in ALERT_COUNTERS.iter().chain(cell_counters) {
                    metrics::counter!(*name).increment(0);
                }
                for (name, label, value) in cell_labelled {
                    metrics::counter!(*name, *label => *value).increment(0);
                }
                for name in GAUGES.iter().chain(cell_gauges) {
                    metrics::gauge!(*name).increment(0.0);
                }
                handle
            })
            .clone();
        Self { handle }
    }

    /// Records the store's pool figures and call count and renders
    /// everything as Prometheus text.
    pub fn render(&self, store: &dyn Store) -> String {
        let (backend, pool) = (store.backend(), store.pool_status());
        metrics::counter!("tether_store_queries_total", "backend" => backend).absolute(store.queries_total());
        metrics::gauge!("tether_store_pool_size", "backend" => backend).set(pool.size as f64);
        metrics::gauge!("tether_store_pool_available", "backend" => backend).set(pool.available as f64);
        metrics::gauge!("tether_store_pool_waiting", "backend" => backend).set(pool.waiting as f64);
        metrics::gauge!("tether_store_pool_max_size", "backend" => backend).set(pool.max_size as f64);
        self.handle.render()
    }
}
