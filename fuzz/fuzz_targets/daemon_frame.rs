//! Fuzzes what a daemon sends: the binary message decoder the server's
//! socket reader uses, then the per-frame checks that need no actor
//! (terminal ids, grids, spawn-error messages, usage, limits JSON).
#![no_main]
use libfuzzer_sys::fuzz_target;
use tether::proto::v1::daemon_frame::Frame;
use tether::relay::daemon_conn::{frames, reader};

fuzz_target!(|data: &[u8]| {
    let Some(frame) = reader::decode_frame(data) else { return };
    let Some(frame) = frame.frame else { return };
    match frame {
        Frame::Hello(h) => {
            let _ = frames::terminal_id(&h.host_id);
            for t in &h.terminals {
                let _ = frames::terminal_id(&t.terminal_id);
            }
        }
        Frame::Output(o) => {
            let _ = frames::terminal_id(&o.terminal_id);
        }
        Frame::Scrollback(s) => {
            let _ = (frames::terminal_id(&s.terminal_id), frames::grid(s.cols), frames::grid(s.rows));
        }
        Frame::Size(s) => {
            let _ = (frames::terminal_id(&s.terminal_id), frames::grid(s.cols), frames::grid(s.rows));
        }
        Frame::Snapshot(s) => {
            let _ = (frames::terminal_id(&s.terminal_id), frames::grid(s.cols), frames::grid(s.rows));
        }
        Frame::SpawnError(s) => {
            let message = frames::spawn_error_message(&s.message);
            assert!(message.chars().count() <= 1000);
        }
        Frame::Usage(u) => {
            let usage = frames::run_usage(&u);
            assert!(usage.cpu_ms >= 0 && usage.wall_ms >= 0);
        }
        Frame::LimitsResult(r) => {
            let _ = frames::limits_answer(&r);
        }
        _ => {}
    }
});
