//! Streams on one instance under stress, with a real `tether serve`, a real
//! `tether daemon` and real PTYs: per-terminal flow control (a viewer that
//! stops reading holds back only its own terminal), resumes that never
//! repeat a byte, viewers of terminals that ended while nobody was
//! streaming them, and a drain that waits for a slow viewer to take its
//! close (docs/PROTOCOL.md, "Flow control" and "Viewer protocol";
//! docs/ARCHITECTURE.md, "Drain").

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::client::{viewer_url, Event, Socket, WAIT};
use support::daemon::DaemonProcess;
use support::e2e::{metric, start, terminal, wait_online, E2e, Viewer};

/// The reproduction: terminal X floods, one of X's viewers stops
/// reading; terminal Y of the same daemon must keep echoing, and a new
/// terminal must start on that host, while X's viewer is still connected
/// (`viewer.slow_ms` is long, so nothing here relies on its eviction).
/// Before flow control, the daemon connection waited for X's viewer and
/// every terminal of the host froze until it was cut.
#[actix_rt::test]
async fn a_viewer_that_stops_reading_holds_back_only_its_own_terminal() {
    let e = start(false, &[("TETHER_VIEWER__SLOW_MS", "600000")]).await;
    let mut stalled = stalled_viewer_of_a_flood(&e).await;

    // A terminal started now on the same host starts, and echoes every line.
    let y = terminal(&e, &["cat"]).await;
    let mut typist = Viewer::attach(&e, &y, "").await;
    for n in 0..20 {
        typist.type_line(&format!("line-{n}-end")).await;
        // The tty's echo and cat's copy: the line twice.
        let needle = format!("line-{n}-end\r\nline-{n}-end");
        typist.until(&needle).await;
    }

    // X's stalled viewer is still there (not evicted: slow_ms is 10 min),
    // and its queue stayed within its bound.
    let high = metric(&e.api, "tether_viewer_queue_high_water_bytes").await.expect("gauge");
    assert!(high <= 4.0 * 1024.0 * 1024.0, "a viewer queue passed its bound: {high}");
    for _ in 0..3 {
        match stalled.sock.next_within(WAIT).await {
            Some(Event::Close(code)) => panic!("the stalled viewer was closed ({code:?})"),
            None => panic!("the stalled viewer got nothing"),
            Some(_) => {}
        }
    }
}

/// A viewer that is behind when its instance drains still gets what was
/// queued for it and then its 4503: X floods, its only viewer stops reading
/// until the queue is held at its soft bound (megabytes between the
/// server's queue and the kernel's buffers), the server gets SIGTERM, and
/// the viewer reads again only 1.5 s later, well after the drain's own work
/// (its 200 ms pause, the lease release). The close frame waits behind
/// those megabytes; an instance that exited once its drain work was done
/// cut the socket and the viewer got no close at all (docs/ARCHITECTURE.md,
/// "Drain").
#[actix_rt::test]
async fn a_draining_instance_waits_for_a_slow_viewer_to_take_its_close() {
    let mut e = start(false, &[("TETHER_VIEWER__SLOW_MS", "600000")]).await;
    let mut stalled = stalled_viewer_of_a_flood(&e).await;

    let reader = actix_rt::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut bytes = 0usize;
        loop {
            match stalled.sock.next_within(WAIT).await {
                Some(Event::Binary(b)) => bytes += b.len(),
                Some(Event::Close(code)) => return (bytes, code),
                Some(_) => {}
                None => panic!("nothing more after {bytes} bytes"),
            }
        }
    });
    let status = e.server.terminate_async(Duration::from_secs(15)).await;
    assert!(status.is_some_and(|s| s.success()), "the drain ended by itself: {status:?}");
    let (bytes, code) = reader.await.expect("reader");
    assert!(bytes > 1024 * 1024, "the queued output came first: {bytes} bytes");
    assert_eq!(code, Some(4503), "the viewer is told to reattach after {bytes} bytes");
}

/// A viewer of a terminal X that floods, which stops reading once X starts:
/// returned when its queue is past the soft bound (half of
/// viewer.queue_bytes), so X's stream is held for it.
async fn stalled_viewer_of_a_flood(e: &E2e) -> Viewer {
    let flood = "read go; while :; do head -c 300000 /dev/urandom | base64; done";
    let x = terminal(e, &["sh", "-c", flood]).await;
    let mut stalled = Viewer::attach(e, &x, "").await;
    stalled.type_line("go").await;
    let soft = 2.0 * 1024.0 * 1024.0;
    let deadline = tokio::time::Instant::now() + WAIT;
    while metric(&e.api, "tether_viewer_queue_high_water_bytes").await.unwrap_or(0.0) <= soft {
        assert!(tokio::time::Instant::now() < deadline, "the stalled viewer's queue never filled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stalled
}

/// The reproduction of duplicated bytes: output before any viewer,
/// viewer A live at S, more output, viewer B resumes from 0 (served by the
/// daemon's ring), viewer C resumes from S (served by the arbiter's ring).
/// Every viewer's bytes from its start offset are the terminal's stream.
#[actix_rt::test]
async fn resumes_from_any_offset_never_repeat_or_skip_a_byte() {
    let e = start(false, &[]).await;
    let id = terminal(&e, &["sh", "-c", "printf 'before-any-viewer\\n'; exec cat"]).await;
    let mut a = Viewer::attach(&e, &id, "").await;
    a.type_line("BBBB").await;
    a.until("BBBB\r\nBBBB\r\n").await;
    let mut b = Viewer::attach(&e, &id, "?from=0").await;
    assert_eq!(b.start, 0);
    b.until("BBBB\r\nBBBB\r\n").await;
    let mut c = Viewer::attach(&e, &id, &format!("?from={}", a.start)).await;
    assert_eq!(c.start, a.start);
    // More traffic after the resumes, seen by all three.
    c.type_line("CCCC").await;
    for v in [&mut a, &mut b, &mut c] {
        v.until("CCCC\r\nCCCC\r\n").await;
    }
    // B holds the whole stream from 0: the reference.
    let stream = b.live.clone();
    let text = String::from_utf8_lossy(&stream).into_owned();
    assert!(text.starts_with("before-any-viewer"), "{text:?}");
    assert_eq!(text.matches("BBBB").count(), 2, "{text:?}");
    let from_a = &stream[a.start as usize..];
    assert_eq!(a.text(), String::from_utf8_lossy(from_a), "viewer A (live at {})", a.start);
    assert_eq!(c.text(), String::from_utf8_lossy(from_a), "viewer C (resumed from {})", c.start);
    assert_eq!(c.text().matches("BBBB").count(), 2, "{:?}", c.text());
}

/// Reads a viewer until it is closed; returns the JSON messages it got and
/// the close code. Never waits past `WAIT` for one frame.
async fn messages_until_close(sock: &mut Socket) -> (Vec<Value>, Option<u16>) {
    let mut messages = Vec::new();
    loop {
        match sock.next_within(WAIT).await {
            Some(Event::Text(t)) => messages.push(serde_json::from_str(&t).expect("json")),
            Some(Event::Close(code)) => return (messages, code),
            Some(_) => {}
            None => panic!("no close after {messages:?}"),
        }
    }
}

/// A viewer reattached while the daemon is down waits; when the daemon
/// comes back without the process, the viewer is told the terminal exited
/// and is closed 1000 (it used to hang with no `exit`).
#[actix_rt::test]
async fn a_viewer_waiting_for_a_host_learns_its_terminal_ended() {
    let mut e = start(false, &[]).await;
    let id = terminal(&e, &["sleep", "1000"]).await;
    e.daemon.kill();
    e.api.wait_for(&format!("/api/v1/hosts/{}", e.host), "host offline", |b| b["host"]["state"] == "offline").await;
    let mut sock = Socket::connect(&viewer_url(&e.server, &id), Some(&e.api.token), &["tether.v1"]).await;
    loop {
        match sock.next().await {
            Event::Text(t) if t.contains("host offline") => break,
            Event::Close(code) => panic!("closed {code:?} while the host is away"),
            _ => {}
        }
    }
    let _daemon = DaemonProcess::start(&e.server, &e.api.token, &e.dir.path().join("state"));
    wait_online(&e.api).await;
    let (messages, code) = messages_until_close(&mut sock).await;
    assert_eq!(code, Some(1000), "{messages:?}");
    assert!(messages.iter().any(|m| m["type"] == "exit"), "{messages:?}");
    assert!(messages.iter().any(|m| m["type"] == "status" && m["state"] == "exited"), "{messages:?}");
}

/// Viewers that attach to a terminal that is exiting at that very moment
/// always end with `exit` and close 1000: 60 short-lived terminals, ten at
/// a time, each attached right after its creation.
#[actix_rt::test]
async fn viewers_of_short_lived_terminals_always_see_the_exit() {
    let e = start(false, &[]).await;
    let attach_at_once = |round: usize| {
        let e = &e;
        async move {
            // Lifetimes spread over 0-60 ms, so some end exactly while
            // their viewer is being set up.
            let script = format!("echo hi; sleep 0.{:03}; exit 7", round);
            let argv = json!(["sh", "-c", script]);
            let (status, body) = e.api.post("/api/v1/terminals", json!({"hostId": e.host, "argv": argv})).await;
            assert_eq!(status, 201, "{body}");
            let id = body["terminal"]["id"].as_str().expect("id").to_string();
            let mut sock = Socket::connect(&viewer_url(&e.server, &id), Some(&e.api.token), &["tether.v1"]).await;
            let (messages, code) = messages_until_close(&mut sock).await;
            assert_eq!(code, Some(1000), "round {round}: {messages:?}");
            let exit = messages.iter().find(|m| m["type"] == "exit");
            assert_eq!(exit.map(|m| m["exitCode"].clone()), Some(json!(7)), "round {round}: {messages:?}");
        }
    };
    for batch in 0..6 {
        futures_util::future::join_all((0..10).map(|n| attach_at_once(batch * 10 + n))).await;
    }
}

/// Runs in flight across a daemon restart end `failed`, and the arbiters
/// that captured their output go away (they used to stay forever).
#[actix_rt::test]
async fn run_captures_end_with_their_runs_across_a_daemon_restart() {
    let mut e = start(false, &[]).await;
    let mut runs = Vec::new();
    for _ in 0..3 {
        let (status, body) = e.api.post("/api/v1/runs", json!({"hostId": e.host, "argv": ["sleep", "1000"]})).await;
        assert_eq!(status, 201, "{body}");
        runs.push(body["run"]["id"].as_str().expect("id").to_string());
    }
    for run in &runs {
        e.api.wait_for(&format!("/api/v1/runs/{run}"), "run running", |b| b["run"]["state"] == "running").await;
    }
    assert_eq!(metric(&e.api, "tether_terminal_arbiters").await, Some(3.0));
    e.daemon.kill();
    e.api.wait_for(&format!("/api/v1/hosts/{}", e.host), "host offline", |b| b["host"]["state"] == "offline").await;
    let _daemon = DaemonProcess::start(&e.server, &e.api.token, &e.dir.path().join("state"));
    wait_online(&e.api).await;
    for run in &runs {
        e.api.wait_for(&format!("/api/v1/runs/{run}"), "run failed", |b| b["run"]["state"] == "failed").await;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while metric(&e.api, "tether_terminal_arbiters").await != Some(0.0) {
        assert!(tokio::time::Instant::now() < deadline, "run captures were never removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
