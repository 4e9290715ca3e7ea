//! A plain TCP load balancer for failover tests: it forwards every
//! connection to the current backend, and `switch` moves it to another one
//! and cuts the connections it carries (as a balancer does when a backend
//! is taken out), so clients redial and land on the new backend; `outage`
//! takes the backend away for a while.

use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Balancer {
    pub addr: String,
    backend: Arc<Mutex<String>>,
    cut: watch::Sender<u64>,
}

impl Balancer {
    /// Listens on a free loopback port, forwarding to `backend` (host:port).
    pub async fn start(backend: &str) -> Balancer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the balancer");
        let addr = listener.local_addr().expect("balancer address").to_string();
        let backend = Arc::new(Mutex::new(backend.to_string()));
        let (cut, _) = watch::channel(0u64);
        let (target, cuts) = (backend.clone(), cut.clone());
        actix_rt::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let to = target.lock().expect("backend").clone();
                if to.is_empty() {
                    continue; // down: the connection is dropped at once
                }
                let mut cut = cuts.subscribe();
                actix_rt::spawn(async move {
                    let Ok(server) = TcpStream::connect(&to).await else { return };
                    let (mut client, mut server) = (client, server);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Balancer { addr, backend, cut }
    }

    /// The URL clients dial.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// New connections go to `backend`; the current ones are cut.
    pub fn switch(&self, backend: &str) {
        *self.backend.lock().expect("backend") = backend.to_string();
        self.cut.send_modify(|n| *n += 1);
    }

    /// Cuts every connection and refuses new ones for `outage`, then
    /// forwards to the same backend again.
    pub async fn outage(&self, outage: std::time::Duration) {
        let backend = std::mem::take(&mut *self.backend.lock().expect("backend"));
        self.cut.send_modify(|n| *n += 1);
        tokio::time::sleep(outage).await;
        *self.backend.lock().expect("backend") = backend;
    }
}
