//! Background work of an instance: the runs queue (SPEC §6.6) and the sweep
//! (SPEC §7.5).

pub mod runs;
pub mod sweep;
