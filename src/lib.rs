//! tether: a horizontally scaled terminal relay.
//!
//! Daemons on people's machines dial in over WebSocket and host real PTY
//! terminals; viewers attach to those terminals through any instance. See
//! SPEC.md for the product and DESIGN.md for the layout of this crate.

pub mod attach;
pub mod auth;
pub mod bus;
pub mod config;
pub mod crypto;
pub mod daemon;
pub mod demo;
pub mod http;
pub mod jobs;
pub mod metrics;
pub mod proto;
pub mod relay;
pub mod server;
pub mod store;
pub mod tls;
pub mod viewer_protocol;
