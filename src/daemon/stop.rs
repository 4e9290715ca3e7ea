//! A stop the daemon was asked for (`tether daemon` on SIGTERM or SIGINT;
//! docs/PROTOCOL.md, "Stopping the daemon").
//!
//! A daemon's terminals cannot outlive it: it holds their PTYs. So a stop
//! hangs them up (SIGHUP to each process group), kills what is left after
//! `HANGUP_GRACE` (SIGKILL), and, when it is connected, reports each ending
//! (Snapshot, Exit, Usage) and waits for the server to confirm them before
//! it closes the socket with 1000. Viewers then see the exit, runs end with
//! their status, and nothing is left running where tether cannot reach it.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

/// How long terminals have to end after SIGHUP before they get SIGKILL.
pub const HANGUP_GRACE: Duration = Duration::from_secs(3);
/// After SIGKILL: how long the stop waits for the last endings to be reaped
/// and confirmed before the daemon exits regardless.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// Whether a stop was asked for; clones see the same request.
#[derive(Clone)]
pub struct Stop(watch::Receiver<bool>);

impl Stop {
    /// A stop that comes when `asked` resolves (never, if it never does).
    pub fn when(asked: impl Future<Output = ()> + 'static) -> Self {
        let (tx, rx) = watch::channel(false);
        // Ends with the daemon (every receiver dropped), asked or not.
        actix_rt::spawn(async move {
            tokio::select! {
                () = asked => {
                    let _ = tx.send(true);
                    tx.closed().await;
                }
                () = tx.closed() => {}
            }
        });
        Self(rx)
    }

    pub fn requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once a stop is asked for.
    pub async fn asked(&mut self) {
        if self.0.wait_for(|asked| *asked).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// `work`, unless a stop is asked for first (None).
    pub async fn or_stop<F: Future>(&mut self, work: F) -> Option<F::Output> {
        tokio::select! {
            done = work => Some(done),
            () = self.asked() => None,
        }
    }
}
