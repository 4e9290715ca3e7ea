//! The director (docs/CELLS.md, "The director"): it places daemons on relay
//! cells before they dial. Reserve cells it books hosts onto in advance, so
//! their hellos need no database read; when no reserve cell takes a host it
//! falls back to the database path. Its seat-feed polls are the contact that
//! keeps each reserve cell's dead-man window from passing.
//!
//! - [`placement`]: which cell a host goes to, and at which epoch.
//! - [`ticket`]: the signed booking ticket a cell checks without the database.

pub mod placement;
pub mod ticket;
