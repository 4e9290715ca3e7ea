//! tether: a horizontally scaled terminal relay.
//!
//! Daemons on people's machines dial in over WebSocket and host real PTY
//! terminals; viewers attach to those terminals through any instance. See
//! SPEC.md for the product and DESIGN.md for the layout of this crate.

pub mod attach;
pub mod proto;
pub mod config;
pub mod store;
pub mod auth;
pub mod metrics;
pub mod http;
pub mod server;
pub mod relay;
pub mod jobs;
pub mod crypto;
