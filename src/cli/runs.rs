//! `tether run`, `runs` and `logs`.
//!
//! `run` streams the run's output as it happens by following its terminal
//! over the viewer protocol from offset 0. When the server can no longer
//! resume from where this command is (the run printed more than the
//! daemon's ring holds before the viewer got there), the missing stretch is
//! taken from the run's captured log, so stdout still gets every byte once
//! and in order; only bytes past `runs.log_max_bytes` that the stream no
//! longer holds are lost, and then the command says so on stderr.

use std::io::{self, Write as _};
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use serde_json::json;
use uuid::Uuid;

use super::errors::{explain, host_offline, start_refused};
use super::output::{print_json, print_list, print_stdout, relative_time, Table, Tone};
use super::terminals::find_host;
use super::{CliError, Format};
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

/// How long a gap may wait for the log to catch up (it is written every
/// half second while the run goes on).
const LOG_CATCH_UP: Duration = Duration::from_secs(15);

pub async fn run(
    client: &Client,
    host: &str,
    dir: Option<String>,
    detach: bool,
    json: bool,
    argv: Vec<String>,
) -> Result<(), CliError> {
    let host = find_host(client, host).await?;
    if !host.is_online() && !detach {
        return Err(host_offline(&host));
    }
    let new = NewRun { host_id: host.id, argv, dir: dir.clone() };
    let run = client.create_run(&new).await.map_err(|e| start_refused(e, client.server(), &host, dir.as_deref()))?;
    if detach {
        if json {
            print_json(&json!({ "run": run }));
        } else {
            print_stdout(&format!("{}\n", run.id));
        }
        if !host.is_online() {
            eprintln!("tether: host {} is offline; the run is queued until it returns", host.name);
        }
        return Ok(());
    }
    let run = stream(client, run, &host).await?;
    exit_status(client, &run, &host).await
}

/// The command's exit: the run's code, 128+N for signal N, 1 with a message
/// for a lost or failed-to-start run.
async fn exit_status(client: &Client, run: &Run, host: &Host) -> Result<(), CliError> {
    if run.state == "lost" {
        return Err(CliError::failed(format!(
            "run {} was lost: host {} went away and did not come back in time",
            short_id(&run.id),
            host.name
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
    if let Some(signal) = terminal.as_ref().and_then(|t| t.exit_signal) {
        eprintln!("tether: the command was killed by signal {signal}");
        return Err(CliError::silent(128u8.saturating_add(signal.clamp(0, 127) as u8)));
    }
    let why = terminal.as_ref().and_then(|t| t.error()).unwrap_or("no exit code was reported");
    Err(CliError::failed(format!("run {} {}: {why}", short_id(&run.id), run.state)))
}

/// Writes the run's output to stdout as it comes; returns the finished run.
async fn stream(client: &Client, mut run: Run, host: &Host) -> Result<Run, CliError> {
    let explain = |e: ClientError| explain(e, client.server());
    let mut out = Output { written: 0 };
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
            eprintln!("tether: waiting for host {} to come back", host.name);
            said_waiting = true;
        }
        tokio::time::sleep(poll).await;
        // Quick while it is being dispatched, patient once it waits longer
        // than a dispatch takes (its host left, say).
        if run.state != "queued" || dispatching_since.elapsed() > QUICK_POLLS_FOR {
            poll = (poll * 2).min(MAX_POLL);
        }
        run = client.run(run.id).await.map_err(explain)?;
    };
    // Why the stream stopped before the exit, when it did.
    let mut interrupted = None;
    if let Some(terminal_id) = terminal_id {
        let mut follower = OutputFollower::new(client.clone(), terminal_id.to_string(), 0);
        let mut interrupts = 0;
        loop {
            let next = tokio::select! {
                next = follower.next() => next,
                _ = tokio::signal::ctrl_c() => {
                    // The first Ctrl-C goes to the command, as it would
                    // locally; the second stops watching (the run goes on).
                    interrupts += 1;
                    if interrupts > 1 {
                        eprintln!("\r\ntether: stopped watching; the run goes on (tether kill {})", short_id(&terminal_id));
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
                Some(Followed::Gap { from, to }) => fill_gap(client, run.id, &mut out, from, to).await?,
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
    let finishing = finish(client, run.id, &mut out, interrupted);
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
async fn finish(client: &Client, id: Uuid, out: &mut Output, interrupted: Option<String>) -> Result<Run, CliError> {
    if let Some(why) = interrupted {
        // A run that failed to start ends at once and says why itself; one
        // that goes on (its host left) is worth a word while we wait.
        if wait_final_within(client, id, FINISH_GRACE).await?.is_none() {
            eprintln!("tether: {why}; waiting for the run to finish");
        }
    }
    let run = wait_final(client, id).await?;
    // Whatever the stream did not bring (the terminal ended before this
    // command attached, or the stream broke off) is in the captured log.
    let log = client.run_log(run.id).await.map_err(|e| explain(e, client.server()))?;
    if (out.written as usize) < log.len() {
        out.write(&log[out.written as usize..])?;
    }
    Ok(run)
}

/// Stdout, counting the stream bytes it got.
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

/// Bytes `from..to` of the stream, from the captured log.
async fn fill_gap(client: &Client, run_id: Uuid, out: &mut Output, from: u64, to: u64) -> Result<(), CliError> {
    let deadline = tokio::time::Instant::now() + LOG_CATCH_UP;
    let log = loop {
        let log: Bytes = client.run_log(run_id).await.map_err(|e| explain(e, client.server()))?;
        let finished = client.run(run_id).await.map(|r| r.is_final()).unwrap_or(false);
        if log.len() as u64 >= to || finished || tokio::time::Instant::now() >= deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let end = (log.len() as u64).min(to);
    if end > from {
        out.write(&log[from as usize..end as usize])?;
    }
    if end < to {
        eprintln!(
            "\r\ntether: {} bytes of output were not kept (past runs.log_max_bytes) and are missing here",
            to - end
        );
        // Stream positions from here on are past the hole.
        out.written = to;
    }
    Ok(())
}

async fn wait_final(client: &Client, id: Uuid) -> Result<Run, CliError> {
    loop {
        if let Some(run) = wait_final_within(client, id, Duration::from_secs(3600)).await? {
            return Ok(run);
        }
    }
}

/// The run once it is final, or `None` if it is not within `limit`.
async fn wait_final_within(client: &Client, id: Uuid, limit: Duration) -> Result<Option<Run>, CliError> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut poll = POLL;
    loop {
        let run = client.run(id).await.map_err(|e| explain(e, client.server()))?;
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
            (run.exit_code.map_or_else(|| "-".to_owned(), |c| c.to_string()), Tone::Plain),
            (run.argv.join(" "), Tone::Plain),
            (relative_time(Some(run.created_at), now), Tone::Plain),
        ]);
    }
    table.print();
    Ok(())
}

pub async fn logs(client: &Client, query: &str, follow: bool) -> Result<(), CliError> {
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
    if follow && !run.is_final() {
        let host = client.host(run.host_id).await.map_err(explain)?;
        stream(client, run, &host).await?;
        return Ok(());
    }
    let log = client.run_log(run.id).await.map_err(explain)?;
    Output { written: 0 }.write(&log)
}
