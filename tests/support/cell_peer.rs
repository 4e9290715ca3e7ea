//! A scripted relay cell for director tests: an HTTP server in the test
//! that answers `GET /internal/v1/seats` and `POST /internal/v1/reserve`
//! as a cell would (the wire types are the crate's own,
//! `tether::cell::feed`), with what it answers set by the test, and that
//! records what it was asked. Anything without the cluster secret is 401.

use std::sync::Mutex;
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use tether::cell::bookings::{ReserveAnswer, ReserveItem, SeatFigures};
use tether::cell::feed::{ReserveRequest, ReserveResponse, ReserveResult, SeatFeed};
use tether::cell::AdmitMode;

/// How long `wait_polls` waits before it fails the test.
const WAIT: Duration = Duration::from_secs(60);

struct Script {
    /// The seat feed answers (else 503, as a hung or failing cell).
    answering: bool,
    seats: usize,
    reserve_answer: ReserveAnswer,
    polls: u32,
    unauthorized: u32,
    reserves: Vec<ReserveItem>,
}

struct Peer {
    cell_id: String,
    secret: String,
    script: Mutex<Script>,
}

pub struct CellPeer {
    pub url: String,
    peer: web::Data<Peer>,
}

impl CellPeer {
    /// Starts a peer for `cell_id` that answers its feed with `seats` seats
    /// and every booking `ok`.
    pub async fn start(cell_id: &str, secret: &str, seats: usize) -> CellPeer {
        let peer = web::Data::new(Peer {
            cell_id: cell_id.to_owned(),
            secret: secret.to_owned(),
            script: Mutex::new(Script {
                answering: true,
                seats,
                reserve_answer: ReserveAnswer::Ok,
                polls: 0,
                unauthorized: 0,
                reserves: Vec::new(),
            }),
        });
        let data = peer.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .route("/internal/v1/seats", web::get().to(seats_feed))
                .route("/internal/v1/reserve", web::post().to(reserve))
        })
        .workers(1)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .expect("bind a cell peer");
        let url = format!("http://{}", server.addrs()[0]);
        actix_web::rt::spawn(server.run());
        CellPeer { url, peer }
    }

    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.peer.script.lock().expect("script")
    }

    /// Whether the seat feed answers (false: 503 from now on).
    pub fn set_answering(&self, answering: bool) {
        self.script().answering = answering;
    }

    pub fn set_reserve_answer(&self, answer: ReserveAnswer) {
        self.script().reserve_answer = answer;
    }

    /// How many seat-feed polls arrived (answered or not).
    pub fn polls(&self) -> u32 {
        self.script().polls
    }

    /// Every booking asked of this cell, in order.
    pub fn reserves(&self) -> Vec<ReserveItem> {
        self.script().reserves.clone()
    }

    /// Calls that came without the cluster secret.
    pub fn unauthorized(&self) -> u32 {
        self.script().unauthorized
    }

    /// Waits until `more` further polls have arrived.
    pub async fn wait_polls(&self, more: u32) {
        let target = self.polls() + more;
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.polls() < target {
            assert!(
                tokio::time::Instant::now() < deadline,
                "cell {} was not polled {more} more times",
                self.peer.cell_id
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn authorized(peer: &Peer, req: &HttpRequest) -> bool {
    let presented = req.headers().get("authorization").and_then(|v| v.to_str().ok());
    let ok = presented == Some(format!("Bearer {}", peer.secret).as_str());
    if !ok {
        peer.script.lock().expect("script").unauthorized += 1;
    }
    ok
}

async fn seats_feed(peer: web::Data<Peer>, req: HttpRequest) -> HttpResponse {
    if !authorized(&peer, &req) {
        return HttpResponse::Unauthorized().finish();
    }
    let mut script = peer.script.lock().expect("script");
    script.polls += 1;
    if !script.answering {
        return HttpResponse::ServiceUnavailable().finish();
    }
    HttpResponse::Ok().json(SeatFeed {
        cell_id: peer.cell_id.clone(),
        mode: AdmitMode::Reserve,
        tripped: false,
        held: false,
        draining: false,
        capacity: 64,
        figures: SeatFigures { seats: script.seats, bookings: 0 },
    })
}

async fn reserve(peer: web::Data<Peer>, req: HttpRequest, body: web::Json<ReserveRequest>) -> HttpResponse {
    if !authorized(&peer, &req) {
        return HttpResponse::Unauthorized().finish();
    }
    let mut script = peer.script.lock().expect("script");
    let answer = script.reserve_answer;
    script.reserves.extend(body.items.iter().copied());
    let results = body.items.iter().map(|item| ReserveResult { host_id: item.host_id, answer }).collect();
    HttpResponse::Ok().json(ReserveResponse { results })
}
