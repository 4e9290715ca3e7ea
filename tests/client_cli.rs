//! The everyday command line (docs/CLI.md) against a real `tether serve`
//! and a real `tether daemon` with real PTYs: `login` and where commands
//! get their server and token, `open` driven through a pseudo-terminal,
//! `run` streaming as it happens and exiting with the run's code (128+n
//! for a signal, a message for a lost run), `--json` and `--quiet` against
//! the REST resources, the run log from an offset and followers that come
//! late, list pages, id prefixes, tokens and the audit log through the
//! client, and the messages of the usual mistakes. Every request a test
//! makes itself goes through `tether::client`.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::balancer::Balancer;
use support::cli::{Person, CLI_WAIT};
use support::e2e::{self, E2e};
use tether::client::resolve::short_id;
use tether::client::viewer::{liveness, Followed, OutputFollower};
use tether::client::{AuditEvent, AuditFilter, Client, ClientError, Host, NewTerminal, NewToken, TerminalFilter};
use uuid::Uuid;

/// The user's client, through the library.
fn client(e: &E2e) -> Client {
    Client::new(&e.server.url(), &e.api.token, None).expect("client")
}

async fn the_host(client: &Client) -> Host {
    let hosts = client.hosts().await.expect("hosts");
    hosts.into_iter().find(Host::is_online).expect("an online host")
}

/// A person logged in to the e2e server.
fn logged_in(e: &E2e) -> Person {
    let person = Person::new();
    person.run(&["login", "--server", &e.server.url(), "--token", &e.api.token]).ok();
    person
}

/// `tether run --detach -- sh -c SCRIPT`: the run's id.
fn detached_run(person: &Person, host: &Host, script: &str) -> Uuid {
    let detached = person.run(&["run", &host.name, "--detach", "--", "sh", "-c", script]);
    detached.ok().trim().parse().unwrap_or_else(|_| panic!("{detached:#?}"))
}

/// Polls `check` every 50 ms until it holds; fails naming `what` after CLI_WAIT.
async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + CLI_WAIT;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_terminal_state(client: &Client, id: Uuid, state: &str) {
    eventually(&format!("terminal {id} to be {state}"), || async {
        client.terminal(id).await.expect("terminal").state == state
    })
    .await;
}

#[actix_rt::test]
async fn login_stores_a_private_config_that_later_commands_use_and_flags_beat_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let e = e2e::start(false, &[]).await;
    let host = the_host(&client(&e)).await;
    let mut person = Person::new();

    // Without a login there is nothing to talk to: a configuration error.
    person.run(&["hosts"]).fails(2, &["no server", "tether login --server URL"]);

    // The token is read from stdin when it is not given.
    let login = person.run_with_stdin(&["login", "--server", &e.server.url()], &format!("{}\n", e.api.token));
    login.ok();
    assert!(login.stderr.contains("logged in to"), "{login:#?}");
    let file = person.login_file();
    let mode = std::fs::metadata(&file).expect("login file").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "login file mode {mode:o}");
    let dir_mode = std::fs::metadata(file.parent().unwrap()).unwrap().permissions().mode() & 0o777;
    assert_eq!(dir_mode, 0o700, "config dir mode {dir_mode:o}");
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(stored["server"], e.server.url());
    assert_eq!(stored["token"], e.api.token);

    // A later command uses the stored login: no flags, no environment.
    let hosts = person.run(&["hosts"]);
    let table = hosts.ok();
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains(&host.name) && table.contains("online"), "{table}");

    // TETHER_TOKEN beats the stored token; --token beats TETHER_TOKEN.
    person.set_env("TETHER_TOKEN", "tth_not_a_real_token");
    person.run(&["hosts"]).fails(1, &["refused the token"]);
    assert!(person.run(&["hosts", "--token", &e.api.token]).ok().contains(&host.name));
    person.remove_env("TETHER_TOKEN");

    // TETHER_SERVER beats the stored server, and the stored token is never
    // sent to another server.
    person.set_env("TETHER_SERVER", "http://127.0.0.1:9");
    person.run(&["hosts"]).fails(2, &["no token for http://127.0.0.1:9"]);
    person.run(&["hosts", "--token", "tth_x"]).fails(1, &["cannot reach the tether server at http://127.0.0.1:9"]);
    // ... and --server beats TETHER_SERVER.
    assert!(person.run(&["hosts", "--server", &e.server.url()]).ok().contains(&host.name));
    person.remove_env("TETHER_SERVER");

    // A bad token is refused at login and nothing is stored over the good one.
    person.run(&["login", "--server", &e.server.url(), "--token", "tth_wrong"]).fails(1, &["refused the token"]);
    assert!(person.run(&["hosts"]).ok().contains(&host.name));

    person.run(&["logout"]).ok();
    assert!(!file.exists());
    person.run(&["hosts"]).fails(2, &["no server"]);
}

#[actix_rt::test]
async fn open_by_host_name_gives_a_shell_that_keeps_running_after_detach() {
    let e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let person = logged_in(&e);

    let mut open = person.pty(&["open", &host.name, "--dir", "/tmp"], (100, 30));
    // The arithmetic proves a shell ran it: the typed line alone does not contain 42.
    open.type_keys(b"echo round-$((6*7)) in $(pwd)\r");
    open.wait_for("round-42 in /tmp");
    open.type_keys(&[0x1d]); // Ctrl-]: detach
    assert_eq!(open.wait_exit(), 0, "{}", open.screen());
    // Its last words may still be on their way through the pty.
    open.wait_for("[detached]");

    // It is still running, sized to the window it was opened in.
    let terminals = client.terminals(&TerminalFilter::default()).await.unwrap();
    assert_eq!(terminals.len(), 1, "{terminals:?}");
    let terminal = &terminals[0];
    assert_eq!((terminal.state.as_str(), terminal.cols, terminal.rows), ("running", 100, 30));
    let short = short_id(&terminal.id);
    let ls = person.run(&["ls"]);
    let line = ls.ok().lines().find(|l| l.starts_with(&short)).unwrap_or_else(|| panic!("{ls:#?}")).to_owned();
    for column in [host.name.as_str(), "running", "100x30", "(shell)"] {
        assert!(line.contains(column), "ls line {line:?} lacks {column:?}");
    }
    assert!(person.run(&["ls", &host.name]).ok().contains(&short));

    // A running terminal cannot be removed.
    person.run(&["rm", &short[..6]]).fails(1, &["still running", &format!("tether kill {short}")]);

    // Back in by a prefix of its id: the shell is the same one.
    let mut attach = person.pty(&["attach", &short[..6]], (100, 30));
    attach.type_keys(b"echo again-$((40+2)); exit 3\r");
    attach.wait_for("again-42");
    assert_eq!(attach.wait_exit(), 1, "{}", attach.screen());
    attach.wait_for("[terminal exited with code 3]");

    wait_terminal_state(&client, terminal.id, "exited").await;
    assert!(person.run(&["ls"]).ok().contains("exited 3"));
    person.run(&["rm", &short]).ok();
    assert!(client.terminals(&TerminalFilter::default()).await.unwrap().is_empty());
}

/// A colleague with a share token attaches by the whole id the share
/// printed; a detach tells them to come back the same way (a share token
/// cannot match a short id), and a short id says why it cannot be used.
/// `--detach-key ctrl-a`: Ctrl-] is typed into the program like any key,
/// and Ctrl-A detaches, as the opening line says. A key that is not a
/// control key is a usage error.
#[actix_rt::test]
async fn another_detach_key_lets_ctrl_close_bracket_through() {
    let e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let person = logged_in(&e);

    let mut open = person.pty(&["open", &host.name, "--detach-key", "ctrl-a", "--", "cat", "-v"], (100, 30));
    open.wait_for("detach with Ctrl-A");
    eventually("cat running", || async {
        client.terminals(&TerminalFilter::default()).await.unwrap().iter().any(|t| t.state == "running")
    })
    .await;
    // cat -v shows a control byte it read as ^X: the key reached it.
    open.type_keys(b"x\x1dy\r");
    open.wait_for("x^]y");
    open.type_keys(&[0x01]); // Ctrl-A: detach
    assert_eq!(open.wait_exit(), 0, "{}", open.screen());
    open.wait_for("[detached]");
    let terminals = client.terminals(&TerminalFilter::default()).await.unwrap();
    assert_eq!(terminals[0].state, "running", "the program keeps running after the detach");

    let short = short_id(&terminals[0].id);
    person.run(&["attach", &short, "--detach-key", "alt-x"]).fails(2, &["\"alt-x\" is not a control key"]);
}

/// `tether attach` while the terminal's host is offline: it says so, holds
/// what is typed, and waits on the open socket, however long the daemon
/// takes to come back,
/// rather than exit ("[host offline]" at once for a pending terminal, or
/// after five reattach attempts for one whose daemon went away).
#[actix_rt::test]
async fn attach_waits_for_an_offline_host_to_come_back() {
    let mut e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let person = logged_in(&e);
    e.daemon.kill();
    eventually("the host offline", || async { !client.host(host.id).await.expect("host").is_online() }).await;
    let new = NewTerminal { host_id: host.id, argv: vec!["sh".into()], ..Default::default() };
    let pending = client.create_terminal(&new).await.expect("a pending terminal");
    assert_eq!(pending.state, "pending");

    let mut attach = person.pty(&["attach", &short_id(&pending.id)], (100, 30));
    attach.wait_for("[host offline; waiting for it to come back]");
    // Typed while the host is offline: held, and sent once the shell runs
    // (the server refuses input until then).
    attach.type_keys(b"echo held-$((6*7))\r");
    let state_dir = e.dir.path().join("state");
    e.daemon = support::daemon::DaemonProcess::start(&e.server, &e.api.token, &state_dir);
    wait_terminal_state(&client, pending.id, "running").await;
    attach.wait_for("held-42");
    attach.type_keys(b"echo back-$((40+2))\r");
    attach.wait_for("back-42");

    // The daemon goes away under a live attach: the socket closes 4503,
    // the reattach finds the host offline, and attach waits past the five
    // attempts' back-off it used to give up after (about 8 s).
    e.daemon.kill();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!attach.exited(), "attach gave up while the host was away:\n{}", attach.screen());
    e.daemon = support::daemon::DaemonProcess::start(&e.server, &e.api.token, &state_dir);
    // The shell ended with its daemon: the new one says so, and attach ends
    // with the terminal rather than giving up.
    assert_eq!(attach.wait_exit(), 1, "{}", attach.screen());
    assert!(!attach.screen().contains("gave up"), "{}", attach.screen());
    wait_terminal_state(&client, pending.id, "exited").await;
}

/// A balancer in front of the e2e server (on a thread of its own, so the
/// test may block on a PTY) and a person logged in through it.
fn logged_in_through_a_balancer(e: &E2e) -> (Balancer, Person) {
    let balancer = Balancer::start_on_own_thread(e.server.listen_addr());
    let person = Person::new();
    person.run(&["login", "--server", &balancer.url(), "--token", &e.api.token]).ok();
    (balancer, person)
}

/// `tether open` of a shell on the e2e host through a balancer, once it
/// echoed `before-6`.
async fn shell_through_a_balancer(e: &E2e) -> (Balancer, Person, support::cli::Pty) {
    let host = the_host(&client(e)).await;
    let (balancer, person) = logged_in_through_a_balancer(e);
    let mut open = person.pty(&["open", &host.name], (100, 30));
    open.type_keys(b"echo before-$((2*3))\r");
    open.wait_for("before-6");
    (balancer, person, open)
}

/// A connection that silently stops (a balancer freezes it: open, nothing
/// forwarded) is given up once a ping goes unanswered, and attach goes on
/// in the same shell on a new connection, with nothing shown twice.
#[actix_rt::test]
async fn attach_gives_up_a_frozen_connection_and_goes_on() {
    let e = e2e::start(false, &[]).await;
    let (balancer, _person, mut open) = shell_through_a_balancer(&e).await;
    assert_eq!(e2e::metric(&e.api, "tether_viewer_connections").await, Some(1.0));
    balancer.stall();
    // The frozen connection stays open on the server; the new one joins it.
    let deadline = Instant::now() + liveness::QUIET + liveness::ANSWER + CLI_WAIT;
    while e2e::metric(&e.api, "tether_viewer_connections").await < Some(2.0) {
        assert!(Instant::now() < deadline, "attach did not reconnect:\n{}", open.screen());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    open.type_keys(b"echo after-$((40+2))\r");
    open.wait_for("after-42");
    let screen = open.screen();
    assert_eq!(screen.matches("before-6").count(), 1, "shown twice after the reattach:\n{screen}");
    assert!(!open.exited(), "{screen}");
}

/// The server out of reach for longer than five reattach attempts take
/// (about 8 s of back-off against a refused connection): attach says it is
/// reconnecting and keeps trying, the keys typed meanwhile are held, and
/// once the server answers again they run in the same shell.
#[actix_rt::test]
async fn attach_waits_out_a_server_out_of_reach_and_sends_what_was_typed() {
    let e = e2e::start(false, &[]).await;
    let (balancer, _person, mut open) = shell_through_a_balancer(&e).await;
    let outage = balancer.outage(Duration::from_secs(16));
    let typing = async {
        tokio::time::sleep(Duration::from_secs(4)).await;
        open.type_keys(b"echo during-$((6*7))\r");
    };
    futures_util::future::join(outage, typing).await;
    assert!(!open.exited(), "attach gave up while the server was out of reach:\n{}", open.screen());
    open.wait_for("[connection to the server lost; reconnecting");
    open.wait_for("during-42");
    open.type_keys(b"echo after-$((40+2))\r");
    open.wait_for("after-42");
}

/// The output follower (what `tether run` and `tether logs --follow` read
/// with) gives up a frozen connection the same way and goes on from the
/// next byte: every line once, in order.
#[actix_rt::test]
async fn a_follower_gives_up_a_frozen_connection_and_goes_on() {
    let e = e2e::start(false, &[]).await;
    let direct = client(&e);
    let host = the_host(&direct).await;
    let script = e2e::ticks_script("0.1");
    let new = NewTerminal { host_id: host.id, argv: vec!["sh".into(), "-c".into(), script], ..Default::default() };
    let terminal = direct.create_terminal(&new).await.expect("a terminal");
    wait_terminal_state(&direct, terminal.id, "running").await;
    let balancer = Balancer::start(e.server.listen_addr()).await;
    let through = Client::new(&balancer.url(), &e.api.token, None).expect("client");
    let mut follower = OutputFollower::new(through, terminal.id.to_string(), 0);
    let mut text = String::new();
    read_until(&mut follower, &mut text, "tick-3\r\n").await;
    balancer.stall();
    // 25 s of ticks: past the watchdog's 20 s.
    read_until(&mut follower, &mut text, "tick-250\r\n").await;
    let ticks: Vec<&str> = text.lines().map(str::trim_end).filter(|l| l.starts_with("tick-")).collect();
    let expected: Vec<String> = (1..=ticks.len()).map(|n| format!("tick-{n}")).collect();
    assert_eq!(ticks, expected, "every tick once, in order");
}

/// Reads `follower`'s output into `text` until it holds `line`, within the
/// watchdog's time and the usual wait.
async fn read_until(follower: &mut OutputFollower, text: &mut String, line: &str) {
    let deadline = Instant::now() + liveness::QUIET + liveness::ANSWER + CLI_WAIT;
    while !text.contains(line) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, follower.next()).await {
            Ok(Ok(Some(Followed::Output { data, .. }))) => text.push_str(&String::from_utf8_lossy(&data)),
            Ok(other) => panic!("the stream ended with {other:?} before {line:?}:\n{text}"),
            Err(_) => panic!("no {line:?} in time:\n{text}"),
        }
    }
}

#[actix_rt::test]
async fn a_share_token_attaches_by_the_whole_id_and_is_told_so() {
    let e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let owner = logged_in(&e);
    let opened = owner.run(&["open", &host.name, "-q", "--", "cat"]);
    let id: Uuid = opened.ok().trim().parse().unwrap_or_else(|_| panic!("{opened:#?}"));
    wait_terminal_state(&client, id, "running").await;
    let shared = owner.run(&["share", &id.to_string()]);
    let token = shared.ok().trim().to_owned();

    let mut colleague = Person::new();
    colleague.set_env("TETHER_TOKEN", &token);
    colleague.set_env("TETHER_SERVER", &e.server.url());
    let mut attach = colleague.pty(&["attach", &id.to_string()], (80, 24));
    attach.wait_for("read-only");
    attach.type_keys(&[0x1d]); // Ctrl-]: detach
    assert_eq!(attach.wait_exit(), 0, "{}", attach.screen());
    attach.wait_for(&format!("come back with `tether attach {id}`"));
    colleague.run(&["attach", &short_id(&id)]).fails(1, &["give the whole id"]);
}

#[actix_rt::test]
async fn run_streams_output_while_running_and_exits_with_the_runs_code() {
    let e = e2e::start(false, &[]).await;
    let host = the_host(&client(&e)).await;
    let person = logged_in(&e);

    let plain = person.run(&["run", &host.name, "--", "sh", "-c", "echo hi; exit 7"]);
    assert_eq!(plain.code, Some(7), "{plain:#?}");
    assert_eq!(plain.stdout, "hi\r\n", "{plain:#?}");

    // `hi` shows while the command still runs, not after it ended.
    let mut live =
        person.spawn(&["run", &host.name, "--dir", "/tmp", "--", "sh", "-c", "echo hi; sleep 3; pwd; exit 7"]);
    live.wait_for_stdout("hi", CLI_WAIT);
    assert!(!live.exited(), "tether run ended before the command did");
    let done = live.wait(CLI_WAIT);
    assert_eq!(done.code, Some(7), "{done:#?}");
    assert_eq!(done.stdout, "hi\r\n/tmp\r\n");

    // Ctrl-C goes to the command; a second one would stop watching.
    let trapping = "trap 'echo got-int; exit 5' INT; echo ready; sleep 30 & wait";
    let interrupted = person.spawn(&["run", &host.name, "--", "sh", "-c", trapping]);
    interrupted.wait_for_stdout("ready", CLI_WAIT);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(interrupted.child.id() as libc::pid_t, libc::SIGINT) };
    let done = interrupted.wait(CLI_WAIT);
    assert_eq!((done.code, done.stdout.as_str()), (Some(5), "ready\r\ngot-int\r\n"), "{done:#?}");

    // Killed by a signal: 128 + the signal's number.
    let killed = person.run(&["run", &host.name, "--", "sh", "-c", "kill -KILL $$"]);
    killed.fails(137, &["killed by signal 9"]);

    // --detach prints the id at once; logs shows the output; runs lists it.
    let detached = person.run(&["run", &host.name, "--detach", "--", "sh", "-c", "echo detached-output"]);
    let run_id = detached.ok().trim().to_owned();
    let run_id = Uuid::parse_str(&run_id).unwrap_or_else(|_| panic!("{detached:#?}"));
    let followed = person.run(&["logs", "--follow", &short_id(&run_id)]);
    assert_eq!(followed.ok(), "detached-output\r\n");
    assert_eq!(person.run(&["logs", &run_id.to_string()]).ok(), "detached-output\r\n");
    let runs = person.run(&["runs"]);
    let line = runs.ok().lines().find(|l| l.starts_with(&short_id(&run_id))).expect("run listed").to_owned();
    assert!(line.contains("succeeded") && line.contains("sh -c echo detached-output"), "{line}");

    // logs exits 0 once it wrote the log, however the run ended (CLI.md).
    let failing = detached_run(&person, &host, "echo failing-output; exit 3");
    assert_eq!(person.run(&["logs", "--follow", &short_id(&failing)]).ok(), "failing-output\r\n");
}

/// `tether run` and `tether logs --follow` ride out a server they cannot
/// reach (a balancer refusing connections for 8 s, as during a restart)
/// and end as the run does, every line once. They used to give up after
/// five quick reconnects, about 2.5 s, and exit 1 while the run went on.
#[actix_rt::test]
async fn run_and_follow_ride_out_a_server_out_of_reach() {
    let e = e2e::start(false, &[]).await;
    let host = the_host(&client(&e)).await;
    let (balancer, person) = logged_in_through_a_balancer(&e);
    let script = "for i in $(seq 1 40); do echo r$i; sleep 0.25; done; exit 3";
    let detached = detached_run(&person, &host, script);
    let following = person.spawn(&["logs", "--follow", &short_id(&detached)]);
    let running = person.spawn(&["run", &host.name, "--", "sh", "-c", script]);
    following.wait_for_stdout("r2\r\n", CLI_WAIT);
    running.wait_for_stdout("r2\r\n", CLI_WAIT);
    balancer.outage(Duration::from_secs(8)).await;
    let expected: String = (1..=40).map(|i| format!("r{i}\r\n")).collect();
    let done = running.wait(Duration::from_secs(60));
    assert_eq!((done.code, done.stdout.as_str()), (Some(3), expected.as_str()), "{done:#?}");
    let followed = following.wait(Duration::from_secs(60));
    assert_eq!((followed.code, followed.stdout.as_str()), (Some(0), expected.as_str()), "{followed:#?}");
}

#[actix_rt::test]
async fn run_of_ten_megabytes_streams_all_of_it_in_order() {
    let e = e2e::start(false, &[]).await;
    let host = the_host(&client(&e)).await;
    let person = logged_in(&e);
    // 1..=1_300_000, one a line: 9.9 MB, 11.2 MB with the PTY's CR LF.
    let last = 1_300_000u32;
    let running = person.spawn(&["run", &host.name, "--", "seq", "1", &last.to_string()]);
    let done = running.wait(Duration::from_secs(180));
    assert_eq!(done.code, Some(0), "stderr: {}", done.stderr);
    assert!(!done.stderr.contains("missing"), "stderr: {}", done.stderr);
    let mut expected = 1u32;
    for line in done.stdout.split_terminator("\r\n") {
        assert_eq!(line, expected.to_string(), "line {expected} of the output is out of order or missing");
        expected += 1;
    }
    assert_eq!(expected, last + 1, "the output stopped after {} lines", expected - 1);
    assert!(done.stdout.len() > 10_000_000, "{} bytes", done.stdout.len());
}

/// `logs --follow` on a run that printed more than the daemon's ring holds
/// before anyone watched: the server can only replay from later on, the
/// stretch before comes from the run's log, and nothing is doubled.
#[actix_rt::test]
async fn a_late_follower_gets_the_early_output_from_the_log_and_the_rest_live() {
    let e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let person = logged_in(&e);
    // 250,000 lines are 1.9 MB with CR LF: four times the 512 KiB ring.
    let script = "seq 1 250000; sleep 3; echo tail";
    let run_id = detached_run(&person, &host, script);
    eventually("the first lines in the run's log", || async {
        client.run_log(run_id).await.map(|log| log.len() > 1_800_000).unwrap_or(false)
    })
    .await;
    assert!(!client.run(run_id).await.unwrap().is_final(), "the run ended before the follower came");
    let followed = person.run(&["logs", "--follow", &short_id(&run_id)]);
    let mut lines = followed.ok().split_terminator("\r\n");
    for n in 1..=250_000u32 {
        assert_eq!(lines.next(), Some(n.to_string().as_str()), "line {n}");
    }
    assert_eq!(lines.next(), Some("tail"));
    assert_eq!(lines.next(), None);
    assert!(!followed.stderr.contains("missing"), "{}", followed.stderr);
}

/// `--json` prints the API's resources as they are, `--quiet` their ids.
#[actix_rt::test]
async fn json_output_is_the_rest_resources() {
    let e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let person = logged_in(&e);
    let run = person.run(&["run", &host.name, "--detach", "--json", "--", "true"]);
    let run: Value = serde_json::from_str(run.ok()).expect("run --detach --json");
    let run_id = run["run"]["id"].as_str().expect("run id").to_owned();
    let terminal = client
        .create_terminal(&NewTerminal {
            host_id: host.id,
            argv: vec!["sleep".into(), "60".into()],
            dir: Some("/tmp".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_terminal_state(&client, terminal.id, "running").await;
    let run_uuid: Uuid = run_id.parse().unwrap();
    eventually("the run to finish", || async { client.run(run_uuid).await.unwrap().is_final() }).await;

    for (args, path) in [
        (vec!["hosts", "--json"], "/api/v1/hosts"),
        (vec!["ls", "--json"], "/api/v1/terminals"),
        (vec!["runs", "--json"], "/api/v1/runs"),
    ] {
        // A host's lastSeenAt may move between the two reads: try again then.
        let mut attempts = 0;
        loop {
            let printed: Value = serde_json::from_str(person.run(&args).ok()).expect("valid JSON");
            let rest = client.get_json(path).await.unwrap();
            if printed == rest || attempts == 3 {
                assert_eq!(printed, rest, "tether {args:?} differs from GET {path}");
                break;
            }
            attempts += 1;
        }
    }
    // The run's terminal is a terminal too.
    let all: String =
        client.terminals(&TerminalFilter::default()).await.unwrap().iter().map(|t| format!("{}\n", t.id)).collect();
    assert!(all.contains(&terminal.id.to_string()));
    assert_eq!(person.run(&["ls", "-q"]).ok(), all);
    assert_eq!(person.run(&["hosts", "--quiet"]).ok(), format!("{}\n", host.id));
    let single = client.get_json(&format!("/api/v1/runs/{run_id}")).await.unwrap();
    assert_eq!(single["run"]["hostId"], run["run"]["hostId"]);
    assert_eq!(single["run"]["argv"], run["run"]["argv"]);

    // Colours on a terminal only, and never with NO_COLOR.
    let mut on_a_terminal = person.pty(&["hosts"], (120, 30));
    assert_eq!(on_a_terminal.wait_exit(), 0);
    on_a_terminal.wait_for("\x1b[32monline\x1b[0m");
    let mut plain = Person::new();
    plain.set_env("NO_COLOR", "1");
    plain.set_env("TETHER_SERVER", &e.server.url());
    plain.set_env("TETHER_TOKEN", &e.api.token);
    let mut no_color = plain.pty(&["hosts"], (120, 30));
    assert_eq!(no_color.wait_exit(), 0);
    no_color.wait_for(&host.name);
    assert!(!no_color.screen().contains("\x1b["), "{:?}", no_color.screen());
    assert!(!person.run(&["hosts"]).ok().contains('\x1b'), "colours in a pipe");

    // kill by prefix with a signal name; ls shows how it ended.
    let short = short_id(&terminal.id);
    person.run(&["kill", &short[..5], "--signal", "KILL"]).ok();
    wait_terminal_state(&client, terminal.id, "exited").await;
    assert_eq!(client.terminal(terminal.id).await.unwrap().exit_signal, Some(9));
    let ls = person.run(&["ls"]);
    assert!(ls.ok().lines().any(|l| l.starts_with(&short) && l.contains("exited sig9")), "{ls:#?}");
    person.run(&["kill", &short]).fails(1, &["is exited, not running"]);
}

/// `--json` and `--quiet` on the commands that act on one thing: `open`
/// (started and printed, not attached), `kill`, `rm`, `run` and `logs`.
#[actix_rt::test]
async fn json_and_quiet_on_open_kill_rm_run_and_logs() {
    let e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let person = logged_in(&e);

    // open --json: the new terminal as the API sent it, no attach.
    let opened = person.run(&["open", &host.name, "--json", "--dir", "/tmp", "--", "sleep", "60"]);
    let opened: Value = serde_json::from_str(opened.ok()).expect("open --json");
    let id: Uuid = opened["terminal"]["id"].as_str().expect("terminal id").parse().unwrap();
    assert_eq!(opened["terminal"]["hostId"], host.id.to_string());
    assert_eq!(opened["terminal"]["argv"], serde_json::json!(["sleep", "60"]));
    assert_eq!(opened["terminal"]["dir"], "/tmp");
    wait_terminal_state(&client, id, "running").await;
    let quiet = person.run(&["open", &host.name, "-q", "--", "sleep", "60"]);
    let quiet_id: Uuid = quiet.ok().trim().parse().unwrap_or_else(|_| panic!("{quiet:#?}"));
    assert!(quiet.stderr.is_empty(), "{quiet:#?}");
    wait_terminal_state(&client, quiet_id, "running").await;

    // kill --json: the terminal as the kill's answer has it; -q its id.
    let killed = person.run(&["kill", &short_id(&id), "--json", "-s", "KILL"]);
    let killed: Value = serde_json::from_str(killed.ok()).expect("kill --json");
    assert_eq!(killed["terminal"]["id"], id.to_string());
    assert_eq!(killed["terminal"]["state"], "running", "the row stays running until the real exit");
    let killed_quietly = person.run(&["kill", &short_id(&quiet_id), "-q", "-s", "KILL"]);
    assert_eq!(killed_quietly.ok(), format!("{quiet_id}\n"));
    assert!(killed_quietly.stderr.is_empty(), "{killed_quietly:#?}");
    wait_terminal_state(&client, id, "exited").await;
    wait_terminal_state(&client, quiet_id, "exited").await;

    // rm --json: the terminal as it was just before it went.
    let before = client.get_json(&format!("/api/v1/terminals/{id}")).await.unwrap();
    let removed = person.run(&["rm", &short_id(&id), "--json"]);
    assert_eq!(serde_json::from_str::<Value>(removed.ok()).expect("rm --json"), before);
    assert!(client.terminal(id).await.unwrap_err().is_not_found());
    assert_eq!(person.run(&["rm", &quiet_id.to_string(), "--quiet"]).ok(), format!("{quiet_id}\n"));

    // run --json: the finished run and its output; the exit code still passes through.
    let ran = person.run(&["run", &host.name, "--json", "--", "sh", "-c", "echo json-run; exit 3"]);
    assert_eq!(ran.code, Some(3), "{ran:#?}");
    let ran: Value = serde_json::from_str(&ran.stdout).expect("run --json");
    assert_eq!(ran["log"], "json-run\r\n");
    assert_eq!((ran["run"]["state"].as_str(), ran["run"]["exitCode"].as_i64()), (Some("failed"), Some(3)));
    let run_id = ran["run"]["id"].as_str().expect("run id").to_owned();
    let rest = client.get_json(&format!("/api/v1/runs/{run_id}")).await.unwrap();
    assert_eq!(ran["run"], rest["run"], "run --json prints the run resource as it is");

    // logs --json, and logs -q: the output alone.
    let logged: Value = serde_json::from_str(person.run(&["logs", "--json", &run_id[..6]]).ok()).expect("logs --json");
    assert_eq!(logged, serde_json::json!({ "run": rest["run"], "log": "json-run\r\n" }));
    let quiet_logs = person.run(&["logs", "-q", "--follow", &run_id]);
    assert_eq!(quiet_logs.ok(), "json-run\r\n");
    assert!(quiet_logs.stderr.is_empty(), "{quiet_logs:#?}");
    let quiet_run = person.run(&["run", &host.name, "-q", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!((quiet_run.code, quiet_run.stderr.as_str()), (Some(143), ""), "{quiet_run:#?}");
}

/// `tether kill ID` without `--signal` ends an interactive shell: it sends
/// HUP, as closing a terminal does. It used to send TERM, which an
/// interactive bash ignores, so the shell ran on.
#[actix_rt::test]
async fn kill_without_a_signal_ends_an_interactive_shell() {
    let e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let person = logged_in(&e);
    let opened = person.run(&["open", &host.name, "-q", "--", "bash", "-i"]);
    let id: Uuid = opened.ok().trim().parse().unwrap_or_else(|_| panic!("{opened:#?}"));
    wait_terminal_state(&client, id, "running").await;
    let killed = person.run(&["kill", &id.to_string()]);
    assert!(killed.stderr.contains("sent HUP"), "{killed:#?}");
    wait_terminal_state(&client, id, "exited").await;
    assert_eq!(client.terminal(id).await.expect("terminal").exit_signal, Some(1));

    // Someone attached is told which signal ended it.
    let opened = person.run(&["open", &host.name, "-q", "--", "bash", "-i"]);
    let id: Uuid = opened.ok().trim().parse().unwrap_or_else(|_| panic!("{opened:#?}"));
    wait_terminal_state(&client, id, "running").await;
    let mut attach = person.pty(&["attach", &id.to_string()], (80, 24));
    attach.type_keys(b"echo up-$((1+1))\r");
    attach.wait_for("up-2");
    person.run(&["kill", &id.to_string(), "--signal", "KILL"]).ok();
    assert_eq!(attach.wait_exit(), 1, "{}", attach.screen());
    attach.wait_for("[terminal killed by SIGKILL]");
}

/// A run ended by a signal says which (`exitSignal`) and `tether run`
/// exits 128+n; a run lost with its host says so and exits 1.
#[actix_rt::test]
async fn signals_and_lost_runs_are_reported() {
    let mut e = e2e::start(false, &[("TETHER_SWEEP__INTERVAL_MS", "200"), ("TETHER_RUNS__LOST_AFTER", "1500")]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let person = logged_in(&e);

    let run_id = detached_run(&person, &host, "kill -TERM $$");
    eventually("the run to finish", || async { client.run(run_id).await.unwrap().is_final() }).await;
    let rest = client.get_json(&format!("/api/v1/runs/{run_id}")).await.unwrap();
    assert_eq!(rest["run"]["exitSignal"], 15, "{rest}");
    assert_eq!(rest["run"]["exitCode"], Value::Null, "{rest}");
    assert_eq!(client.run(run_id).await.unwrap().exit_signal(), Some(15));
    let listed = client.get_json("/api/v1/runs").await.unwrap();
    let listed = listed["runs"].as_array().unwrap().iter().find(|r| r["id"] == run_id.to_string()).cloned();
    assert_eq!(listed.map(|r| r["exitSignal"].clone()), Some(Value::from(15)));
    // `tether runs` shows it as `ls` shows a terminal a signal ended.
    let table = person.run(&["runs"]).ok().to_owned();
    let row = table.lines().find(|l| l.starts_with(&short_id(&run_id))).unwrap_or_else(|| panic!("{table}"));
    assert!(row.split_whitespace().any(|cell| cell == "sig15"), "{row}");
    person.run(&["run", &host.name, "--", "sh", "-c", "kill -HUP $$"]).fails(129, &["killed by signal 1"]);
    let plain = client.get_json(&format!("/api/v1/runs/{}", person_last_run(&client).await)).await.unwrap();
    assert_eq!(plain["run"]["exitSignal"], 1);
    // A command that cannot start: the reason on stderr, nothing on stdout.
    let refused = person.run(&["run", &host.name, "--", "/nonexistent/cmd"]);
    assert_eq!(refused.stdout, "", "{refused:#?}");
    refused.fails(1, &["cannot start /nonexistent/cmd"]);

    // The host goes away for good while the run runs.
    let running = person.spawn(&["run", &host.name, "--", "sh", "-c", "echo started; sleep 120"]);
    running.wait_for_stdout("started", CLI_WAIT);
    e.daemon.kill();
    let lost = running.wait(Duration::from_secs(60));
    lost.fails(1, &["was lost", &format!("host {} went away", host.name), "tether logs"]);
    assert_eq!(lost.stdout, "started\r\n");
}

/// The id of the newest run.
async fn person_last_run(client: &Client) -> Uuid {
    client.runs().await.unwrap().last().expect("a run").id
}

/// `GET /runs/{id}/log?from=N`: the bytes from N, where the log ends and
/// whether it will grow; a bad offset is refused.
#[actix_rt::test]
async fn the_run_log_reads_from_an_offset() {
    let e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let run = client
        .create_run(&tether::client::NewRun {
            host_id: host.id,
            argv: vec!["sh".into(), "-c".into(), "echo one; sleep 2; echo two".into()],
            dir: None,
        })
        .await
        .unwrap();
    eventually("the first line in the log", || async { client.run_log(run.id).await.unwrap().len() >= 5 }).await;
    let growing = client.run_log_from(run.id, 0).await.unwrap();
    assert_eq!((&growing.data[..], growing.next_offset, growing.complete), (&b"one\r\n"[..], 5, false));
    eventually("the run to finish", || async { client.run(run.id).await.unwrap().is_final() }).await;
    let rest = client.run_log_from(run.id, 3).await.unwrap();
    assert_eq!((&rest.data[..], rest.next_offset, rest.complete), (&b"\r\ntwo\r\n"[..], 10, true));
    let beyond = client.run_log_from(run.id, 1000).await.unwrap();
    assert_eq!((beyond.data.len(), beyond.next_offset, beyond.complete), (0, 10, true));
    for bad in ["-1", "abc", "1.5"] {
        let err = client.get_json(&format!("/api/v1/runs/{}/log?from={bad}", run.id)).await.unwrap_err();
        assert_eq!(err.code(), Some("bad_offset"), "{bad}: {err}");
    }
}

/// A follower that comes after more was printed than both the daemon's
/// ring and the run's log hold: the log's part, a note on the hole, then
/// the stream from where the server has it; nothing twice, in order.
#[actix_rt::test]
async fn a_late_follower_past_the_log_limit_says_what_is_missing() {
    let e = e2e::start(false, &[("TETHER_RUNS__LOG_MAX_BYTES", "100000")]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let person = logged_in(&e);
    let script = "seq 1 250000; sleep 3; echo tail";
    let run_id = detached_run(&person, &host, script);
    eventually("a full log", || async {
        client.run_log_from(run_id, 0).await.map(|log| log.complete).unwrap_or(false)
    })
    .await;
    // Past the log's end and the ring, still before the tail.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!client.run(run_id).await.unwrap().is_final(), "the run ended before the follower came");
    let followed = person.run(&["logs", "--follow", &short_id(&run_id)]);
    let expected: String = (1..=250_000).map(|n| format!("{n}\r\n")).chain(["tail\r\n".to_owned()]).collect();
    let out = followed.ok();
    assert_eq!(&out[..100_000], &expected[..100_000], "the log's part");
    let missing = expected.len() - out.len();
    assert!(missing > 0, "{} bytes printed", out.len());
    assert!(expected.ends_with(&out[100_000..]), "after the hole, the stream's part in order");
    assert!(followed.stderr.contains(&format!("{missing} bytes of output were not kept")), "{followed:#?}");

    // Once the run is over, `tether logs` prints the log and says what the
    // log does not hold, from the run's count of its output.
    eventually("the run to finish", || async { client.run(run_id).await.unwrap().is_final() }).await;
    let stored = person.run(&["logs", &short_id(&run_id)]);
    assert_eq!(stored.ok(), &expected[..100_000]);
    let dropped = expected.len() - 100_000;
    assert!(stored.stderr.contains(&format!("{dropped} bytes of output were not kept")), "{stored:#?}");
}

/// `tether run` whose stdout is read too slowly: the server closes its
/// stream (1008, too slow a reader), the rest comes from the run's log,
/// and what the log did not keep is named on stderr. The command used to
/// end with the log's part, saying nothing of the rest.
#[actix_rt::test]
async fn a_run_read_too_slowly_says_what_is_missing() {
    let settings = [
        ("TETHER_RUNS__LOG_MAX_BYTES", "100000"),
        ("TETHER_VIEWER__QUEUE_BYTES", "262144"),
        ("TETHER_DAEMON__WINDOW_BYTES", "65536"),
        ("TETHER_VIEWER__SLOW_MS", "500"),
    ];
    let e = e2e::start(false, &settings).await;
    let host = the_host(&client(&e)).await;
    let person = logged_in(&e);
    // 7.9 MB with CR LF: more than the pipes and sockets on the way hold.
    let last = 1_000_000;
    let ran = person.run_read_late(&["run", &host.name, "--", "seq", "1", &last.to_string()], Duration::from_secs(6));
    let expected: String = (1..=last).map(|n| format!("{n}\r\n")).collect();
    let out = ran.ok();
    // Each hole the command skipped is named, in order, with its size.
    let holes: Vec<usize> = ran
        .stderr
        .lines()
        .filter_map(|line| {
            line.trim()
                .strip_prefix("tether: ")?
                .strip_suffix(" bytes of output were not kept (past runs.log_max_bytes) and are missing here")
        })
        .map(|n| n.parse().expect("a byte count"))
        .collect();
    assert!(!holes.is_empty(), "the reader was never too slow: all {} bytes came; {}", out.len(), ran.stderr);
    assert_eq!(holes.iter().sum::<usize>(), expected.len() - out.len(), "every missing byte is named: {}", ran.stderr);
    assert_eq!(&out[..100_000], &expected[..100_000], "the log's part");
    assert_eq!(without_holes(&expected, out, &holes), Ok(()), "the rest in order, nothing twice");
}

/// Whether `out` is `expected` with a stretch of each size in `holes` left
/// out, in order. A stretch starts where the two first differ, or a few
/// bytes before, where bytes after the hole happen to repeat the ones it
/// took out.
fn without_holes(expected: &str, out: &str, holes: &[usize]) -> Result<(), String> {
    let (expected, out) = (expected.as_bytes(), out.as_bytes());
    let (mut i, mut j) = (0, 0);
    for &hole in holes {
        while i < out.len() && j < expected.len() && out[i] == expected[j] {
            (i, j) = (i + 1, j + 1);
        }
        let fits = |back: usize| {
            let after = &expected[(j - back + hole).min(expected.len())..];
            let rest = &out[i - back..];
            after.starts_with(&rest[..rest.len().min(64)])
        };
        let back = (0..=i.min(j).min(32)).find(|&back| fits(back)).ok_or(format!("no hole of {hole} at {j}"))?;
        (i, j) = (i - back, j - back + hole);
    }
    if out[i..] == expected[j..] {
        Ok(())
    } else {
        Err(format!("after the holes, out[{i}..] is not expected[{j}..]"))
    }
}

/// Lists come in pages (`limit`, `after`, `nextCursor`) and hosts filter
/// by state; the client follows the pages.
#[actix_rt::test]
async fn lists_are_paginated_and_the_client_follows_the_pages() {
    let e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let mut created = Vec::new();
    for n in 0..7 {
        let run = tether::client::NewRun { host_id: host.id, argv: vec!["echo".into(), n.to_string()], dir: None };
        created.push(client.create_run(&run).await.unwrap().id.to_string());
    }
    let mut seen = Vec::new();
    let mut path = "/api/v1/runs?limit=3".to_owned();
    let mut pages = 0;
    loop {
        let page = client.get_json(&path).await.unwrap();
        let items = page["runs"].as_array().unwrap();
        assert!(items.len() <= 3, "{page}");
        seen.extend(items.iter().map(|r| r["id"].as_str().unwrap().to_owned()));
        pages += 1;
        match page["nextCursor"].as_str() {
            Some(cursor) => path = format!("/api/v1/runs?limit=3&after={cursor}"),
            None => break,
        }
    }
    assert_eq!((pages, &seen), (3, &created), "every run once, in creation order");
    assert_eq!(client.runs().await.unwrap().len(), 7);
    let terminals = client.get_json("/api/v1/terminals?limit=1").await.unwrap();
    assert!(terminals["terminals"].as_array().unwrap().len() <= 1);

    let online = client.get_json("/api/v1/hosts?state=online").await.unwrap();
    assert_eq!(online["hosts"].as_array().unwrap().len(), 1);
    assert!(online.get("nextCursor").is_none());
    let offline = client.get_json("/api/v1/hosts?state=offline").await.unwrap();
    assert_eq!(offline["hosts"], serde_json::json!([]));
    for (path, code) in [
        ("/api/v1/hosts?state=gone", "invalid_state"),
        ("/api/v1/runs?limit=0", "bad_limit"),
        ("/api/v1/terminals?limit=5001", "bad_limit"),
        ("/api/v1/hosts?after=nonsense", "bad_cursor"),
    ] {
        let err = client.get_json(path).await.unwrap_err();
        assert_eq!(err.code(), Some(code), "{path}: {err}");
    }
}

#[actix_rt::test]
async fn unknown_and_ambiguous_names_and_prefixes_are_explained() {
    let e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let person = logged_in(&e);

    // Two hosts with one name, never online: their terminals stay pending.
    let twin_a = client.register_host("twin", "twin-a", "linux", "x86_64").await.unwrap();
    let twin_b = client.register_host("twin", "twin-b", "linux", "x86_64").await.unwrap();
    let ambiguous = person.run(&["ls", "twin"]);
    ambiguous.fails(1, &["\"twin\" matches 2 hosts", &short_id(&twin_a.id), &short_id(&twin_b.id)]);
    person.run(&["ls", "nosuchhost"]).fails(1, &["no host matches \"nosuchhost\"", &host.name, "twin"]);
    // An id prefix picks one of them.
    assert!(person.run(&["ls", &short_id(&twin_a.id)]).ok().starts_with("ID"));

    // Seventeen ids: two of them share a first hex digit.
    let mut ids = Vec::new();
    for _ in 0..17 {
        let new = NewTerminal { host_id: twin_a.id, ..Default::default() };
        ids.push(client.create_terminal(&new).await.unwrap().id);
    }
    let digit = (0..16u32)
        .map(|d| char::from_digit(d, 16).unwrap())
        .find(|d| ids.iter().filter(|id| short_id(id).starts_with(*d)).count() >= 2)
        .expect("pigeonhole");
    let sharing: Vec<String> = ids.iter().map(short_id).filter(|s| s.starts_with(digit)).collect();
    let ambiguous = person.run(&["attach", &digit.to_string()]);
    let needles: Vec<&str> = sharing.iter().map(String::as_str).collect();
    ambiguous.fails(1, &[&format!("matches {} terminals", sharing.len())]);
    ambiguous.fails(1, &needles);
    person.run(&["kill", "ffffffff0"]).fails(1, &["no terminal matches \"ffffffff0\""]);
    person.run(&["rm", "not-hex"]).fails(1, &["no terminal matches \"not-hex\""]);
    person.run(&["logs", "0000"]).fails(1, &["no run matches \"0000\""]);
    // The short id from `ls` works as well as the whole id.
    person.run(&["rm", &short_id(&ids[0])]).ok();
}

#[actix_rt::test]
async fn every_usual_mistake_gets_a_message_that_says_what_to_fix() {
    let mut e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;
    let person = Person::new();
    let url = e.server.url();
    let token = e.api.token.clone();

    // Wrong server URL: nothing listening, or not a tether server.
    let nothing = format!("http://127.0.0.1:{}", support::free_port());
    person
        .run(&["hosts", "--server", &nothing, "--token", &token])
        .fails(1, &["cannot reach the tether server at", &nothing]);
    let wrong_path = format!("{url}/not-tether");
    person
        .run(&["hosts", "--server", &wrong_path, "--token", &token])
        .fails(1, &["does not look like a tether server", "HTTP 404"]);
    person.run(&["hosts", "--server", "localhost:8080", "--token", &token]).fails(2, &["invalid server URL"]);
    // Bad token.
    person.run(&["hosts", "--server", &url, "--token", "tth_bad"]).fails(1, &["refused the token", "401"]);
    person.run(&["login", "--server", &url, "--token", "tth_bad"]).fails(1, &["refused the token"]);
    let person = logged_in(&e);
    // Usage: run needs a command.
    person.run(&["run", &host.name]).fails(2, &["ARGV"]);
    // Directory not allowed, with the allowed list.
    for args in [
        vec!["open", host.name.as_str(), "--dir", "/etc"],
        vec!["run", host.name.as_str(), "--dir", "/etc", "--", "true"],
    ] {
        person.run(&args).fails(1, &["directory /etc is not allowed on host", "allowed: /tmp"]);
    }
    // A flag value the server refuses is a usage error.
    person.run(&["run", &host.name, "--dir", "work", "--", "true"]).fails(2, &["invalid_dir"]);
    let shell = person.run(&["open", &host.name, "-q", "--", "sleep", "60"]);
    person.run(&["kill", shell.ok().trim(), "--signal", "BOGUS"]).fails(2, &["invalid_signal"]);
    // Host offline, with when it was last seen.
    e.daemon.kill();
    eventually("the host to go offline", || async { !client.host(host.id).await.unwrap().is_online() }).await;
    let offline = person.run(&["open", &host.name]);
    offline.fails(1, &[&format!("host {} ", host.name), "is offline (last seen", "ago)"]);
    person.run(&["run", &host.name, "--", "true"]).fails(1, &["is offline (last seen"]);
    let queued = person.run(&["run", &host.name, "--detach", "--", "true"]);
    assert!(queued.ok().trim().parse::<Uuid>().is_ok() && queued.stderr.contains("queued until it returns"));
    let table = person.run(&["hosts"]);
    let line = table.ok().lines().find(|l| l.starts_with(&host.name)).expect("host listed").to_owned();
    assert!(line.contains("offline") && line.contains("ago"), "{line}");
}

// The examples are compiled into this test as modules: a test run builds
// only the test targets, and this way their code is what is tested.
#[allow(dead_code)]
#[path = "../examples/follow_to_file.rs"]
mod follow_to_file;
#[allow(dead_code)]
#[path = "../examples/run_everywhere.rs"]
mod run_everywhere;

/// The two examples of the client library, against the real server.
#[actix_rt::test]
async fn the_examples_run_everywhere_and_follow_a_terminal_to_a_file() {
    let e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;

    let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let runs = run_everywhere::run_on_every_online_host(&client, argv(&["sh", "-c", "exit 3"])).await.unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        (runs[0].0.as_str(), runs[0].1.state.as_str(), runs[0].1.exit_code),
        (host.name.as_str(), "failed", Some(3))
    );

    let terminal = client
        .create_terminal(&NewTerminal {
            host_id: host.id,
            argv: argv(&["sh", "-c", "sleep 1; echo followed-$((2+3)); exit 4"]),
            dir: Some("/tmp".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let file = e.dir.path().join("followed.log");
    let path = file.to_str().unwrap();
    let written = follow_to_file::follow(&client, &short_id(&terminal.id), path, 0).await.expect("followed");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "followed-5\r\n");
    assert_eq!(written, 12);
}

#[test]
fn completions_for_every_shell() {
    let person = Person::new();
    for shell in ["bash", "zsh", "fish"] {
        let out = person.run(&["completions", shell]);
        let script = out.ok();
        for word in ["open", "attach", "logs", "server", "token"] {
            assert!(script.contains(word), "{shell} completions lack {word}");
        }
    }
    person.run(&["completions", "tcsh"]).fails(2, &["tcsh"]);
}

/// Tokens and the audit log through the client against a real server
/// (SQLite): a token is made, listed without its secret, used, revoked and
/// then refused; the audit log names both and answers `since` and `limit`.
#[actix_rt::test]
async fn the_client_makes_lists_uses_and_revokes_tokens_and_reads_the_audit_log() {
    let e = e2e::start(false, &[]).await;
    let client = client(&e);
    let host = the_host(&client).await;

    let new =
        NewToken { name: Some("ci".into()), scope: Some("read".into()), ttl_seconds: Some(3600), ..Default::default() };
    let made = client.create_token(&new).await.expect("create a token");
    assert!(made.secret.starts_with("tth_"), "{made:?}");
    assert_eq!((made.token.name.as_deref(), made.token.scope.as_str()), (Some("ci"), "read"));
    assert!(made.token.expires_at.is_some_and(|at| at > made.token.created_at), "{made:?}");
    let id = made.token.id;

    // Listed with what it was made with, and never a secret.
    let tokens = client.tokens().await.expect("tokens");
    assert_eq!(tokens.len(), 2, "the test's token and the new one: {tokens:?}");
    let listed = tokens.iter().find(|t| t.id == id).expect("the new token is listed");
    assert_eq!(listed, &made.token);
    assert!(listed.is_usable_at(chrono::Utc::now()));
    let listing = serde_json::to_string(&tokens).expect("json");
    assert!(!listing.contains(&made.secret) && !listing.contains("tth_"), "{listing}");

    // Used: a read token reads, and the token routes are for full tokens only.
    let ci = Client::new(&e.server.url(), &made.secret, None).expect("client");
    assert_eq!(ci.hosts().await.expect("hosts with the new token"), vec![host]);
    let refused = ci.tokens().await.expect_err("a read token lists no tokens");
    assert_eq!((refused.code(), refused.is_unauthorized()), (Some("insufficient_scope"), false), "{refused}");
    let stamped = client.tokens().await.expect("tokens");
    assert!(stamped.iter().any(|t| t.id == id && t.last_used_at.is_some()), "its use was stamped: {stamped:?}");

    // Revoked: refused on the next request, and listed as revoked.
    client.revoke_token(id).await.expect("revoke");
    let refused = ci.hosts().await.expect_err("a revoked token is refused");
    assert!(refused.is_unauthorized(), "{refused}");
    let tokens = client.tokens().await.expect("tokens");
    let listed = tokens.iter().find(|t| t.id == id).expect("a revoked token is still listed");
    assert!(listed.revoked_at.is_some() && !listed.is_usable_at(chrono::Utc::now()), "{listed:?}");

    // The audit log, newest first: the revocation, then the creation, both
    // naming the token, after the host's registration and the operator's
    // creation of the test's own token.
    eventually("the token events in the audit log", || async {
        client.audit(&AuditFilter::default()).await.expect("audit").iter().any(|e| e.action == "token_revoked")
    })
    .await;
    let events = client.audit(&AuditFilter::default()).await.expect("audit");
    let actions: Vec<&str> = events.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["token_revoked", "token_created", "host_registered", "token_created"], "{events:#?}");
    for event in &events[..2] {
        assert_eq!(event.detail, Some(format!("token {id}")), "{event:?}");
        assert_eq!(event.token_id, Some(tokens.iter().find(|t| t.id != id).expect("the test's token").id));
    }
    let created_at = events[1].at;
    let since = |since, limit| AuditFilter { since: Some(since), limit };
    let from_creation = client.audit(&since(created_at, None)).await.expect("audit since");
    assert_eq!(from_creation, events[..2], "`since` is inclusive and leaves out older events");
    let newest = client.audit(&AuditFilter { since: None, limit: Some(1) }).await.expect("audit limit");
    assert_eq!(newest, events[..1]);
    let later = client.audit(&since(chrono::Utc::now() + chrono::Duration::seconds(60), Some(5))).await;
    assert_eq!(later.expect("audit since later"), []);
    let refused = client.audit(&AuditFilter { since: None, limit: Some(0) }).await.expect_err("limit 0");
    assert!(matches!(&refused, ClientError::Api { status: 400, code, .. } if code == "invalid_limit"), "{refused}");

    // The API's refusals as typed errors.
    client.revoke_token(id).await.expect("revoking twice is not an error");
    // ... and recorded once: the second revocation writes no event (a
    // token created after it shows the log has caught up).
    client.create_token(&NewToken::default()).await.expect("a token after the second revocation");
    let count = |events: &[AuditEvent], action: &str| events.iter().filter(|e| e.action == action).count();
    eventually("the later token in the audit log", || async {
        count(&client.audit(&AuditFilter::default()).await.expect("audit"), "token_created") == 3
    })
    .await;
    let events = client.audit(&AuditFilter::default()).await.expect("audit");
    assert_eq!(count(&events, "token_revoked"), 1, "{events:#?}");
    let unknown = client.revoke_token(Uuid::new_v4()).await.expect_err("an unknown token");
    assert!(unknown.is_not_found(), "{unknown}");
    let bad = NewToken { scope: Some("admin".into()), ..Default::default() };
    let refused = client.create_token(&bad).await.expect_err("scope admin");
    assert!(matches!(&refused, ClientError::Api { status: 400, code, .. } if code == "invalid_scope"), "{refused}");
}

/// A fake server with pages of one item shows the client follows
/// `nextCursor` with the filters kept, until a page has none (the real
/// server's pages: `lists_are_paginated_and_the_client_follows_the_pages`).
#[actix_rt::test]
async fn lists_follow_next_cursor_to_the_last_page() {
    use std::sync::Mutex;

    use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

    fn terminal(n: u32) -> Value {
        serde_json::json!({
            "id": format!("00000000-0000-4000-8000-{n:012}"), "hostId": "11111111-0000-4000-8000-000000000000",
            "title": null, "dir": null, "argv": [], "state": "running", "pendingReason": null, "exitCode": null,
            "exitSignal": null, "cols": 80, "rows": 24, "createdAt": "2026-12-01T10:00:00Z",
            "startedAt": null, "endedAt": null
        })
    }
    async fn page(req: HttpRequest, seen: web::Data<Mutex<Vec<String>>>) -> HttpResponse {
        let query = req.query_string().to_owned();
        seen.lock().unwrap().push(query.clone());
        let body = if query.contains("after=page2") {
            serde_json::json!({ "terminals": [terminal(3)] })
        } else if query.contains("after=") {
            serde_json::json!({ "terminals": [terminal(2)], "nextCursor": "page2" })
        } else {
            serde_json::json!({ "terminals": [terminal(0), terminal(1)], "nextCursor": "page1" })
        };
        HttpResponse::Ok().json(body)
    }
    let seen = web::Data::new(Mutex::new(Vec::<String>::new()));
    let data = seen.clone();
    let server =
        HttpServer::new(move || App::new().app_data(data.clone()).route("/api/v1/terminals", web::get().to(page)))
            .workers(1)
            .disable_signals()
            .bind(("127.0.0.1", 0))
            .expect("bind");
    let url = format!("http://{}", server.addrs()[0]);
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);

    let client = Client::new(&url, "tth_x", None).unwrap();
    let host_id: Uuid = "11111111-0000-4000-8000-000000000000".parse().unwrap();
    let filter = TerminalFilter { host_id: Some(host_id), state: Some("running".into()) };
    let terminals = client.terminals(&filter).await.expect("all pages");
    let ids: Vec<String> = terminals.iter().map(|t| t.id.to_string()).collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert!(ids.iter().enumerate().all(|(n, id)| id.ends_with(&format!("{n:012}"))), "{ids:?}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    for query in seen.iter() {
        assert!(query.contains(&format!("hostId={host_id}")) && query.contains("state=running"), "{query}");
        assert!(query.contains("limit=500"), "{query}");
    }
    assert!(!seen[0].contains("after=") && seen[1].contains("after=page1") && seen[2].contains("after=page2"));
    handle.stop(false).await;
}
