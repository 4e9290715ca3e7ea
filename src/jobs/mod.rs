//! Background work of an instance: the runs queue (SPEC §6.6).

pub mod runs;
