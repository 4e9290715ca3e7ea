//! `tether run`, `runs` and `logs`.
//!
//! `run` streams the run's output as it happens by following its terminal
//! over the viewer protocol from offset 0; `logs --follow` first prints the
//! stored log and follows the stream from where it ends. The run's log
//! holds the terminal's stream from offset 0 (its offsets are stream
//! offsets), so whenever the server can no longer resume from where this
//! command is (the daemon's ring no longer holds those bytes), the missing
//! stretch is read from the log with `GET /runs/{id}/log?from=N`: stdout
//! gets every byte once and in order. Only bytes past `runs.log_max_bytes`
//! that the stream no longer holds are lost, and then the command says so
//! on stderr.

use std::io::{self, Write as _};
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use uuid::Uuid;

use super::errors::{explain, host_offline, start_refused};
use super::output::{print_json, print_list, print_stdout, relative_time, Table, Tone};
use super::terminals::find_host;
use super::{CliError, Format};
use crate::client::reconnect::Outage;
use crate::client::resolve::{self, short_id};
use crate::client::viewer::{Followed, OutputFollower};
use crate::client::{Client, ClientError, Host, NewRun, Run};

/// How often a run is polled while it is queued or finishing. The first
/// polls are quick: output produced before the viewer attaches can only be
/// recovered from the daemon's ring or the (capped) captured log.
const POLL: Duration = Duration::from_millis(20);
const MAX_POLL: Duration = Duration::from_secs(1);

/// How long the first polls of a new run stay quick.
const QUICK_POLLS_FOR: Duration = Duration::from_secs(3);

/// How long a run whose stream broke off may take to be final before the
/// command says it is waiting (its log is written every half second).
const FINISH_GRACE: Duration = Duration::from_secs(2);

/// How often a gap is read again while the log catches up with the
/// stream (the log is written every half second while the run goes on).
const LOG_POLL: Duration = Duration::from_millis(200);

pub async fn run(
    client: &Client,
    host: &str,
    dir: Option<String>,
    detach: bool,
    format: Format,
    argv: Vec<String>,
) -> Result<(), CliError> {
    let host = find_host(client, host).await?;
    if !host.is_online() && !detach {
        return Err(host_offline(&host));
    }
    let new = NewRun { host_id: host.id, argv, dir: dir.clone() };
    let run = client.create_run(&new).await.map_err(|e| start_refused(e, client.server(), &host, dir.as_deref()))?;
    if detach {
        if format.json {
            print_json(&json!({ "run": run }));
        } else {
            print_stdout(&format!("{}\n", run.id));
        }
        if !host.is_online() && !format.quiet {
            eprintln!("tether: host {} is offline; the run is queued until it returns", host.name);
        }
        return Ok(());
    }
    let notes = Notes { on: !format.quiet };
    let run = if format.json {
        let run = wait_final(client, run.id, notes).await?;
        print_with_log(client, &run).await?;
        run
    } else {
        let mut out = Output { written: 0 };
        stream(client, run, &host, &mut out, notes).await?
    };
    exit_status(client, &run, &host, notes).await
}

/// Whether `tether:` notes go to stderr (not with `--quiet`).
#[derive(Debug, Clone, Copy)]
struct Notes {
    on: bool,
}

impl Notes {
    fn say(self, text: &str) {
        if self.on {
            eprintln!("{text}");
        }
    }

    /// Output this command lacks: `lost` of it never reached the run's log
    /// (its `logGapBytes`), the rest was past the log's cap.
    fn missing(self, bytes: u64, lost: u64) {
        let lost = lost.min(bytes);
        if lost > 0 {
            self.say(&format!(
                "tether: {lost} bytes of output never reached the run's log (its daemon no longer had them) \
                 and are missing here"
            ));
        }
        if bytes > lost {
            self.say(&format!(
                "tether: {} bytes of output were not kept (past runs.log_max_bytes) and are missing here",
                bytes - lost
            ));
        }
    }
}

/// `call` until it gets through: a server that cannot be reached (a
/// restart, a proxy answering 502-504 meanwhile) is waited for as the
/// output stream waits for it (`client::reconnect`), saying so once. The
/// run goes on on its host whatever this command sees.
async fn patiently<T, F>(client: &Client, notes: Notes, mut call: impl FnMut() -> F) -> Result<T, CliError>
where
    F: std::future::Future<Output = Result<T, ClientError>>,
{
    let mut outage = Outage::default();
    loop {
        let e = match call().await {
            Ok(answer) => return Ok(answer),
            Err(e) => e,
        };
        let Some(delay) = e.is_unreachable().then(|| outage.next_delay()).flatten() else {
            return Err(explain(e, client.server()));
        };
        if outage.attempts() == 1 {
            notes.say(&format!("tether: {e}; trying again (the run goes on)"));
        }
        tokio::time::sleep(delay).await;
    }
}

/// The command's exit: the run's code, 128+N for signal N, 1 with a message
/// for a lost or failed-to-start run.
async fn exit_status(client: &Client, run: &Run, host: &Host, notes: Notes) -> Result<(), CliError> {
    if run.state == "lost" {
        return Err(CliError::failed(format!(
            "run {} was lost: host {} went away and did not come back in time; \
             what it printed before is in `tether logs {}`",
            short_id(&run.id),
            host.name,
            short_id(&run.id)
        )));
    }
    if let Some(code) = run.exit_code {
        return match code {
            0 => Ok(()),
            1..=255 => Err(CliError::silent(code as u8)),
            _ => Err(CliError::silent(1)),
        };
    }
    let terminal = match run.terminal_id {
        Some(id) => client.terminal(id).await.ok(),
        None => None,
    };
    // The run carries its terminal's signal; the terminal is asked as well
    // for a run read in the instant between the two being written.
    if let Some(signal) = run.exit_signal().or_else(|| terminal.as_ref().and_then(|t| t.exit_signal)) {
        notes.say(&format!("tether: the command was killed by signal {signal}"));
        return Err(CliError::silent(128u8.saturating_add(signal.clamp(0, 127) as u8)));
    }
    let why = terminal.as_ref().and_then(|t| t.error()).unwrap_or("no exit code was reported");
    Err(CliError::failed(format!("run {} {}: {why}", short_id(&run.id), run.state)))
}

/// Writes the run's output to `out` as it comes, from `out.written` on;
/// returns the finished run.
async fn stream(client: &Client, mut run: Run, host: &Host, out: &mut Output, notes: Notes) -> Result<Run, CliError> {
    let explain = |e: ClientError| explain(e, client.server());
    let mut said_waiting = false;
    let mut poll = POLL;
    let dispatching_since = tokio::time::Instant::now();
    let terminal_id = loop {
        if let Some(id) = run.terminal_id {
            break Some(id);
        }
        if run.is_final() {
            break None;
        }
        if !said_waiting && run.state == "queued" && !host.is_online() {
            notes.say(&format!("tether: waiting for host {} to come back", host.name));
            said_waiting = true;
        }
        tokio::time::sleep(poll).await;
        // Quick while it is being dispatched, patient once it waits longer
        // than a dispatch takes (its host left, say).
        if run.state != "queued" || dispatching_since.elapsed() > QUICK_POLLS_FOR {
            poll = (poll * 2).min(MAX_POLL);
        }
        run = patiently(client, notes, || client.run(run.id)).await?;
    };
    // Why the stream stopped before the exit, when it did.
    let mut interrupted = None;
    if let Some(terminal_id) = terminal_id {
        let mut follower = OutputFollower::new(client.clone(), terminal_id.to_string(), out.written);
        let mut interrupts = 0;
        loop {
            let next = tokio::select! {
                next = follower.next() => next,
                _ = tokio::signal::ctrl_c() => {
                    // The first Ctrl-C goes to the command, as it would
                    // locally; the second stops watching (the run goes on).
                    interrupts += 1;
                    if interrupts > 1 {
                        notes.say(&format!(
                            "\r\ntether: stopped watching; the run goes on (tether kill {})",
                            short_id(&terminal_id)
                        ));
                        return Err(CliError::silent(130));
                    }
                    if let Err(e) = client.kill_terminal(terminal_id, Some("INT")).await {
                        eprintln!("tether: cannot interrupt the command: {e}");
                    }
                    continue;
                }
            };
            match next.map_err(explain)? {
                Some(Followed::Output { data, .. }) => out.write(&data)?,
                Some(Followed::Gap { to, .. }) => from_log(client, run.id, out, Some(to), notes).await?,
                Some(Followed::Exit { .. }) | None => break,
                Some(Followed::Error { message }) => {
                    interrupted = Some(message);
                    break;
                }
                Some(Followed::Closed { reason, .. }) => {
                    interrupted = Some(format!("the output stream ended ({reason})"));
                    break;
                }
            }
        }
    }
    let finishing = finish(client, run.id, out, interrupted, notes);
    if terminal_id.is_none() {
        return finishing.await;
    }
    // Ctrl-C is handled from the first one on (above): keep it working.
    tokio::select! {
        finished = finishing => finished,
        _ = tokio::signal::ctrl_c() => Err(CliError::silent(130)),
    }
}

/// Waits for the run's end and writes what the stream did not bring.
async fn finish(
    client: &Client,
    id: Uuid,
    out: &mut Output,
    interrupted: Option<String>,
    notes: Notes,
) -> Result<Run, CliError> {
    if let Some(why) = interrupted {
        // A run that failed to start ends at once and says why itself; one
        // that goes on (its host left) is worth a word while we wait.
        if wait_final_within(client, id, FINISH_GRACE, notes).await?.is_none() {
            notes.say(&format!("tether: {why}; waiting for the run to finish"));
        }
    }
    let run = wait_final(client, id, notes).await?;
    // Whatever the stream did not bring (the terminal ended before this
    // command attached, or the stream broke off) is in the captured log;
    // but the log of a run that failed to start holds only the reason,
    // which goes to stderr with the exit status, not to stdout as output.
    if !failed_to_start(client, &run).await {
        from_log(client, run.id, out, None, notes).await?;
        // The stream broke off past what the log keeps: the rest is gone.
        let missing = streamed_bytes(&run).saturating_sub(out.written);
        if missing > 0 {
            notes.missing(missing, run.log_gap_bytes());
        }
    }
    Ok(run)
}

/// How many bytes a final run's stream held in all (its usage counts every
/// byte; 0 while it is not final).
fn streamed_bytes(run: &Run) -> u64 {
    run.usage.as_ref().filter(|_| run.is_final()).map_or(0, |u| u64::try_from(u.output_bytes).unwrap_or(0))
}

/// Whether `run` failed before its command started: its terminal ended in
/// `error` (the spawn was refused, or never acknowledged).
async fn failed_to_start(client: &Client, run: &Run) -> bool {
    if run.state != "failed" || run.exit_code.is_some() || run.exit_signal().is_some() {
        return false;
    }
    match run.terminal_id {
        Some(id) => client.terminal(id).await.is_ok_and(|t| t.state == "error"),
        None => false,
    }
}

/// Stdout, counting the stream bytes it got: `written` is the stream
/// offset of the next byte it needs.
struct Output {
    written: u64,
}

impl Output {
    fn write(&mut self, data: &[u8]) -> Result<(), CliError> {
        let mut stdout = io::stdout().lock();
        match stdout.write_all(data).and_then(|()| stdout.flush()) {
            Ok(()) => {}
            // `| head`: the reader is gone; the run goes on regardless.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Err(CliError::silent(141)),
            Err(e) => return Err(CliError::failed(format!("cannot write the output: {e}"))),
        }
        self.written += data.len() as u64;
        Ok(())
    }
}

/// Writes the log from `out.written` up to stream offset `to` (`None`: to
/// the log's end once it is complete), waiting while the log catches up
/// with the stream. Bytes the log will never have (past
/// `runs.log_max_bytes`) are skipped with a note.
async fn from_log(
    client: &Client,
    run_id: Uuid,
    out: &mut Output,
    to: Option<u64>,
    notes: Notes,
) -> Result<(), CliError> {
    loop {
        if to.is_some_and(|to| out.written >= to) {
            return Ok(());
        }
        let log = patiently(client, notes, || client.run_log_from(run_id, out.written)).await?;
        let wanted = to.map_or(log.data.len(), |to| log.data.len().min((to - out.written) as usize));
        out.write(&log.data[..wanted])?;
        let Some(to) = to else {
            if log.complete {
                return Ok(());
            }
            tokio::time::sleep(LOG_POLL).await;
            continue;
        };
        if out.written < to && log.complete {
            notes.say("\r");
            notes.missing(to - out.written, 0);
            // Stream positions from here on are past the hole.
            out.written = to;
        }
        if out.written < to {
            tokio::time::sleep(LOG_POLL).await;
        }
    }
}

async fn wait_final(client: &Client, id: Uuid, notes: Notes) -> Result<Run, CliError> {
    loop {
        if let Some(run) = wait_final_within(client, id, Duration::from_secs(3600), notes).await? {
            return Ok(run);
        }
    }
}

/// The run once it is final, or `None` if it is not within `limit`.
async fn wait_final_within(client: &Client, id: Uuid, limit: Duration, notes: Notes) -> Result<Option<Run>, CliError> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut poll = POLL;
    loop {
        let run = patiently(client, notes, || client.run(id)).await?;
        if run.is_final() {
            return Ok(Some(run));
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(poll).await;
        poll = (poll * 2).min(MAX_POLL);
    }
}

/// `--json` of `run` and `logs`: the run as the API sent it and its whole
/// log as text (invalid UTF-8 replaced by U+FFFD; `tether logs` without
/// `--json` gives the exact bytes).
async fn print_with_log(client: &Client, run: &Run) -> Result<(), CliError> {
    let log = client.run_log(run.id).await.map_err(|e| explain(e, client.server()))?;
    print_json(&json!({ "run": run, "log": String::from_utf8_lossy(&log) }));
    Ok(())
}

/// A run's EXIT column: its exit code, `sigN` when signal N ended it (as
/// `ls` shows a terminal), `-` while it has neither.
fn exit_cell(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(code), _) => code.to_string(),
        (None, Some(signal)) => format!("sig{signal}"),
        (None, None) => "-".to_owned(),
    }
}

pub async fn runs(client: &Client, format: Format) -> Result<(), CliError> {
    let explain = |e| explain(e, client.server());
    let runs = client.runs().await.map_err(explain)?;
    if print_list(format, "runs", &runs, |r| r.id) {
        return Ok(());
    }
    let hosts = client.hosts().await.map_err(explain)?;
    let now = Utc::now();
    let mut table = Table::new(&["ID", "HOST", "STATE", "EXIT", "COMMAND", "CREATED"]);
    for run in &runs {
        let host =
            hosts.iter().find(|h| h.id == run.host_id).map_or_else(|| short_id(&run.host_id), |h| h.name.clone());
        table.row(vec![
            (short_id(&run.id), Tone::Plain),
            (host, Tone::Plain),
            (run.state.clone(), Tone::of_state(&run.state)),
            (exit_cell(run.exit_code, run.exit_signal()), Tone::Plain),
            (run.argv.join(" "), Tone::Plain),
            (relative_time(Some(run.created_at), now), Tone::Plain),
        ]);
    }
    table.print();
    Ok(())
}

pub async fn logs(client: &Client, query: &str, follow: bool, format: Format) -> Result<(), CliError> {
    let explain = |e: ClientError| explain(e, client.server());
    let run = match Uuid::parse_str(query.trim()) {
        Ok(id) => client.run(id).await.map_err(|e| match e {
            e if e.is_not_found() => CliError::failed(format!("no run matches {query:?}")),
            e => explain(e),
        })?,
        Err(_) => {
            let runs = client.runs().await.map_err(explain)?;
            resolve::run(&runs, query)?.clone()
        }
    };
    let notes = Notes { on: !format.quiet };
    if format.json {
        let run = if follow { wait_final(client, run.id, notes).await? } else { run };
        return print_with_log(client, &run).await;
    }
    let mut out = Output { written: 0 };
    if follow && !run.is_final() {
        // What is stored first, then the stream from where the log ends.
        let stored = client.run_log_from(run.id, 0).await.map_err(explain)?;
        out.write(&stored.data)?;
        let host = client.host(run.host_id).await.map_err(explain)?;
        stream(client, run, &host, &mut out, notes).await?;
        return Ok(());
    }
    let log = client.run_log(run.id).await.map_err(explain)?;
    out.write(&log)?;
    // A final run's usage counts every byte of its stream: what the log
    // and its gaps do not account for was dropped past the log's cap.
    let missing = streamed_bytes(&run).saturating_sub(log.len() as u64);
    if missing > 0 {
        notes.missing(missing, run.log_gap_bytes());
    }
    Ok(())
}
