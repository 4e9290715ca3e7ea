//! A terminal's arbiter that starts after the terminal ended must not
//! leave a viewer waiting (docs/PROTOCOL.md, "Ended terminals").
//!
//! This is the race behind short-lived terminals: a viewer reads the row
//! while the terminal runs, the Exit is recorded, and only then does the
//! arbiter start and read the row. Its window is microseconds on a real
//! server (tests/relay_flow.rs attaches to 60 short-lived terminals and
//! rarely meets it), so here the arbiter is started by hand on a real
//! SQLite store whose row already says `exited`, with its host online (a
//! recording stand-in for the daemon connection). Such an arbiter has
//! nothing to stream and goes away at once; a viewer that asks to join it
//! is told the terminal ended (`NotJoined::Ended`), so it answers from the
//! store (status, size, final screen, exit, close 1000). It used to be
//! told `Retired` and ask the registry again, meeting a new arbiter in the
//! same state each time, until it gave up with 1011 after 20 tries.
//!
//! A captured run that ends has its end owed to the instance's count of
//! unstored facts until the store takes it, so a drain waits for it
//! (docs/ARCHITECTURE.md, "Drain"); here the store is held by another
//! connection's write transaction while the run ends.

mod support;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::mpsc;
use uuid::Uuid;

use tether::relay::arbiter::{ArbiterConfig, TerminalArbiter};
use tether::relay::grid::GridTimings;
use tether::relay::owed::Owed;
use tether::relay::{
    ArbiterId, ArbiterIdle, ArbiterLink, AttachArbiter, CaptureRun, CloseDaemon, DaemonHandle, DaemonLink,
    DaemonRequest, DetachArbiter, Heard, HostOnline, InputBacklog, Join, LifecycleEvent, NotJoined, Retire,
    SpawnTerminal, ToDaemon, ViewerOut, ViewerSink,
};
use tether::store::{sqlite::SqliteStore, ExitStatus, NewRun, NewTerminal, RunState, Store, TerminalSnapshot};

/// What the stand-ins saw.
#[derive(Debug)]
enum Seen {
    Viewer(ViewerOut),
    Attach,
    Idle,
}

/// Records what the arbiter sends a viewer.
struct ViewerStandIn(mpsc::UnboundedSender<Seen>);

impl Actor for ViewerStandIn {
    type Context = Context<Self>;
}

impl Handler<ViewerOut> for ViewerStandIn {
    type Result = ();
    fn handle(&mut self, msg: ViewerOut, _: &mut Context<Self>) {
        let _ = self.0.send(Seen::Viewer(msg));
    }
}

/// A daemon connection that records Attach and answers nothing.
struct DaemonStandIn(mpsc::UnboundedSender<Seen>);

impl Actor for DaemonStandIn {
    type Context = Context<Self>;
}

macro_rules! ignored {
    ($($message:ty),*) => {$(
        impl Handler<$message> for DaemonStandIn {
            type Result = ();
            fn handle(&mut self, _: $message, _: &mut Context<Self>) {}
        }
    )*};
}
ignored!(ToDaemon, SpawnTerminal, DetachArbiter, DaemonRequest, CloseDaemon);

impl Handler<AttachArbiter> for DaemonStandIn {
    type Result = ();
    fn handle(&mut self, _: AttachArbiter, _: &mut Context<Self>) {
        let _ = self.0.send(Seen::Attach);
    }
}

/// The registry's side: records that the arbiter asked to go, retires it.
struct RegistryStandIn(mpsc::UnboundedSender<Seen>);

impl Actor for RegistryStandIn {
    type Context = Context<Self>;
}

impl Handler<ArbiterIdle> for RegistryStandIn {
    type Result = ();
    fn handle(&mut self, msg: ArbiterIdle, _: &mut Context<Self>) {
        let _ = self.0.send(Seen::Idle);
        msg.retire.do_send(Retire);
    }
}

fn config(owed_writes: Arc<Owed>) -> ArbiterConfig {
    ArbiterConfig {
        timings: GridTimings {
            in_use: Duration::from_secs(60),
            fresh: Duration::from_secs(5),
            ping_timeout: Duration::from_millis(1500),
        },
        ring_bytes: 512 * 1024,
        soft_queue_bytes: 1024 * 1024,
        slow: Duration::from_secs(10),
        input_queue_limit: 4 * 1024 * 1024,
        run_log_max_bytes: 1024 * 1024,
        window_bytes: 256 * 1024,
        max_viewers: 256,
        owed_writes,
    }
}

/// A terminal that ran and exited 7 with a final screen, as the store has it.
async fn exited_terminal(store: &dyn Store) -> Uuid {
    let user = store.ensure_user("ann").await.expect("user");
    let host = support::store_host(store, &user, "box").await;
    let terminal = store
        .insert_terminal(
            &NewTerminal {
                user_id: user.id,
                host_id: host.id,
                title: None,
                dir: None,
                argv: vec!["sh".into(), "-c".into(), "echo hi; exit 7".into()],
                cols: 80,
                rows: 24,
                run_id: None,
            },
            None,
        )
        .await
        .expect("terminal");
    assert!(store.claim_launch(host.id, terminal.id).await.expect("launch"));
    assert!(store.mark_started(host.id, terminal.id).await.expect("started"));
    let snapshot = TerminalSnapshot { data: b"hi\r\n".to_vec(), cols: 80, rows: 24 };
    store.put_snapshot(host.id, terminal.id, &snapshot).await.expect("snapshot");
    let exit = ExitStatus { code: Some(7), signal: None };
    assert!(store.mark_exited(host.id, terminal.id, exit).await.expect("exited"));
    terminal.id
}

#[actix_rt::test]
async fn an_arbiter_started_after_the_exit_says_so_and_goes_away() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("t.db")).expect("store"));
    store.migrate().await.expect("migrate");
    let terminal_id = exited_terminal(store.as_ref()).await;

    let (seen, mut heard) = mpsc::unbounded_channel();
    let daemon = DaemonStandIn(seen.clone()).start();
    let registry = RegistryStandIn(seen.clone()).start();
    let viewer = ViewerStandIn(seen).start();
    let link = DaemonLink {
        daemon: DaemonHandle::of(&daemon, Heard::now(), None),
        queue: InputBacklog::default(),
        flow_control: true,
    };
    let id = ArbiterId::next();
    let arbiter = TerminalArbiter::new(
        terminal_id,
        id,
        config(Arc::default()),
        store.clone(),
        registry.recipient(),
        Some(HostOnline(link)),
    )
    .start();
    let joined = ArbiterLink::of(id, &arbiter)
        .join(Join {
            out: ViewerSink::actor(viewer.recipient()),
            queued: Arc::new(AtomicUsize::new(0)),
            resume_from: None,
            read_only: false,
        })
        .await;
    assert_eq!(joined, Err(NotJoined::Ended), "the viewer is told the terminal ended, not to ask again");

    let next = tokio::time::timeout(Duration::from_secs(10), heard.recv()).await;
    match next.expect("the arbiter of an ended terminal stayed").expect("stand-ins alive") {
        Seen::Idle => {}
        Seen::Attach => panic!("an ended terminal was attached"),
        Seen::Viewer(out) => panic!("a refused viewer was sent {out:?}"),
    }
}

#[actix_rt::test]
async fn a_captured_runs_end_is_owed_until_the_store_takes_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("t.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).expect("store"));
    store.migrate().await.expect("migrate");
    let user = store.ensure_user("ann").await.expect("user");
    let host = support::store_host(store.as_ref(), &user, "box").await;
    let argv: Vec<String> = vec!["sh".into(), "-c".into(), "exit 7".into()];
    let run = store
        .insert_run(&NewRun { user_id: user.id, host_id: host.id, argv: argv.clone(), dir: None }, None)
        .await
        .expect("run");
    let new = NewTerminal {
        user_id: user.id,
        host_id: host.id,
        title: None,
        dir: None,
        argv,
        cols: 80,
        rows: 24,
        run_id: Some(run.id),
    };
    let terminal = store.insert_terminal(&new, None).await.expect("terminal");
    assert!(store.claim_launch(host.id, terminal.id).await.expect("launch"));
    assert!(store.mark_started(host.id, terminal.id).await.expect("started"));

    let (seen, _heard) = mpsc::unbounded_channel();
    let daemon = DaemonStandIn(seen.clone()).start();
    let registry = RegistryStandIn(seen).start();
    let link = DaemonLink {
        daemon: DaemonHandle::of(&daemon, Heard::now(), None),
        queue: InputBacklog::default(),
        flow_control: true,
    };
    let owed = Arc::new(Owed::default());
    let arbiter = TerminalArbiter::new(
        terminal.id,
        ArbiterId::next(),
        config(owed.clone()),
        store.clone(),
        registry.recipient(),
        Some(HostOnline(link)),
    )
    .start();
    arbiter.send(CaptureRun { run_id: run.id, logged: 0, attach_id: None }).await.expect("capture");

    let holder = rusqlite::Connection::open(&path).expect("open the file");
    holder.execute_batch("BEGIN IMMEDIATE").expect("hold the store");
    let exit = ExitStatus { code: Some(7), signal: None };
    arbiter.send(LifecycleEvent::Exited { status: exit, snapshot: None }).await.expect("exited");
    assert_eq!(owed.count(), 1, "the run's end is owed while the store cannot take it");
    holder.execute_batch("ROLLBACK").expect("let the store go");
    tokio::time::timeout(Duration::from_secs(30), owed.settled()).await.expect("the run's end was stored");
    let stored = store.get_run(user.id, run.id).await.expect("read the run").expect("the run");
    assert_eq!((stored.state, stored.exit_code), (RunState::Failed, Some(7)));
}
