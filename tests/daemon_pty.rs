//! The host daemon against a fake server, with real PTYs.
//!
//! Each test starts the fake server (`daemon_pty/fake_server.rs`) and a
//! daemon in-process, then drives the daemon frame by frame. Every wait is
//! bounded, and every Output frame is checked for contiguity.

#[path = "daemon_pty/fake_server.rs"]
mod fake_server;

use std::path::{Path, PathBuf};
use std::time::Duration;

use fake_server::{FakeServer, Streams, TOKEN, WAIT};
use tether::daemon::{DaemonError, DaemonOptions};
use tether::proto::v1::{
    daemon_frame::Frame as Out, server_frame::Frame as In, Attach, Credentials, Detach, Dirs, DirsOp, HelloAck, Input,
    Kill, LimitsRefresh, Resize, Spawn,
};

struct Daemon {
    state: tempfile::TempDir,
    work: PathBuf,
    handle: tokio::task::JoinHandle<Result<(), DaemonError>>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

fn start_daemon(server: &FakeServer) -> Daemon {
    init_tracing();
    // The daemon runs in this process, so its shells take this process's
    // HOME. It is the empty one every harness daemon gets, so that a login
    // shell reads none of the machine's dotfiles (see `shell_home` in
    // tests/support/tether.rs for why).
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("home");
    std::fs::create_dir_all(&home).expect("home dir");
    // SAFETY: nextest runs each test in its own process, and this is set
    // before the daemon (the only reader) starts.
    unsafe { std::env::set_var("HOME", &home) };
    let state = tempfile::tempdir().expect("temp dir");
    let work = state.path().join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let work = std::fs::canonicalize(work).expect("canonical work dir");
    let opts = DaemonOptions {
        server: server.base_url.clone(),
        token: TOKEN.to_owned(),
        name: Some("test-host".to_owned()),
        state_dir: state.path().join("state"),
        allow_dirs: vec![work.clone()],
        lock_dirs: false,
        ca_file: None,
    };
    let handle = actix_web::rt::spawn(tether::daemon::run(opts));
    Daemon { state, work, handle }
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn spawn(terminal_id: &str, dir: &Path, argv: &[&str]) -> In {
    In::Spawn(Spawn {
        terminal_id: terminal_id.to_owned(),
        dir: dir.to_string_lossy().into_owned(),
        argv: argv.iter().map(|arg| (*arg).to_owned()).collect(),
        cols: 80,
        rows: 24,
    })
}

fn input(terminal_id: &str, text: &str) -> In {
    In::Input(Input { terminal_id: terminal_id.to_owned(), data: text.as_bytes().to_vec().into() })
}

fn attach(terminal_id: &str, attach_id: &str) -> In {
    In::Attach(Attach {
        terminal_id: terminal_id.to_owned(),
        attach_id: attach_id.to_owned(),
        resume_from: None,
        window: None,
        from_oldest: None,
    })
}

async fn expect_started(server: &mut FakeServer, terminal_id: &str) -> u32 {
    match server.next_control().await {
        Out::Started(started) if started.terminal_id == terminal_id => started.pid,
        other => panic!("expected Started for {terminal_id}, got {other:?}"),
    }
}

/// Attaches and returns the Scrollback offset.
async fn attach_and_expect_scrollback(server: &mut FakeServer, terminal_id: &str, attach_id: &str) -> u64 {
    server.send(attach(terminal_id, attach_id)).await;
    match server.next_control().await {
        Out::Scrollback(scrollback) => {
            assert_eq!(scrollback.terminal_id, terminal_id);
            assert_eq!(scrollback.attach_id, attach_id);
            scrollback.offset
        }
        other => panic!("expected Scrollback, got {other:?}"),
    }
}

/// Expects Snapshot, Exit, Usage for `terminal_id`, in that order, and returns the Exit.
async fn expect_final_frames(
    server: &mut FakeServer,
    terminal_id: &str,
) -> (Vec<u8>, tether::proto::v1::Exit, tether::proto::v1::Usage) {
    let snapshot = match server.next_control().await {
        Out::Snapshot(snapshot) if snapshot.terminal_id == terminal_id => snapshot,
        other => panic!("expected Snapshot for {terminal_id}, got {other:?}"),
    };
    let exit = match server.next_frame().await {
        Out::Exit(exit) if exit.terminal_id == terminal_id => exit,
        other => panic!("expected Exit right after Snapshot, got {other:?}"),
    };
    let usage = match server.next_frame().await {
        Out::Usage(usage) if usage.terminal_id == terminal_id => usage,
        other => panic!("expected Usage right after Exit, got {other:?}"),
    };
    (snapshot.data.to_vec(), exit, usage)
}

const HOST_ID: &str = "6a1f7c2e-8d43-4b1a-9f0e-2c5d8e7a9b10";

// ------------------------------------------------------------------ tests

#[actix_rt::test]
async fn a_shell_streams_resizes_and_exits_with_its_code() {
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);

    let hello = server.accept_and_ack().await;
    assert_eq!(hello.host_id, HOST_ID);
    assert_eq!(hello.daemon_version, env!("CARGO_PKG_VERSION"));
    let capabilities = hello.capabilities.expect("capabilities");
    assert!(capabilities.manage_dirs && capabilities.refresh_limits && capabilities.credentials && capabilities.usage);
    assert_eq!(hello.dirs, [daemon.work.to_string_lossy()]);
    assert!(hello.terminals.is_empty());
    assert_eq!(server.registrations(), 1);

    server.send(spawn("t1", &daemon.work, &["sh"])).await;
    expect_started(&mut server, "t1").await;
    // Spawn is idempotent: the same id again only repeats Started.
    server.send(spawn("t1", &daemon.work, &["sh"])).await;
    expect_started(&mut server, "t1").await;

    attach_and_expect_scrollback(&mut server, "t1", "a1").await;
    server.send(input("t1", "echo hello-$((100+23))\n")).await;
    // The echoed command line shows the unexpanded text; only the output has hello-123.
    server.wait_for_text("t1", "hello-123").await;

    // A second attach flushes the stream so far and snapshots at its end
    // (checked in Streams::observe); the snapshot shows what was printed.
    server.send(attach("t1", "a2")).await;
    match server.next_control().await {
        Out::Scrollback(scrollback) => {
            assert_eq!(scrollback.attach_id, "a2");
            assert_eq!((scrollback.cols, scrollback.rows), (80, 24));
            assert!(String::from_utf8_lossy(&scrollback.data).contains("hello-123"));
        }
        other => panic!("expected Scrollback, got {other:?}"),
    }

    server.send(In::Resize(Resize { terminal_id: "t1".to_owned(), cols: 100, rows: 30 })).await;
    match server.next_control().await {
        Out::Size(size) => assert_eq!((size.terminal_id.as_str(), size.cols, size.rows), ("t1", 100, 30)),
        other => panic!("expected Size, got {other:?}"),
    }
    server.send(input("t1", "stty size\n")).await;
    server.wait_for_text("t1", "30 100").await;

    server.send(input("t1", "exit 3\n")).await;
    let (snapshot, exit, usage) = expect_final_frames(&mut server, "t1").await;
    assert_eq!((exit.exit_code, exit.signal), (Some(3), None));
    assert!(String::from_utf8_lossy(&snapshot).contains("30 100"), "final screen lacks the last output");
    assert_eq!(usage.output_bytes, server.streams.next_offset["t1"], "every byte was streamed before Exit");
    assert!(usage.wall_ms < 60_000);

    // A child killed with SIGTERM reports the signal, not an exit code.
    server.send(spawn("t2", &daemon.work, &["sleep", "1000"])).await;
    expect_started(&mut server, "t2").await;
    server.send(In::Kill(Kill { terminal_id: "t2".to_owned(), signal: 15 })).await;
    let (_, exit, usage) = expect_final_frames(&mut server, "t2").await;
    assert_eq!((exit.exit_code, exit.signal), (None, Some(15)));
    assert_eq!(usage.output_bytes, 0);

    // Exited terminals are forgotten: an attach is refused.
    server.send(attach("t1", "a3")).await;
    match server.next_control().await {
        Out::AttachError(error) => assert_eq!((error.terminal_id.as_str(), error.attach_id.as_str()), ("t1", "a3")),
        other => panic!("expected AttachError, got {other:?}"),
    }
}

#[actix_rt::test]
async fn requests_are_answered_and_refusals_explained() {
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);
    server.accept_and_ack().await;

    // Spawning outside the allowlist is refused.
    server.send(spawn("outside", Path::new("/"), &["sh"])).await;
    match server.next_control().await {
        Out::SpawnError(error) => {
            assert_eq!(error.terminal_id, "outside");
            assert!(error.message.contains("not inside an allowed dir"), "{}", error.message);
        }
        other => panic!("expected SpawnError, got {other:?}"),
    }
    // So is a program that does not exist.
    server.send(spawn("missing", &daemon.work, &["/no/such/program"])).await;
    assert!(matches!(server.next_control().await, Out::SpawnError(error) if error.terminal_id == "missing"));

    server.send(attach("nope", "a1")).await;
    assert!(matches!(server.next_control().await, Out::AttachError(error) if error.message == "unknown terminal"));

    let dirs = |request_id: &str, op: DirsOp, path: &str| {
        In::Dirs(Dirs { request_id: request_id.to_owned(), op: op.into(), path: path.to_owned() })
    };
    server.send(dirs("r1", DirsOp::Add, "/definitely/not/here")).await;
    match server.next_control().await {
        Out::DirsResult(result) => {
            assert_eq!(result.request_id, "r1");
            assert!(result.error.is_some());
            assert_eq!(result.dirs, [daemon.work.to_string_lossy()]);
        }
        other => panic!("expected DirsResult, got {other:?}"),
    }
    let extra = daemon.work.with_file_name("extra");
    std::fs::create_dir_all(&extra).expect("extra dir");
    server.send(dirs("r2", DirsOp::Add, &extra.to_string_lossy())).await;
    match server.next_control().await {
        Out::DirsResult(result) => {
            assert_eq!(result.error, None);
            assert_eq!(result.dirs, [daemon.work.to_string_lossy(), extra.to_string_lossy()]);
        }
        other => panic!("expected DirsResult, got {other:?}"),
    }
    server.send(dirs("r3", DirsOp::Remove, &daemon.work.to_string_lossy())).await;
    assert!(
        matches!(server.next_control().await, Out::DirsResult(result) if result.error.is_none() && result.dirs == [extra.to_string_lossy()])
    );
    server.send(dirs("r4", DirsOp::Remove, &extra.to_string_lossy())).await;
    assert!(matches!(server.next_control().await, Out::DirsResult(result) if result.error.is_some()));
    // The removed dir no longer admits terminals.
    server.send(spawn("removed", &daemon.work, &["sh"])).await;
    assert!(matches!(server.next_control().await, Out::SpawnError(_)));

    server.send(In::LimitsRefresh(LimitsRefresh { request_id: "l1".to_owned() })).await;
    match server.next_control().await {
        Out::LimitsResult(result) => {
            assert_eq!((result.request_id.as_str(), result.error), ("l1", None));
            let limits: serde_json::Value = serde_json::from_str(&result.limits_json).expect("limits JSON");
            for key in ["nofile", "nproc", "as", "cpu"] {
                assert!(limits["rlimits"][key].get("soft").is_some(), "{key} missing: {limits}");
            }
            assert!(limits["cpus"].as_u64().unwrap_or(0) >= 1);
        }
        other => panic!("expected LimitsResult, got {other:?}"),
    }

    server.send(In::Credentials(Credentials { request_id: "c1".to_owned() })).await;
    match server.next_control().await {
        Out::CredentialsResult(result) => {
            assert_eq!(result.error.as_deref(), Some("no credentials file"))
        }
        other => panic!("expected CredentialsResult, got {other:?}"),
    }
    let credentials = br#"{"github": {"token": "secret"}}"#;
    std::fs::write(daemon.state.path().join("state/credentials.json"), credentials).expect("write credentials");
    server.send(In::Credentials(Credentials { request_id: "c2".to_owned() })).await;
    match server.next_control().await {
        Out::CredentialsResult(result) => {
            assert_eq!(result.error, None);
            assert_eq!(&result.credentials_json[..], &credentials[..]);
        }
        other => panic!("expected CredentialsResult, got {other:?}"),
    }
}

#[actix_rt::test]
async fn a_reconnect_reports_live_terminals_and_delivers_queued_exits() {
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);
    server.accept_and_ack().await;

    server.send(spawn("live", &daemon.work, &["sh"])).await;
    expect_started(&mut server, "live").await;
    server.send(spawn("doomed", &daemon.work, &["sleep", "1000"])).await;
    let doomed_pid = expect_started(&mut server, "doomed").await;

    attach_and_expect_scrollback(&mut server, "live", "a1").await;
    server.send(input("live", "echo before-$((1+1))\n")).await;
    server.wait_for_text("live", "before-2").await;
    // Let the prompt arrive so the offset is final.
    server.drain_output(Duration::from_millis(500)).await;
    let offset_before = server.streams.next_offset["live"];

    // Drop the connection; while the daemon is away, "doomed" dies.
    server.close(Some(1001)).await;
    // SAFETY: plain kill(2) of the child the daemon reported.
    assert_eq!(unsafe { libc::kill(doomed_pid as i32, libc::SIGKILL) }, 0);

    let hello = server.accept().await;
    assert_eq!(hello.host_id, HOST_ID);
    let mut reported: Vec<_> =
        hello.terminals.iter().map(|t| (t.terminal_id.as_str(), t.running, t.next_offset)).collect();
    reported.sort();
    assert_eq!(reported, [("doomed", false, 0), ("live", true, offset_before)]);

    // The queued frames of the dead terminal follow the HelloAck.
    server.send(In::HelloAck(HelloAck { instance_id: "fake#000002".to_owned(), resume_ended: Vec::new() })).await;
    let (_, exit, _) = expect_final_frames(&mut server, "doomed").await;
    assert_eq!((exit.exit_code, exit.signal), (None, Some(9)));

    // The new connection starts detached: input produces no Output until
    // an Attach, whose snapshot already shows it.
    server.streams = Streams::default();
    server.send(input("live", "echo after-$((2+2))\n")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let offset = attach_and_expect_scrollback(&mut server, "live", "a2").await;
    assert!(offset > offset_before);
    server.send(input("live", "echo again-$((3+3))\n")).await;
    server.wait_for_text("live", "again-6").await;
    server.send(In::Detach(Detach { terminal_id: "live".to_owned() })).await;
    server.send(input("live", "exit 0\n")).await;
    let (snapshot, exit, _) = expect_final_frames(&mut server, "live").await;
    assert_eq!(exit.exit_code, Some(0));
    assert!(String::from_utf8_lossy(&snapshot).contains("after-4"));
}

/// An idle daemon keeps a connection whose server answers every Ping at
/// once. It used to leave it 20 s after each Ping (every 50 s), because it
/// asked whether the socket had been silent for 20 s, which a Pong that
/// came a millisecond after the Ping always was by then.
#[actix_rt::test]
async fn an_idle_daemon_keeps_a_connection_that_answers_its_pings() {
    let mut server = FakeServer::start(HOST_ID).await;
    let _daemon = start_daemon(&server);
    server.accept_and_ack().await;
    let pings = server.pings_while_quiet(Duration::from_secs(55)).await;
    assert!(pings >= 1, "a Ping every 30 s");
}

/// Input waiting for a program that never read it, when the program ends:
/// the daemon drops it and goes on. The PTY's writer used to spin on the
/// hang-up (reported writable, every write refused), starving every
/// terminal of the daemon: no Exit, no Ping, no new terminal, only
/// SIGKILL stopped it.
#[actix_rt::test]
async fn input_left_for_a_program_that_ended_is_dropped_and_the_daemon_goes_on() {
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);
    server.accept_and_ack().await;
    server.send(spawn("deaf", &daemon.work, &["sh", "-c", "echo deaf; sleep 2"])).await;
    expect_started(&mut server, "deaf").await;
    server.send(input("deaf", "abc\n")).await;
    server.send(input("deaf", &"a".repeat(64 * 1024))).await;
    let (_, exit, _) = expect_final_frames(&mut server, "deaf").await;
    assert_eq!(exit.exit_code, Some(0));

    server.send(spawn("next", &daemon.work, &["sh", "-c", "exit 7"])).await;
    expect_started(&mut server, "next").await;
    let (_, exit, _) = expect_final_frames(&mut server, "next").await;
    assert_eq!(exit.exit_code, Some(7), "the daemon still runs terminals");
}

/// Drops the connection, and again while the daemon's hello still reports
/// `terminal_id` running (it redials after a second or more), until a hello
/// reports it ended.
async fn hello_once_ended(server: &mut FakeServer, terminal_id: &str) -> tether::proto::v1::Hello {
    loop {
        server.close(Some(1001)).await;
        let hello = server.accept().await;
        if hello.terminals.iter().any(|t| t.terminal_id == terminal_id && !t.running) {
            return hello;
        }
    }
}

/// A terminal that ends while the daemon is disconnected keeps its output:
/// when the HelloAck names it (`resume_ended`), a resuming Attach gets the
/// raw bytes the server lacks, and only then come Snapshot, Exit and Usage
/// (docs/PROTOCOL.md, "Terminals that ended while disconnected"). A run's
/// log used to lose what the command printed after the link dropped.
#[actix_rt::test]
async fn a_terminal_that_ended_while_away_serves_its_tail_before_its_end() {
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);
    let hello = server.accept_and_ack().await;
    assert!(hello.capabilities.expect("capabilities").resume_ended);

    server.send(spawn("run", &daemon.work, &["sh", "-c", "sleep 0.5; seq 1 3000; echo last"])).await;
    expect_started(&mut server, "run").await;
    let stored = attach_and_expect_scrollback(&mut server, "run", "a1").await;

    // The command prints its tail and ends while no server is connected.
    let hello = hello_once_ended(&mut server, "run").await;
    let reported = hello.terminals.iter().find(|t| t.terminal_id == "run").expect("the run reported");
    assert!(!reported.running);
    let end = reported.next_offset;
    assert!(end > stored + 10_000, "{end} after {stored}");

    server
        .send(In::HelloAck(HelloAck { instance_id: "fake#000002".to_owned(), resume_ended: vec!["run".to_owned()] }))
        .await;
    server
        .send(In::Attach(Attach {
            terminal_id: "run".to_owned(),
            attach_id: "capture".to_owned(),
            resume_from: Some(stored),
            window: Some(64 * 1024),
            from_oldest: Some(true),
        }))
        .await;
    match server.next_frame().await {
        Out::Scrollback(tail) => {
            assert!(tail.resumed);
            assert_eq!((tail.attach_id.as_str(), tail.offset), ("capture", stored));
            assert_eq!(stored + tail.data.len() as u64, end, "the whole tail");
            let text = String::from_utf8_lossy(&tail.data).into_owned();
            let numbers: Vec<&str> = text.split("\r\n").filter(|l| !l.is_empty()).collect();
            let expected: Vec<String> = (1..=3000).map(|n| n.to_string()).chain(["last".to_owned()]).collect();
            assert_eq!(numbers, expected);
        }
        other => panic!("expected the tail before the end, got {other:?}"),
    }
    let (_, exit, usage) = expect_final_frames(&mut server, "run").await;
    assert_eq!(exit.exit_code, Some(0));
    assert_eq!(usage.output_bytes, end);
}

/// Final frames held for a resuming Attach that never comes are sent
/// anyway, after 10 s: a server that named a terminal and then lost
/// interest does not leave its end unreported.
#[actix_rt::test]
async fn held_final_frames_go_without_the_attach_after_a_while() {
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);
    server.accept_and_ack().await;
    server.send(spawn("run", &daemon.work, &["sh", "-c", "sleep 0.5; echo done"])).await;
    expect_started(&mut server, "run").await;
    hello_once_ended(&mut server, "run").await;
    server
        .send(In::HelloAck(HelloAck { instance_id: "fake#000002".to_owned(), resume_ended: vec!["run".to_owned()] }))
        .await;
    let held = std::time::Instant::now();
    let (_, exit, _) = expect_final_frames(&mut server, "run").await;
    assert_eq!(exit.exit_code, Some(0));
    assert!(held.elapsed() >= Duration::from_secs(9), "held for {:?}", held.elapsed());
}

#[actix_rt::test]
async fn a_refused_host_registers_again_once_then_gives_up() {
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);
    server.accept().await;
    assert_eq!(server.registrations(), 1);

    // The host was deleted: the server refuses it and hands out a new id.
    const NEW_ID: &str = "0d9e8f7a-6b5c-4d3e-8f1a-2b3c4d5e6f70";
    server.set_host_id(NEW_ID);
    server.close(Some(4403)).await;
    let hello = server.accept().await;
    assert_eq!(hello.host_id, NEW_ID);
    assert_eq!(server.registrations(), 2);

    // Refused again before any HelloAck: fatal.
    server.close(Some(4403)).await;
    let mut daemon = daemon;
    let result = tokio::time::timeout(WAIT, &mut daemon.handle).await.expect("daemon did not give up");
    assert!(matches!(result, Ok(Err(DaemonError::ForeignHost { .. }))), "{result:?}");
}

#[actix_rt::test]
async fn a_bad_token_is_fatal() {
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);
    server.accept().await;
    server.close(Some(4401)).await;
    let mut daemon = daemon;
    let result = tokio::time::timeout(WAIT, &mut daemon.handle).await.expect("daemon did not stop");
    assert!(matches!(result, Ok(Err(DaemonError::BadToken))), "{result:?}");
}

#[actix_rt::test]
async fn a_background_process_holding_the_pty_does_not_delay_exit_forever() {
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);
    server.accept_and_ack().await;

    // `sleep` ignores the hangup (inherited trap) and keeps the PTY open
    // after `sh` exits, so the reader sees no EOF; the daemon reports the
    // exit after a grace period instead of waiting for it.
    server.send(spawn("bg", &daemon.work, &["sh", "-c", "trap \"\" HUP; sleep 20 & echo started; exit 4"])).await;
    let sleep_group = expect_started(&mut server, "bg").await;
    let (snapshot, exit, _) = expect_final_frames(&mut server, "bg").await;
    assert_eq!(exit.exit_code, Some(4));
    assert!(String::from_utf8_lossy(&snapshot).contains("started"));
    // The background sleep shares the terminal's process group.
    // SAFETY: plain kill(2) of a process group this test created.
    unsafe { libc::kill(-(sleep_group as i32), libc::SIGKILL) };
}

#[actix_rt::test]
async fn an_empty_argv_starts_a_login_shell_without_the_daemon_settings() {
    // SAFETY: nextest runs each test in its own process; nothing else here
    // reads the environment concurrently before the daemon starts.
    unsafe { std::env::set_var("TETHER_TEST_SECRET", "leaked") };
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);
    server.accept_and_ack().await;

    server.send(spawn("login", &daemon.work, &[])).await;
    expect_started(&mut server, "login").await;
    attach_and_expect_scrollback(&mut server, "login", "a1").await;
    server.send(input("login", "echo \"argv0=$0 term=$TERM secret=${TETHER_TEST_SECRET:-none} pwd=$(pwd)\"\n")).await;
    let expected = format!("term=xterm-256color secret=none pwd={}", daemon.work.display());
    server.wait_for_text("login", &expected).await;
    // A login shell's argv[0] starts with '-'.
    assert!(server.streams.text("login").contains("argv0=-"), "not a login shell: {}", server.streams.text("login"));
    server.send(input("login", "exit\n")).await;
    let (_, exit, _) = expect_final_frames(&mut server, "login").await;
    assert_eq!(exit.exit_code, Some(0));
}

/// Flow control: a terminal sends Output only within the window its Attach
/// and later Credits allow; a flooding terminal whose window is spent
/// stops, while another terminal of the same connection still echoes.
#[actix_rt::test]
async fn output_stays_within_its_window_and_other_terminals_flow() {
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);
    let hello = server.accept_and_ack().await;
    assert!(hello.capabilities.expect("capabilities").flow_control, "the hello claims flow control");

    server.send(spawn("flood", &daemon.work, &["yes", "0123456789abcdef"])).await;
    expect_started(&mut server, "flood").await;
    server.send(spawn("echo", &daemon.work, &["cat"])).await;
    expect_started(&mut server, "echo").await;

    const WINDOW: u64 = 20_000;
    let windowed = |id: &str, attach_id: &str| {
        In::Attach(Attach {
            terminal_id: id.to_owned(),
            attach_id: attach_id.to_owned(),
            resume_from: None,
            window: Some(WINDOW),
            from_oldest: None,
        })
    };
    server.send(windowed("flood", "f1")).await;
    let start = match server.next_control().await {
        Out::Scrollback(scrollback) => scrollback.offset,
        other => panic!("expected Scrollback, got {other:?}"),
    };
    while server.streams.next_offset["flood"] < start + WINDOW {
        match server.next_frame().await {
            Out::Output(_) => {}
            other => panic!("expected Output, got {other:?}"),
        }
    }
    assert_eq!(server.streams.next_offset["flood"], start + WINDOW, "Output stops exactly at the window");

    // The flood is paused; the other terminal streams and echoes.
    server.send(windowed("echo", "e1")).await;
    match server.next_control().await {
        Out::Scrollback(scrollback) => assert_eq!(scrollback.terminal_id, "echo"),
        other => panic!("expected Scrollback, got {other:?}"),
    }
    server.send(input("echo", "through-the-flood\n")).await;
    server.wait_for_text("echo", "through-the-flood\r\nthrough-the-flood").await;
    assert_eq!(server.streams.next_offset["flood"], start + WINDOW, "nothing past the window meanwhile");

    // A Credit moves the limit; a lower one changes nothing.
    let credit = |until: u64| In::Credit(tether::proto::v1::Credit { terminal_id: "flood".to_owned(), until });
    server.send(credit(start + 3 * WINDOW)).await;
    server.send(credit(start + WINDOW)).await;
    while server.streams.next_offset["flood"] < start + 3 * WINDOW {
        match server.next_frame().await {
            Out::Output(_) => {}
            other => panic!("expected Output, got {other:?}"),
        }
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(300), server.next_frame()).await.is_err(),
        "nothing past the credited limit"
    );
    assert_eq!(server.streams.next_offset["flood"], start + 3 * WINDOW);

    server.send(In::Kill(Kill { terminal_id: "flood".to_owned(), signal: 9 })).await;
}

/// A burst of single-keystroke Input frames while the program is not
/// reading (a browser sends one frame per key) is queued, not dropped:
/// 300 frames of 100 bytes fill the PTY's own buffer many times over, and
/// every byte reaches the program once it reads. The daemon used to refuse
/// input beyond 64 queued frames, whatever their size.
#[actix_rt::test]
async fn a_burst_of_input_frames_waits_for_a_busy_program() {
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);
    server.accept_and_ack().await;
    let sink = daemon.work.join("input-burst.txt");
    let raw = daemon.work.join("input-burst.raw");
    // Input that reached the PTY before `stty raw` would meet the canonical
    // line discipline, which keeps 4 KiB of an unfinished line and drops the
    // rest (as on any terminal): the burst starts once the mode is raw.
    let script = format!("stty raw -echo && touch {}; sleep 2; exec head -c 30000 > {}", raw.display(), sink.display());
    server.send(spawn("busy", &daemon.work, &["sh", "-c", &script])).await;
    expect_started(&mut server, "busy").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !raw.exists() {
        assert!(tokio::time::Instant::now() < deadline, "the program never switched its terminal to raw mode");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let line = "k".repeat(100);
    for _ in 0..300 {
        server.send(input("busy", &line)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let got = std::fs::metadata(&sink).map(|m| m.len()).unwrap_or(0);
        if got == 30_000 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the program got {got} of 30000 input bytes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A resume from an offset the ring (512 KiB) no longer holds: a capture's
/// Attach (`from_oldest`) gets the raw bytes from the oldest offset still
/// held, so only the dropped bytes are lost (docs/CLUSTER.md, "Run logs
/// across moves"); a viewer's gets a screen snapshot as before.
#[actix_rt::test]
async fn a_resume_past_the_ring_starts_at_its_oldest_byte_when_asked() {
    const TOTAL: u64 = 700_000;
    const RING: u64 = 512 * 1024;
    let mut server = FakeServer::start(HOST_ID).await;
    let daemon = start_daemon(&server);
    server.accept_and_ack().await;
    let script = format!("head -c {TOTAL} /dev/zero | tr '\\0' x; exec sleep 100");
    server.send(spawn("big", &daemon.work, &["sh", "-c", &script])).await;
    expect_started(&mut server, "big").await;
    let resume = |attach_id: &str, from_oldest: Option<bool>| {
        In::Attach(Attach {
            terminal_id: "big".to_owned(),
            attach_id: attach_id.to_owned(),
            resume_from: Some(0),
            window: None,
            from_oldest,
        })
    };
    // Until the daemon has read the whole output, the ring's end moves on.
    let mut tries = 0;
    let scrollback = loop {
        tries += 1;
        server.send(resume(&format!("capture-{tries}"), Some(true))).await;
        let Out::Scrollback(scrollback) = server.next_control().await else { panic!("expected Scrollback") };
        assert!(scrollback.resumed, "a capture's resume is never a snapshot");
        if scrollback.offset + scrollback.data.len() as u64 == TOTAL || tries == 100 {
            break scrollback;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(scrollback.offset, TOTAL - RING, "from the oldest byte held: only the dropped bytes are missing");
    assert_eq!(scrollback.data.len() as u64, RING);
    assert!(scrollback.data.iter().all(|b| *b == b'x'));

    server.send(resume("viewer", None)).await;
    let Out::Scrollback(snapshot) = server.next_control().await else { panic!("expected Scrollback") };
    assert!(!snapshot.resumed, "a viewer's resume from bytes gone is a snapshot");
    assert_eq!(snapshot.offset, TOTAL);
}
