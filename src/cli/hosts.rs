//! `tether hosts` and `tether ls [HOST]`.

use std::collections::HashMap;

use chrono::Utc;
use uuid::Uuid;

use super::errors::explain;
use super::output::{print_list, relative_time, Table, Tone};
use super::{CliError, Format};
use crate::client::resolve::{self, short_id};
use crate::client::{Client, Host, Terminal, TerminalFilter};

pub async fn hosts(client: &Client, format: Format) -> Result<(), CliError> {
    let hosts = client.hosts().await.map_err(|e| explain(e, client.server()))?;
    if !print_list(format, "hosts", &hosts, |h| h.id) {
        let now = Utc::now();
        let mut table = Table::new(&["NAME", "ID", "STATE", "PLATFORM", "LAST SEEN"]);
        for host in &hosts {
            let seen = if host.is_online() { "now".to_owned() } else { relative_time(host.last_seen_at, now) };
            table.row(vec![
                (host.name.clone(), Tone::Plain),
                (short_id(&host.id), Tone::Faint),
                (host.state.clone(), Tone::of_state(&host.state)),
                (platform(host), Tone::Plain),
                (seen, Tone::Plain),
            ]);
        }
        table.print();
        if hosts.is_empty() {
            eprintln!(
                "tether: no hosts yet; run `tether daemon --server {} --token TOKEN` on a machine",
                client.server()
            );
        }
    }
    Ok(())
}

fn platform(host: &Host) -> String {
    match (host.platform.as_str(), host.arch.as_str()) {
        ("", "") => "-".to_owned(),
        (p, "") | ("", p) => p.to_owned(),
        (p, a) => format!("{p}/{a}"),
    }
}

pub async fn ls(client: &Client, host: Option<&str>, format: Format) -> Result<(), CliError> {
    let explain = |e| explain(e, client.server());
    let hosts = client.hosts().await.map_err(explain)?;
    let host_id = match host {
        Some(query) => Some(resolve::host(&hosts, query)?.id),
        None => None,
    };
    let terminals = client.terminals(&TerminalFilter { host_id, state: None }).await.map_err(explain)?;
    if print_list(format, "terminals", &terminals, |t| t.id) {
        return Ok(());
    }
    let names: HashMap<Uuid, &str> = hosts.iter().map(|h| (h.id, h.name.as_str())).collect();
    let now = Utc::now();
    let mut table = Table::new(&["ID", "HOST", "STATE", "SIZE", "TITLE", "STARTED"]);
    for terminal in &terminals {
        let title = match (&terminal.title, terminal.argv.is_empty()) {
            (Some(title), _) if !title.is_empty() => title.clone(),
            (_, true) => "(shell)".to_owned(),
            (_, false) => terminal.argv.join(" "),
        };
        let state = state_label(terminal);
        table.row(vec![
            (short_id(&terminal.id), Tone::Plain),
            (names.get(&terminal.host_id).map_or_else(|| short_id(&terminal.host_id), |n| n.to_string()), Tone::Plain),
            (state, Tone::of_state(&terminal.state)),
            (format!("{}x{}", terminal.cols, terminal.rows), Tone::Plain),
            (title, Tone::Plain),
            // A terminal that never started shows none rather than its creation.
            (relative_time(terminal.started_at, now), Tone::Plain),
        ]);
    }
    table.print();
    Ok(())
}

/// The STATE column: the exit code or signal of an ended terminal, and why
/// a pending one waits.
fn state_label(terminal: &Terminal) -> String {
    match (terminal.state.as_str(), terminal.exit_code, terminal.exit_signal, terminal.pending_reason.as_deref()) {
        ("exited", Some(code), _, _) => format!("exited {code}"),
        ("exited", None, Some(signal), _) => format!("exited sig{signal}"),
        ("pending", _, _, Some(reason)) if !reason.is_empty() => format!("pending ({})", reason.replace('_', " ")),
        (state, ..) => state.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terminal(fields: serde_json::Value) -> Terminal {
        let mut base = serde_json::json!({
            "id": "00000000-0000-4000-8000-000000000001", "hostId": "11111111-0000-4000-8000-000000000000",
            "title": null, "dir": null, "argv": [], "state": "running", "pendingReason": null, "exitCode": null,
            "exitSignal": null, "cols": 80, "rows": 24, "createdAt": "2026-12-01T10:00:00Z",
            "startedAt": null, "endedAt": null
        });
        for (key, value) in fields.as_object().into_iter().flatten() {
            base[key] = value.clone();
        }
        serde_json::from_value(base).expect("a terminal")
    }

    #[test]
    fn the_state_column_says_how_it_ended_or_why_it_waits() {
        let cases = [
            (serde_json::json!({"state": "exited", "exitCode": 3}), "exited 3"),
            (serde_json::json!({"state": "exited", "exitSignal": 9}), "exited sig9"),
            (serde_json::json!({"state": "pending", "pendingReason": "host_offline"}), "pending (host offline)"),
            (serde_json::json!({"state": "pending"}), "pending"),
            (serde_json::json!({"state": "running"}), "running"),
        ];
        for (fields, label) in cases {
            assert_eq!(state_label(&terminal(fields.clone())), label, "{fields}");
        }
    }
}
