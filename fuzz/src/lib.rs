//! The fuzz targets' bodies, one function per target, each calling the
//! library functions the server or daemon runs on that input
//! (docs/SECURITY.md, "Fuzzing"). The binaries in `fuzz_targets/` hand
//! libFuzzer's input to these functions; `tests/fuzz_corpus.rs` in the main
//! crate includes this file and replays every committed corpus file
//! through the same functions, so `scripts/test` runs each target's corpus
//! without a sanitizer build. A panic is a finding either way.

use std::collections::HashMap;
use std::sync::OnceLock;

use tether::bus::{decode, Inbound};
use tether::config::Settings;
use tether::daemon::{decode_server_frame, GridSize};
use tether::http::body::{parse_optional, parse_required};
use tether::http::rest::{check_dir, hosts, runs, terminals, tokens};
use tether::proto::bus::{envelope::Body, reply};
use tether::proto::v1::{daemon_frame, server_frame};
use tether::relay::daemon_conn::{frames, reader};
use tether::relay::requests::{answer_from_wire, from_wire, HostOp};
use tether::viewer_protocol::{ClientMessage, GRID_MAX, GRID_MIN};

/// A target's body: one input, a panic on a finding.
pub type Target = fn(&[u8]);

/// Every target by name (its `[[bin]]` in fuzz/Cargo.toml and its corpus
/// dir `fuzz/corpus/NAME`).
pub const TARGETS: &[(&str, Target)] = &[
    ("daemon_frame", daemon_frame),
    ("server_frame", server_frame),
    ("bus_envelope", bus_envelope),
    ("viewer_message", viewer_message),
    ("rest_body", rest_body),
    ("config", config),
];

/// What a daemon sends: the binary message decoder the server's socket
/// reader uses, then the per-frame checks that need no actor (terminal
/// ids, grids, spawn-error messages, usage, limits JSON).
pub fn daemon_frame(data: &[u8]) {
    use daemon_frame::Frame;
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
}

/// What the server sends a daemon: the daemon's `ServerFrame` decoder,
/// then the grid clamps its host applies to Resize and Spawn.
pub fn server_frame(data: &[u8]) {
    use server_frame::Frame;
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
}

/// What arrives from the bus: the `Envelope` decoder every subscriber
/// uses, then `from_wire` of a host request and `answer_from_wire` of a
/// reply, as the owner and the asker check them.
pub fn bus_envelope(data: &[u8]) {
    let Inbound::Message { envelope, .. } = decode("fuzz".to_owned(), data) else { return };
    match envelope.body {
        Some(Body::Request(request)) => {
            if let Some(op) = request.op {
                let _ = from_wire(op);
            }
        }
        Some(Body::Reply(r)) => {
            if let Some(reply::Outcome::Answer(answer)) = r.outcome {
                for op in
                    [HostOp::RefreshLimits, HostOp::RefreshCredentials, HostOp::Dirs { add: true, path: "/".into() }]
                {
                    let _ = answer_from_wire(&op, answer.clone());
                }
            }
        }
        _ => {}
    }
}

/// A viewer's text frames: the `ClientMessage` JSON the server's viewer
/// actor parses (`json_input::parse`); every grid that parses is within
/// 1..=1000, and what parsed survives a round trip (clients build
/// messages this way).
pub fn viewer_message(data: &[u8]) {
    let Ok(message) = tether::json_input::parse::<ClientMessage>(data) else { return };
    match &message {
        ClientMessage::Resize { cols, rows } | ClientMessage::View { cols, rows, .. } => {
            assert!((GRID_MIN..=GRID_MAX).contains(&cols.0) && (GRID_MIN..=GRID_MAX).contains(&rows.0));
        }
        ClientMessage::Input { .. } | ClientMessage::Ping => {}
    }
    let again: ClientMessage = serde_json::from_str(&message.to_json()).expect("round trip");
    assert_eq!(again, message);
}

fn allowed() -> Vec<String> {
    vec!["/home/user".to_owned(), "/srv/".to_owned()]
}

/// REST request bodies: the first byte picks a route, the rest is its
/// body, parsed as the server does (`http::body`: `parse_required` for a
/// body a route needs, `parse_optional` for the kill route's), then the
/// same checks the handler runs before it touches the store.
pub fn rest_body(data: &[u8]) {
    let Some((route, body)) = data.split_first() else { return };
    match route % 8 {
        0 => {
            if let Ok(b) = parse_required::<terminals::CreateTerminal>(body) {
                if b.check().is_ok() {
                    if let Some(dir) = b.dir() {
                        let _ = check_dir(dir, &allowed());
                        let _ = check_dir(dir, &[]);
                    }
                }
            }
        }
        1 => {
            if let Ok(b) = parse_required::<terminals::InputBody>(body) {
                let _ = b.check();
            }
        }
        2 => {
            if let Ok(b) = parse_required::<terminals::ResizeBody>(body) {
                if let Ok((cols, rows)) = b.grid() {
                    assert!((1..=1000).contains(&cols) && (1..=1000).contains(&rows));
                }
            }
        }
        3 => {
            if let Ok(b) = parse_optional::<terminals::KillBody>(body) {
                if let Ok(signal) = terminals::KillBody::signal(b.as_ref()) {
                    assert!((1..=64).contains(&signal));
                }
            }
        }
        4 => {
            if let Ok(b) = parse_required::<runs::CreateRun>(body) {
                if b.check().is_ok() {
                    if let Some(dir) = b.dir() {
                        let _ = check_dir(dir, &allowed());
                    }
                }
            }
        }
        5 => {
            if let Ok(b) = parse_required::<hosts::RegisterHost>(body) {
                let _ = b.check();
            }
        }
        6 => {
            if let Ok(b) = parse_required::<hosts::DirBody>(body) {
                let _ = b.check();
            }
        }
        _ => {
            if let Ok(b) = parse_required::<tokens::CreateToken>(body) {
                let _ = b.check();
            }
        }
    }
}

fn config_path() -> &'static std::path::PathBuf {
    static PATH: OnceLock<std::path::PathBuf> = OnceLock::new();
    PATH.get_or_init(|| std::env::temp_dir().join(format!("tether-fuzz-config-{}.toml", std::process::id())))
}

/// The config loader: a TOML file parsed into `Settings` by the same
/// `Settings::load_from` the server runs (which validates), then the
/// accessors that read parsed settings.
pub fn config(data: &[u8]) {
    let path = config_path();
    std::fs::write(path, data).expect("write the config file");
    let Ok(settings) = Settings::load_from(Some(path), &HashMap::new()) else { return };
    let _ = settings.listen_addr();
    let _ = settings.cluster_nodes();
    let _ = settings.encryption_key();
    let _ = settings.reserve_pool_size();
}
