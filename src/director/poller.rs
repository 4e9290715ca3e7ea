//! `CellPoller`, the director's actor that talks to the cells
//! (docs/CELLS.md, "Running a director"). Every `director.poll_ms` it reads
//! the registry (`Store::list_cells`) and polls each cell's seat feed
//! (`GET {url}/internal/v1/seats`, the cluster secret as the Bearer
//! credential); each answered poll is contact for that cell's dead-man
//! window. It also carries the bookings (`POST {url}/internal/v1/reserve`)
//! for `POST /v1/assign`, so one HTTP client and one [`Fleet`] serve both.
//!
//! A cell's poll is never overlapped by the next one: a cell that hangs is
//! polled again only once its request timed out (after
//! `director.fresh_ms`, by when it is stale anyway).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use super::fleet::Fleet;
use super::placement::CellState;
use crate::cell::bookings::{ReserveAnswer, ReserveItem};
use crate::cell::feed::{ReserveRequest, ReserveResponse, SeatFeed};
use crate::store::{CellView, Store, StoreError};

/// Largest seat feed or reserve answer read from a cell.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The director's clock, unix milliseconds.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Why a call to a cell failed.
#[derive(Debug, thiserror::Error)]
pub enum CellCallError {
    #[error("cannot reach the cell: {0}")]
    Transport(String),
    #[error("the cell answered HTTP {0}")]
    Status(u16),
    #[error("the cell's answer is unreadable: {0}")]
    BadAnswer(String),
    #[error("the cell is not registered")]
    Unknown,
}

pub struct CellPoller {
    store: Arc<dyn Store>,
    client: awc::Client,
    secret: String,
    poll: Duration,
    fleet: Fleet,
    /// A registry read is under way.
    listing: bool,
    /// Cells whose feed request is under way.
    in_flight: HashSet<String>,
    /// Cells whose last poll failed (their failure was logged once).
    failing: HashSet<String>,
}

impl CellPoller {
    /// `timeout` bounds each call to a cell (`director.fresh_ms`).
    pub fn new(
        store: Arc<dyn Store>,
        secret: String,
        poll: Duration,
        timeout: Duration,
    ) -> Result<Self, crate::tls::TlsError> {
        let client = crate::tls::http_client(None, timeout)?;
        Ok(Self {
            store,
            client,
            secret,
            poll,
            fleet: Fleet::default(),
            listing: false,
            in_flight: HashSet::new(),
            failing: HashSet::new(),
        })
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.listing {
            return;
        }
        self.listing = true;
        let store = self.store.clone();
        async move { (store.list_cells().await, now_ms()) }
            .into_actor(self)
            .map(|(read, at_ms), act, ctx| {
                act.listing = false;
                act.listed(read, at_ms, ctx);
            })
            .spawn(ctx);
    }

    fn listed(&mut self, read: Result<Vec<CellView>, StoreError>, at_ms: i64, ctx: &mut Context<Self>) {
        match read {
            Ok(views) => self.fleet.listed(&views, at_ms),
            // The last read stands; polls go on, so reserve cells keep their contact.
            Err(e) => tracing::warn!(error = %e, "tether_director_cells_read_failed"),
        }
        for (cell_id, url) in self.fleet.targets() {
            if !self.in_flight.insert(cell_id.clone()) {
                continue;
            }
            let request = self.client.get(format!("{}/internal/v1/seats", url.trim_end_matches('/')));
            let request = request.bearer_auth(&self.secret);
            async move { (read_json::<SeatFeed>(request.send().await).await, now_ms()) }
                .into_actor(self)
                .map(move |(answer, at_ms), act, _| act.polled(&cell_id, answer, at_ms))
                .spawn(ctx);
        }
    }

    fn polled(&mut self, cell_id: &str, answer: Result<SeatFeed, CellCallError>, at_ms: i64) {
        self.in_flight.remove(cell_id);
        let result = answer.and_then(|feed| {
            self.fleet.polled(cell_id, &feed, at_ms).map_err(|e| CellCallError::BadAnswer(e.to_string()))
        });
        match result {
            Ok(()) => {
                metrics::counter!("tether_director_polls_total", "result" => "ok").increment(1);
                if self.failing.remove(cell_id) {
                    tracing::info!(cell_id, "tether_director_cell_answering");
                }
            }
            Err(e) => {
                metrics::counter!("tether_director_polls_total", "result" => "failed").increment(1);
                if self.failing.insert(cell_id.to_owned()) {
                    tracing::warn!(cell_id, error = %e, "tether_director_cell_poll_failed");
                }
            }
        }
    }
}

impl Actor for CellPoller {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.tick(ctx);
        ctx.run_interval(self.poll, |act, ctx| act.tick(ctx));
    }
}

/// What the director knows of every cell now.
#[derive(Debug, Clone)]
pub struct FleetSnapshot {
    pub cells: Vec<CellState>,
    /// Each cell's base url, in the order of `cells`.
    pub urls: Vec<String>,
    /// The director's clock when the snapshot was taken.
    pub now_ms: i64,
}

impl FleetSnapshot {
    pub fn url(&self, cell_id: &str) -> Option<&str> {
        self.cells.iter().position(|cell| cell.cell_id == cell_id).map(|at| self.urls[at].as_str())
    }
}

/// Asks for a [`FleetSnapshot`].
#[derive(Message)]
#[rtype(result = "FleetSnapshot")]
pub struct Snapshot;

impl Handler<Snapshot> for CellPoller {
    type Result = MessageResult<Snapshot>;

    fn handle(&mut self, _: Snapshot, _: &mut Context<Self>) -> Self::Result {
        let mut cells = self.fleet.states();
        for cell in &mut cells {
            cell.poll_failing = self.failing.contains(&cell.cell_id);
        }
        let urls = cells.iter().map(|cell| self.fleet.url(&cell.cell_id).unwrap_or_default().to_owned()).collect();
        MessageResult(FleetSnapshot { cells, urls, now_ms: now_ms() })
    }
}

/// Books one host on a cell; an `ok` counts against the cell until its next feed.
#[derive(Message)]
#[rtype(result = "Result<ReserveAnswer, CellCallError>")]
pub struct Book {
    pub cell_id: String,
    pub item: ReserveItem,
}

impl Handler<Book> for CellPoller {
    type Result = ResponseActFuture<Self, Result<ReserveAnswer, CellCallError>>;

    fn handle(&mut self, msg: Book, _: &mut Context<Self>) -> Self::Result {
        let Some(url) = self.fleet.url(&msg.cell_id) else {
            return Box::pin(fut::ready(Err(CellCallError::Unknown)));
        };
        let host_id = msg.item.host_id;
        let request = self
            .client
            .post(format!("{}/internal/v1/reserve", url.trim_end_matches('/')))
            .bearer_auth(&self.secret)
            .send_json(&ReserveRequest { items: vec![msg.item] });
        let cell_id = msg.cell_id;
        Box::pin(async move { read_json::<ReserveResponse>(request.await).await }.into_actor(self).map(
            move |answer, act, _| {
                let result = answer?
                    .results
                    .into_iter()
                    .find(|result| result.host_id == host_id)
                    .map(|result| result.answer)
                    .ok_or_else(|| CellCallError::BadAnswer("no result for the host".into()))?;
                if result == ReserveAnswer::Ok {
                    act.fleet.booked(&cell_id);
                }
                Ok(result)
            },
        ))
    }
}

type Sent = Result<awc::ClientResponse, awc::error::SendRequestError>;

/// A cell's JSON answer, or why there is none.
async fn read_json<T: serde::de::DeserializeOwned>(sent: Sent) -> Result<T, CellCallError> {
    let mut response = sent.map_err(|e| CellCallError::Transport(crate::tls::explain(&e)))?;
    if !response.status().is_success() {
        return Err(CellCallError::Status(response.status().as_u16()));
    }
    response.json::<T>().limit(MAX_ANSWER_BYTES).await.map_err(|e| CellCallError::BadAnswer(e.to_string()))
}
