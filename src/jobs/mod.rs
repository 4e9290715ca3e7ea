//! Background work of an instance: the runs queue (docs/REST.md, "Runs")
//! and the sweep (docs/ARCHITECTURE.md, "The sweep").

pub mod runs;
pub mod sweep;
