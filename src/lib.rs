//! tether: a horizontally scaled terminal relay.
//!
//! Daemons on people's machines dial in over WebSocket and host real PTY
//! terminals; viewers attach to those terminals through any instance. See
//! SPEC.md for the product and DESIGN.md for the layout of this crate.

pub mod daemon;
pub mod proto;
