//! The reconnect loop: register if needed, ask where to dial (the server's
//! director, if it runs one), dial, serve, and decide from how the
//! connection ended whether to redial at once, back off, ask the director
//! again, re-register or give up (docs/PROTOCOL.md, "Close codes (daemon's
//! reaction)"; docs/CELLS.md, "What a daemon does").

use std::time::Duration;

use tracing::Instrument;

use super::assign::{self, AssignError, Target};
use super::backoff::Backoff;
use super::connection::{self, DialError, ServerClose};
use super::host::{Host, SessionEnd, SessionOutcome};
use super::registration::{self, HostDescription, RegisterError};
use super::server_url::ServerUrl;
use super::state::StateDir;
use super::stop::Stop;
use super::DaemonError;

/// Close codes the daemon acts on (docs/PROTOCOL.md, "Close codes (daemon's
/// reaction)"). Every other code, 4429
/// (throttled) included, and every socket failure means "back off".
mod close_code {
    pub const REPLACED: u16 = 4000;
    pub const BAD_TOKEN: u16 = 4401;
    pub const FOREIGN_HOST: u16 = 4403;
    pub const WRONG_CELL: u16 = 4409;
    pub const DRAINING: u16 = 4503;
}

/// A connection that stayed up this long was healthy: the next failure
/// starts backing off from one second again.
const HEALTHY_CONNECTION: Duration = Duration::from_secs(10);
/// Bounds registration and the WebSocket handshake.
pub(super) const HTTP_TIMEOUT: Duration = Duration::from_secs(15);

/// Everything the loop carries from one attempt to the next.
pub struct Supervisor {
    /// Speaks `http://` and `https://` (docs/CONFIG.md, "TLS").
    pub client: awc::Client,
    pub server: ServerUrl,
    pub token: String,
    pub description: HostDescription,
    pub state: StateDir,
    pub host: Host,
    /// A stop ends the loop with `Ok` (`Host::serve` reports the endings
    /// when connected; elsewhere the terminals are ended unreported).
    pub stop: Stop,
}

impl Supervisor {
    /// Runs until a fatal error or a stop. Either way the terminals are
    /// ended before it returns (`Host::serve` has reported them if the
    /// stop came while connected): a daemon that gives up does not leave
    /// processes running where tether cannot reach them.
    pub async fn run(mut self) -> Result<(), DaemonError> {
        let result = self.run_until_stopped().await;
        self.host.stop_unconnected().await;
        result
    }

    /// The loop; `Ok` once a stop is asked for.
    async fn run_until_stopped(&mut self) -> Result<(), DaemonError> {
        let client = self.client.clone();
        let mut backoff = Backoff::new();
        // A 4403 earns one re-registration; a second one in a row is fatal.
        let mut reregistered = false;
        // A 4503 earns one immediate redial; repeated ones back off.
        let mut redialed_after_drain = false;
        // Where connections go until a dial fails or a cell says 4409; None: ask.
        let mut target: Option<Target> = None;
        // The last cell a director sent this daemon to that it reached,
        // with its booking: where it dials when the director cannot be
        // asked (an expired ticket still names the epoch of a redial).
        let mut last_cell: Option<Target> = self.stored_last_cell();
        // The cell the last 4409 named: where the daemon goes when the
        // server it asks runs no director (its `/v1/assign` is 404), or it
        // would dial the server that refused it again, round and round.
        let mut named_by_wrong_cell: Option<ServerUrl> = None;
        let mut stop = self.stop.clone();
        loop {
            if stop.requested() {
                return Ok(());
            }
            let Some(host_id) = stop.or_stop(self.host_id(&client)).await else { return Ok(()) };
            let host_id = match host_id? {
                Some(host_id) => host_id,
                None => {
                    self.host.idle(backoff.next_delay()).await;
                    continue;
                }
            };
            let Target { url, booking } = match &target {
                Some(known) => known.clone(),
                None => {
                    let asked = stop.or_stop(assign::ask(&client, &self.server, &self.token, &host_id)).await;
                    let Some(asked) = asked else { return Ok(()) };
                    match asked {
                        Ok(assigned) => {
                            let assigned = match named_by_wrong_cell.take() {
                                Some(url) if assigned.url == self.server && assigned.booking.is_none() => {
                                    tracing::info!(cell = %url, "tether_daemon_no_director_dialing_named_cell");
                                    Target { url, booking: None }
                                }
                                _ => assigned,
                            };
                            if assigned.url != self.server {
                                tracing::info!(cell = %assigned.url, booked = assigned.booking.is_some(), "tether_daemon_assigned");
                            }
                            target.insert(assigned).clone()
                        }
                        Err(AssignError::BadToken) => return Err(DaemonError::BadToken),
                        // The director is away or cannot place it: its last
                        // cell may still admit it (a cell admits by the
                        // database when the director is quiet). A failed dial
                        // sends the next attempt back to the director, after
                        // the backoff.
                        Err(err) => match last_cell.clone() {
                            Some(cell) => {
                                tracing::warn!(error = %err, cell = %cell.url, "tether_daemon_assign_failed_dialing_last_cell");
                                cell
                            }
                            None => {
                                let delay = backoff.next_delay();
                                tracing::warn!(error = %err, delay_ms = delay.as_millis(), "tether_daemon_assign_failed");
                                self.host.idle(delay).await;
                                continue;
                            }
                        },
                    }
                }
            };
            let Some(dialed) = stop.or_stop(connection::dial(&client, &url, &self.token)).await else { return Ok(()) };
            let connection = match dialed {
                Ok(connection) => {
                    if url != self.server {
                        // The file keeps the URL (a booking does not outlive
                        // a restart): written only when the cell changes.
                        if last_cell.as_ref().is_none_or(|cell| cell.url != url) {
                            self.remember_cell(&url);
                        }
                        last_cell = Some(Target { url: url.clone(), booking: booking.clone() });
                    }
                    connection
                }
                Err(DialError::Refused(401)) => return Err(DaemonError::BadToken),
                Err(err) => {
                    target = None;
                    let delay = backoff.next_delay();
                    tracing::warn!(error = %err, delay_ms = delay.as_millis(), "tether_daemon_dial_failed");
                    self.host.idle(delay).await;
                    continue;
                }
            };

            let span = tracing::info_span!("daemon_connection", host_id = %host_id);
            let outcome = self.host.serve(connection, &host_id, booking).instrument(span).await;
            if matches!(outcome.end, SessionEnd::Stopped) {
                return Ok(());
            }
            if outcome.established {
                reregistered = false;
                if outcome.lived >= HEALTHY_CONNECTION {
                    backoff.reset();
                }
            }
            let drain_retry_used = std::mem::take(&mut redialed_after_drain);
            let decision = decide(&outcome, reregistered, drain_retry_used);
            match decision {
                Decision::Fatal(err) => return Err(err.with_host_id(&host_id)),
                Decision::Reregister => {
                    reregistered = true;
                    target = None;
                    last_cell = None;
                    self.forget_cell();
                    tracing::warn!(host_id, "tether_daemon_host_refused_registering_again");
                    self.state.forget_host_id()?;
                }
                Decision::RedialAfterDrain => {
                    redialed_after_drain = true;
                    tracing::info!(host_id, "tether_daemon_instance_draining");
                }
                Decision::Reassign(_) | Decision::BackOff => {
                    if let Decision::Reassign(named) = decision {
                        tracing::info!(
                            host_id,
                            named = named.as_ref().map(tracing::field::display),
                            "tether_daemon_wrong_cell"
                        );
                        target = None;
                        named_by_wrong_cell = named.filter(|url| *url != self.server);
                        // The cell this one named replaces it as the
                        // fallback: during a director outage it is the
                        // only cell known to take the host.
                        last_cell = named_by_wrong_cell.clone().map(|url| Target { url, booking: None });
                        match &last_cell {
                            Some(cell) => self.remember_cell(&cell.url),
                            None => self.forget_cell(),
                        }
                    }
                    let delay = backoff.next_delay();
                    tracing::info!(
                        end = %outcome.end,
                        delay_ms = delay.as_millis(),
                        "tether_daemon_reconnect_scheduled"
                    );
                    self.host.idle(delay).await;
                }
            }
        }
    }

    /// The cell `cell.json` names, unless it is the server itself.
    fn stored_last_cell(&self) -> Option<Target> {
        let url = ServerUrl::parse(&self.state.last_cell()?).ok()?;
        (url != self.server).then_some(Target { url, booking: None })
    }

    /// Keeps `url` in `cell.json`; a daemon that cannot write its state
    /// dir goes on (it only loses the fallback across a restart).
    fn remember_cell(&self, url: &ServerUrl) {
        if let Err(e) = self.state.save_last_cell(&url.to_string()) {
            tracing::warn!(error = %e, "tether_daemon_cell_file_not_written");
        }
    }

    fn forget_cell(&self) {
        if let Err(e) = self.state.forget_last_cell() {
            tracing::warn!(error = %e, "tether_daemon_cell_file_not_removed");
        }
    }

    /// The stored host id, or a fresh registration. `Ok(None)` means "retry
    /// later"; only a refused token, or one whose scope cannot run a
    /// daemon, is fatal.
    async fn host_id(&self, client: &awc::Client) -> Result<Option<String>, DaemonError> {
        if let Some(host_id) = self.state.host_id() {
            return Ok(Some(host_id));
        }
        match registration::register(client, &self.server, &self.token, &self.description).await {
            Ok(host_id) => {
                self.state.save_host_id(&host_id)?;
                tracing::info!(host_id, "tether_daemon_registered");
                Ok(Some(host_id))
            }
            Err(RegisterError::BadToken) => Err(DaemonError::BadToken),
            Err(RegisterError::Status { code, .. }) if code == "insufficient_scope" => Err(DaemonError::TokenScope),
            Err(err) => {
                tracing::warn!(error = %err, "tether_daemon_registration_failed");
                Ok(None)
            }
        }
    }
}

enum Decision {
    Fatal(FatalEnd),
    Reregister,
    RedialAfterDrain,
    /// The cell says the host belongs elsewhere: ask the director again,
    /// after the backoff. The cell it names, if its close reason does, is
    /// where to dial while the director cannot be asked.
    Reassign(Option<ServerUrl>),
    BackOff,
}

enum FatalEnd {
    BadToken,
    ForeignHost,
    /// Another daemon holds this host now: redialing would take it back,
    /// and the two would replace each other in turns, each hello ending
    /// the other's terminals.
    Replaced,
}

impl FatalEnd {
    fn with_host_id(self, host_id: &str) -> DaemonError {
        match self {
            FatalEnd::BadToken => DaemonError::BadToken,
            FatalEnd::ForeignHost => DaemonError::ForeignHost { host_id: host_id.to_owned() },
            FatalEnd::Replaced => DaemonError::Replaced { host_id: host_id.to_owned() },
        }
    }
}

/// The close-code policy, kept pure so it can be tested on its own.
fn decide(outcome: &SessionOutcome, reregistered: bool, drain_retry_used: bool) -> Decision {
    let SessionEnd::Closed(ServerClose { code: Some(code), reason }) = &outcome.end else {
        return Decision::BackOff;
    };
    match *code {
        close_code::BAD_TOKEN => Decision::Fatal(FatalEnd::BadToken),
        close_code::FOREIGN_HOST if reregistered => Decision::Fatal(FatalEnd::ForeignHost),
        close_code::FOREIGN_HOST => Decision::Reregister,
        close_code::DRAINING if !drain_retry_used => Decision::RedialAfterDrain,
        close_code::WRONG_CELL => Decision::Reassign(named_cell(reason.as_deref())),
        // Only another process can be told 4000 on this daemon's current
        // socket: its own redial replaces a socket it has already dropped.
        close_code::REPLACED => {
            tracing::warn!("tether_daemon_replaced");
            Decision::Fatal(FatalEnd::Replaced)
        }
        _ => Decision::BackOff,
    }
}

/// The cell a 4409's reason names: `wrong cell: URL`, or the URL alone
/// when it is too long for the prefix (`cell::admission::Verdict`). A
/// reason that names only a cell id gives none.
fn named_cell(reason: Option<&str>) -> Option<ServerUrl> {
    let reason = reason?.trim();
    let url = reason.strip_prefix("wrong cell:").map_or(reason, str::trim);
    ServerUrl::parse(url).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed(code: u16, established: bool) -> SessionOutcome {
        closed_with(code, None, established)
    }

    fn closed_with(code: u16, reason: Option<&str>, established: bool) -> SessionOutcome {
        let close = ServerClose { code: Some(code), reason: reason.map(str::to_owned) };
        SessionOutcome { established, lived: Duration::from_secs(1), end: SessionEnd::Closed(close) }
    }

    #[test]
    fn close_codes_map_to_the_spec_policy() {
        assert!(matches!(decide(&closed(4401, true), false, false), Decision::Fatal(FatalEnd::BadToken)));
        assert!(matches!(decide(&closed(4403, false), false, false), Decision::Reregister));
        assert!(matches!(decide(&closed(4403, false), true, false), Decision::Fatal(FatalEnd::ForeignHost)));
        assert!(matches!(decide(&closed(4503, true), false, false), Decision::RedialAfterDrain));
        assert!(matches!(decide(&closed(4503, false), false, true), Decision::BackOff));
        assert!(matches!(decide(&closed(4409, false), false, false), Decision::Reassign(None)));
        assert!(matches!(decide(&closed(4000, true), false, false), Decision::Fatal(FatalEnd::Replaced)));
        for code in [4429, 4408, 1000, 1011] {
            assert!(matches!(decide(&closed(code, true), false, false), Decision::BackOff), "{code}");
        }
        let lost = SessionOutcome {
            established: true,
            lived: Duration::from_secs(100),
            end: SessionEnd::Lost("eof".to_owned()),
        };
        assert!(matches!(decide(&lost, false, false), Decision::BackOff));
    }

    #[test]
    fn a_wrong_cell_close_names_the_cell_to_fall_back_on() {
        let named = |reason: &str| match decide(&closed_with(4409, Some(reason), false), false, false) {
            Decision::Reassign(url) => url.map(|url| url.to_string()),
            _ => panic!("4409 is a reassignment"),
        };
        assert_eq!(named("wrong cell: http://10.0.0.7:8080").as_deref(), Some("http://10.0.0.7:8080"));
        assert_eq!(named("https://cell-b.example.com/tether").as_deref(), Some("https://cell-b.example.com/tether"));
        assert_eq!(named("wrong cell: cell-b"), None, "a cell id alone is not somewhere to dial");
        assert_eq!(named(""), None);
    }
}
