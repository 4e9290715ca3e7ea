//! A plain TCP load balancer for failover tests: it forwards every
//! connection to the current backend, and `switch` moves it to another one
//! and cuts the connections it carries (as a balancer does when a backend
//! is taken out), so clients redial and land on the new backend; `outage`
//! takes the backend away for a while; `route` sends only new connections
//! elsewhere; `switch_keeping_backends` cuts only the clients' side, so the
//! old backend still holds its end of each connection (a half-open
//! connection, as after a network split) and what it sends there is kept;
//! `stall` freezes the connections it carries (open, nothing forwarded
//! either way, as on a path that silently stopped) while new ones go through.

use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Balancer {
    pub addr: String,
    backend: Arc<Mutex<String>>,
    cut: watch::Sender<u64>,
    /// Where a cut puts the backends' ends it keeps open, if it keeps them.
    keep: Arc<Mutex<Option<Orphans>>>,
    stall: watch::Sender<u64>,
    /// Stalled connections, both ends, held open for the balancer's life.
    stalled: Arc<Mutex<Vec<(TcpStream, TcpStream)>>>,
}

/// The backends' ends of connections whose clients' ends were cut, and
/// everything each backend sent on its end afterwards.
#[derive(Clone, Default)]
pub struct Orphans(Arc<Mutex<Vec<Orphan>>>);

#[derive(Clone, Debug, Default)]
pub struct Orphan {
    /// Bytes the backend sent after the cut.
    pub received: Vec<u8>,
    /// The backend closed its end.
    pub ended: bool,
}

impl Orphans {
    /// Keeps `server` open and records what it sends until it closes.
    async fn adopt(&self, mut server: TcpStream) {
        let index = {
            let mut all = self.0.lock().expect("orphans");
            all.push(Orphan::default());
            all.len() - 1
        };
        let mut buffer = [0u8; 4096];
        loop {
            match server.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => self.0.lock().expect("orphans")[index].received.extend_from_slice(&buffer[..n]),
            }
        }
        self.0.lock().expect("orphans")[index].ended = true;
    }

    /// What became of each kept connection so far.
    pub fn snapshot(&self) -> Vec<Orphan> {
        self.0.lock().expect("orphans").clone()
    }
}

impl Orphan {
    /// The code of the WebSocket close frame the server sent on this
    /// connection after the cut, if one came. Server frames are not masked;
    /// the cut was at a frame boundary when the connection was quiet.
    pub fn websocket_close_code(&self) -> Option<u16> {
        let mut rest = self.received.as_slice();
        while rest.len() >= 2 {
            let opcode = rest[0] & 0x0f;
            let masked = rest[1] & 0x80 != 0;
            let (len, mut at) = match rest[1] & 0x7f {
                126 if rest.len() >= 4 => (u16::from_be_bytes([rest[2], rest[3]]) as usize, 4),
                127 if rest.len() >= 10 => {
                    (u64::from_be_bytes(rest[2..10].try_into().expect("eight bytes")) as usize, 10)
                }
                126 | 127 => return None,
                len => (len as usize, 2),
            };
            if masked {
                at += 4;
            }
            let payload = rest.get(at..at + len)?;
            if opcode == 0x8 && payload.len() >= 2 {
                return Some(u16::from_be_bytes([payload[0], payload[1]]));
            }
            rest = &rest[at + len..];
        }
        None
    }
}

impl Balancer {
    /// Listens on a free loopback port, forwarding to `backend` (host:port).
    pub async fn start(backend: &str) -> Balancer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the balancer");
        let addr = listener.local_addr().expect("balancer address").to_string();
        let backend = Arc::new(Mutex::new(backend.to_string()));
        let (cut, _) = watch::channel(0u64);
        let keep: Arc<Mutex<Option<Orphans>>> = Arc::default();
        let (stall, _) = watch::channel(0u64);
        let stalled: Arc<Mutex<Vec<(TcpStream, TcpStream)>>> = Arc::default();
        let (target, cuts, kept) = (backend.clone(), cut.clone(), keep.clone());
        let (stalls, held) = (stall.clone(), stalled.clone());
        actix_rt::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let to = target.lock().expect("backend").clone();
                if to.is_empty() {
                    continue; // down: the connection is dropped at once
                }
                let mut cut = cuts.subscribe();
                let mut stall = stalls.subscribe();
                let (kept, held) = (kept.clone(), held.clone());
                actix_rt::spawn(async move {
                    let Ok(server) = TcpStream::connect(&to).await else { return };
                    let (mut client, mut server) = (client, server);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => return,
                        _ = stall.changed() => {
                            held.lock().expect("stalled").push((client, server));
                            return;
                        }
                        _ = cut.changed() => {}
                    }
                    drop(client);
                    let orphans = kept.lock().expect("kept").clone();
                    if let Some(orphans) = orphans {
                        orphans.adopt(server).await;
                    }
                });
            }
        });
        Balancer { addr, backend, cut, keep, stall, stalled }
    }

    /// [`start`](Self::start) on a thread of its own, for a test whose own
    /// thread blocks (one that drives the CLI through a PTY): it forwards
    /// while the test waits.
    pub fn start_on_own_thread(backend: &str) -> Balancer {
        let backend = backend.to_string();
        let (started, balancer) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                started.send(Balancer::start(&backend).await).expect("the test waits for its balancer");
                std::future::pending::<()>().await;
            });
        });
        balancer.recv().expect("the balancer's thread started it")
    }

    /// The URL clients dial.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// New connections go to `backend`; the current ones are cut.
    pub fn switch(&self, backend: &str) {
        *self.keep.lock().expect("kept") = None;
        self.route(backend);
        self.cut.send_modify(|n| *n += 1);
    }

    /// New connections go to `backend`; the current ones are left alone.
    pub fn route(&self, backend: &str) {
        *self.backend.lock().expect("backend") = backend.to_string();
    }

    /// New connections go to `backend`; the current ones are cut on the
    /// clients' side only: their backends keep their ends open, and what
    /// they send there is recorded in the answer.
    pub fn switch_keeping_backends(&self, backend: &str) -> Orphans {
        let orphans = Orphans::default();
        *self.keep.lock().expect("kept") = Some(orphans.clone());
        self.route(backend);
        self.cut.send_modify(|n| *n += 1);
        orphans
    }

    /// Freezes every current connection: both ends stay open and nothing
    /// more is forwarded either way. New connections go through.
    pub fn stall(&self) {
        self.stall.send_modify(|n| *n += 1);
    }

    /// Cuts every connection and refuses new ones for `outage`, then
    /// forwards to the same backend again.
    pub async fn outage(&self, outage: std::time::Duration) {
        *self.keep.lock().expect("kept") = None;
        let backend = std::mem::take(&mut *self.backend.lock().expect("backend"));
        self.cut.send_modify(|n| *n += 1);
        tokio::time::sleep(outage).await;
        *self.backend.lock().expect("backend") = backend;
    }
}
