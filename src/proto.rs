//! Generated protobuf types (prost) for the wire schemas in `proto/`.
//!
//! `v1` holds the daemon protocol (`DaemonFrame`, `ServerFrame`,
//! docs/PROTOCOL.md); `bus` the instance-to-instance envelopes
//! (docs/CLUSTER.md).

/// `tether.v1`: the daemon <-> instance protocol.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/tether.v1.rs"));
}

/// `tether.bus.v1`: messages between instances over Redis pub/sub.
#[allow(clippy::all, missing_docs)]
pub mod bus {
    include!(concat!(env!("OUT_DIR"), "/tether.bus.v1.rs"));
}
