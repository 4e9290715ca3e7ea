//! Generated protobuf types (prost) for the wire schemas in `proto/`.
//!
//! `v1` holds the daemon protocol (`DaemonFrame`, `ServerFrame`, SPEC §4).

/// `tether.v1`: the daemon <-> instance protocol.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/tether.v1.rs"));
}
