//! tether: a horizontally scaled terminal relay.
//!
//! Daemons on people's machines dial in over WebSocket and host real PTY
//! terminals; viewers attach to those terminals through any instance. See
//! docs/ARCHITECTURE.md for the layout of this crate, docs/PROTOCOL.md and
//! docs/REST.md for the contracts, docs/CLUSTER.md for scale-out, and
//! docs/CLI.md for the command line and the client library ([`client`]).

pub mod attach;
pub mod audit;
pub mod auth;
pub mod bus;
pub mod cell;
pub mod cli;
pub mod client;
pub mod config;
pub mod crypto;
pub mod daemon;
pub mod demo;
pub mod director;
pub mod http;
pub mod jobs;
pub mod json_input;
pub mod metrics;
pub mod proto;
pub mod relay;
pub mod server;
pub mod store;
pub mod tls;
pub mod viewer_protocol;
