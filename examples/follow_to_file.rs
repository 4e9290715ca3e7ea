//! Follows a terminal's output stream into a file, byte for byte, until
//! the terminal exits, using the client library's `OutputFollower`
//! (`tether::client::viewer`). Screen repaints are not written: only what
//! the terminal's programs printed, from the stream offset given.
//!
//! ```sh
//! tether login --server http://127.0.0.1:8080      # or set TETHER_SERVER / TETHER_TOKEN
//! tether ls                                        # pick a terminal
//! cargo run --example follow_to_file -- 3fa9 session.log [FROM_OFFSET]
//! ```
//!
//! (tests/client_cli.rs compiles this file as a module and calls [`follow`].)

use std::fs::File;
use std::io::Write;
use std::process::ExitCode;

use tether::client::viewer::{Followed, OutputFollower};
use tether::client::{resolve, Client, TerminalFilter};

#[actix_rt::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (terminal, path, from) = match args.as_slice() {
        [terminal, path] => (terminal, path, 0),
        [terminal, path, from] => match from.parse() {
            Ok(from) => (terminal, path, from),
            Err(_) => return usage(),
        },
        _ => return usage(),
    };
    let client = match tether::cli::client_from_environment().map_err(|e| e.message.unwrap_or_default()) {
        Ok(client) => client,
        Err(message) => {
            eprintln!("follow_to_file: {message}");
            return ExitCode::from(2);
        }
    };
    match follow(&client, terminal, path, from).await {
        Ok(written) => {
            eprintln!("follow_to_file: {written} bytes written to {path}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("follow_to_file: {message}");
            ExitCode::from(1)
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: follow_to_file TERMINAL_ID_OR_PREFIX FILE [FROM_OFFSET]");
    ExitCode::from(2)
}

/// Writes the output stream of the terminal `query` names into `path` from
/// stream offset `from` until the terminal exits; the bytes written.
pub async fn follow(client: &Client, query: &str, path: &str, from: u64) -> Result<u64, String> {
    let terminals = client.terminals(&TerminalFilter::default()).await.map_err(|e| e.to_string())?;
    let terminal = resolve::terminal(&terminals, query).map_err(|e| e.to_string())?;

    let mut file = File::create(path).map_err(|e| format!("{path}: {e}"))?;
    let mut follower = OutputFollower::new(client.clone(), terminal.id.to_string(), from);
    while let Some(event) = follower.next().await.map_err(|e| e.to_string())? {
        match event {
            Followed::Output { data, .. } => {
                file.write_all(&data).and_then(|()| file.flush()).map_err(|e| format!("{path}: {e}"))?
            }
            Followed::Gap { from, to } => eprintln!("follow_to_file: bytes {from}..{to} are no longer held; skipped"),
            Followed::Exit { code } => eprintln!("follow_to_file: the terminal exited (code {code:?})"),
            Followed::Error { message } => return Err(message),
            Followed::Closed { code, reason } => return Err(format!("closed {code}: {reason}")),
        }
    }
    Ok(follower.position() - from)
}
