//! Background work of an instance: the runs queue (docs/REST.md, "Runs"),
//! the sweep (docs/ARCHITECTURE.md, "The sweep") and the credentials
//! auto-refresh (docs/CLUSTER.md, "Periodic host tasks").

pub mod credentials;
pub mod runs;
pub mod sweep;
