//! Asking where to dial: `POST {server}/v1/assign` (docs/CLI.md, "The
//! daemon"; docs/CELLS.md, "What a daemon does"). A server that runs a
//! director answers with a cell's URL and, for a booking, the epoch and
//! ticket the daemon presents in its hello; a server without one answers
//! 404 and the daemon dials the server itself, as it always did.

use serde::Serialize;

use super::server_url::{BadServerUrl, ServerUrl};
use crate::cell::feed::AssignAnswer;
use crate::proto::v1::Booking;

/// Where the next connections go.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub url: ServerUrl,
    /// The director's booking, presented in every hello to this target
    /// (a redial at the same epoch is admitted from memory).
    pub booking: Option<Booking>,
}

/// Why the director gave no target. Only `BadToken` is fatal.
#[derive(Debug, thiserror::Error)]
pub enum AssignError {
    #[error("the server refused the token")]
    BadToken,
    #[error("the director answered HTTP {status} ({code})")]
    Status { status: u16, code: String },
    #[error("cannot reach the server: {0}")]
    Transport(String),
    #[error("unexpected assign answer: {0}")]
    BadResponse(String),
    #[error(transparent)]
    BadCellUrl(#[from] BadServerUrl),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AssignRequest<'a> {
    host_id: &'a str,
}

/// Where `host_id` dials: the cell the director placed it on, or the
/// server itself when the server runs no director.
pub async fn ask(client: &awc::Client, server: &ServerUrl, token: &str, host_id: &str) -> Result<Target, AssignError> {
    let mut response = client
        .post(server.assign_endpoint())
        .bearer_auth(token)
        .send_json(&AssignRequest { host_id })
        .await
        .map_err(|err| AssignError::Transport(crate::tls::explain(&err)))?;
    let status = response.status();
    if status == awc::http::StatusCode::NOT_FOUND {
        return Ok(Target { url: server.clone(), booking: None });
    }
    if status == awc::http::StatusCode::UNAUTHORIZED {
        return Err(AssignError::BadToken);
    }
    if !status.is_success() {
        return Err(AssignError::Status {
            status: status.as_u16(),
            code: super::registration::error_code(&mut response).await.unwrap_or_else(|| "no error code".to_owned()),
        });
    }
    let answer: AssignAnswer = response.json().await.map_err(|err| AssignError::BadResponse(err.to_string()))?;
    target_of(answer)
}

/// The target an answer names; a booking only when it carries a ticket.
fn target_of(answer: AssignAnswer) -> Result<Target, AssignError> {
    let url = ServerUrl::parse(&answer.cell_url)?;
    let booking = match answer.ticket.is_empty() {
        true => None,
        false => {
            let epoch = u64::try_from(answer.epoch)
                .map_err(|_| AssignError::BadResponse(format!("epoch {} is negative", answer.epoch)))?;
            Some(Booking { epoch, ticket: answer.ticket })
        }
    };
    Ok(Target { url, booking })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(url: &str, epoch: i64, ticket: &str) -> AssignAnswer {
        AssignAnswer {
            cell_id: "cell-a".into(),
            cell_url: url.into(),
            epoch,
            ticket: ticket.into(),
            expires_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn a_ticket_becomes_the_hellos_booking_and_no_ticket_none() {
        let booked = target_of(answer("http://10.0.0.7:8080", 3, "dGlja2V0")).expect("target");
        assert_eq!(booked.url, ServerUrl::parse("http://10.0.0.7:8080").expect("url"));
        assert_eq!(booked.booking, Some(Booking { epoch: 3, ticket: "dGlja2V0".into() }));
        let placed = target_of(answer("https://relay-2.example.com/", 4, "")).expect("target");
        assert_eq!(placed.booking, None);
        assert!(matches!(target_of(answer("relay-2:8080", 4, "")), Err(AssignError::BadCellUrl(_))));
        assert!(matches!(target_of(answer("http://relay-2", -1, "t")), Err(AssignError::BadResponse(_))));
    }
}
