//! Runs one command on every online host at once and prints each host's
//! exit code, using the client library (`tether::client`).
//!
//! ```sh
//! tether login --server http://127.0.0.1:8080      # or set TETHER_SERVER / TETHER_TOKEN
//! cargo run --example run_everywhere -- uname -a
//! ```
//!
//! The output of each run stays on the server: `tether logs RUN_ID` shows it.
//! Exits 0 when every run succeeded, 1 otherwise. (tests/client_cli.rs
//! compiles this file as a module and calls [`run_on_every_online_host`].)

use std::process::ExitCode;
use std::time::Duration;

use tether::client::resolve::short_id;
use tether::client::{Client, NewRun, Run};

#[actix_rt::main]
async fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.is_empty() {
        eprintln!("usage: run_everywhere COMMAND [ARGS...]");
        return ExitCode::from(2);
    }
    let client = match tether::cli::client_from_environment() {
        Ok(client) => client,
        Err(e) => {
            eprintln!("run_everywhere: {}", e.message.unwrap_or_default());
            return ExitCode::from(2);
        }
    };
    match run_on_every_online_host(&client, argv).await {
        Ok(runs) => {
            for (name, run) in &runs {
                let code = run.exit_code.map_or_else(|| "-".to_owned(), |c| c.to_string());
                println!("{name:<20} {:<10} exit {code:<4} run {}", run.state, short_id(&run.id));
            }
            let all_succeeded = runs.iter().all(|(_, run)| run.state == "succeeded");
            ExitCode::from(if all_succeeded { 0 } else { 1 })
        }
        Err(message) => {
            eprintln!("run_everywhere: {message}");
            ExitCode::from(1)
        }
    }
}

/// Queues `argv` on every online host at once, then waits for all of them;
/// each host's name with its finished run.
pub async fn run_on_every_online_host(client: &Client, argv: Vec<String>) -> Result<Vec<(String, Run)>, String> {
    let hosts: Vec<_> =
        client.hosts().await.map_err(|e| e.to_string())?.into_iter().filter(|h| h.is_online()).collect();
    if hosts.is_empty() {
        return Err("no host is online".into());
    }
    let mut runs = Vec::new();
    for host in &hosts {
        let run = client
            .create_run(&NewRun { host_id: host.id, argv: argv.clone(), dir: None })
            .await
            .map_err(|e| format!("{}: {e}", host.name))?;
        runs.push((host.name.clone(), run));
    }
    let mut finished_runs = Vec::new();
    for (name, run) in runs {
        let run = finished(client, run).await.map_err(|e| format!("{name}: {e}"))?;
        finished_runs.push((name, run));
    }
    Ok(finished_runs)
}

/// Polls a run until it succeeded, failed or was lost.
async fn finished(client: &Client, mut run: Run) -> Result<Run, tether::client::ClientError> {
    while !run.is_final() {
        actix_rt::time::sleep(Duration::from_millis(200)).await;
        run = client.run(run.id).await?;
    }
    Ok(run)
}
