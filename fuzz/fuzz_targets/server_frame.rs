//! Fuzzes what the server sends a daemon: the daemon's `ServerFrame`
//! decoder, then the grid clamps its host applies to Resize and Spawn.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tether::daemon::{decode_server_frame, GridSize};
use tether::proto::v1::server_frame::Frame;

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = decode_server_frame(data) else { return };
    match frame.frame {
        Some(Frame::Resize(r)) => {
            let size = GridSize::clamped(r.cols, r.rows);
            let _ = (size.cols(), size.rows());
        }
        Some(Frame::Spawn(s)) => {
            let size = GridSize::for_spawn(s.cols, s.rows);
            let _ = (size.cols(), size.rows());
        }
        _ => {}
    }
});
