//! `RunDispatcher`: claims queued runs of the hosts connected to this
//! instance (`FOR UPDATE SKIP LOCKED` on PostgreSQL, a write transaction on
//! SQLite, so two instances never take the same run) and dispatches each
//! as a terminal whose output the terminal's arbiter captures into the
//! run's log until it exits (docs/REST.md, "Runs").
//!
//! It looks every second, and at once when nudged (a run was queued for a
//! host here, or a host connected). A look reads which hosts have queued
//! runs and claims only for those of them connected here, so an idle look
//! is one read of an empty queue however many hosts are connected. A run
//! whose host is offline stays queued until the host returns.

use std::time::Duration;

use actix::prelude::*;

use crate::relay::registry::ConnectedAmong;
use crate::relay::requests::{deliver, HostOp};
use crate::relay::RelayContext;
use crate::store::{NewTerminal, Run};

/// Runs claimed per look.
const BATCH: usize = 16;

pub struct RunDispatcher {
    relay: RelayContext,
    busy: bool,
    again: bool,
}

impl RunDispatcher {
    pub fn new(relay: RelayContext) -> Self {
        Self { relay, busy: false, again: false }
    }

    fn look(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            self.again = true;
            return;
        }
        self.busy = true;
        let relay = self.relay.clone();
        async move {
            // The queue first: with nothing queued (the usual tick) this is
            // the only statement, whatever the number of connected hosts.
            let queued = match relay.store.queued_run_hosts().await {
                Ok(queued) if queued.is_empty() => return false,
                Ok(queued) => queued,
                Err(e) => {
                    tracing::warn!(error = %e, "tether_runs_claim_failed");
                    return false;
                }
            };
            let hosts = relay.registry.send(ConnectedAmong(queued)).await.unwrap_or_default();
            let runs = match relay.store.claim_queued_runs(&hosts, BATCH).await {
                Ok(runs) => runs,
                Err(e) => {
                    tracing::warn!(error = %e, "tether_runs_claim_failed");
                    return false;
                }
            };
            let full = runs.len() == BATCH;
            for run in runs {
                if let Err(e) = dispatch(&relay, run).await {
                    tracing::error!(error = %e, "tether_run_dispatch_failed");
                }
            }
            full
        }
        .into_actor(self)
        .map(|more, act, ctx| {
            act.busy = false;
            if more || std::mem::take(&mut act.again) {
                act.look(ctx);
            }
        })
        .spawn(ctx);
    }
}

/// Creates the run's terminal, starts its capture and asks the daemon to spawn it.
async fn dispatch(relay: &RelayContext, run: Run) -> Result<(), crate::store::StoreError> {
    // Not counted against the terminal caps again: the queued run held its place.
    let terminal = relay
        .store
        .insert_terminal(
            &NewTerminal {
                user_id: run.user_id,
                host_id: run.host_id,
                title: Some(format!("run {}", run.id)),
                dir: run.dir.clone(),
                argv: run.argv.clone(),
                cols: 80,
                rows: 24,
                run_id: Some(run.id),
            },
            None,
        )
        .await?;
    relay.store.set_run_terminal(run.id, terminal.id).await?;
    tracing::info!(run_id = %run.id, terminal_id = %terminal.id, "tether_run_dispatched");
    // The connection attaches the output capture right behind the Spawn. If
    // the host left meanwhile the terminal stays parked and is spawned (and
    // captured) when the host returns.
    let _ = deliver(relay, run.host_id, HostOp::Spawn(terminal.id)).await;
    Ok(())
}

impl Actor for RunDispatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(Duration::from_secs(1), |act, ctx| act.look(ctx));
    }
}

/// Look for work now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Nudge;

impl Handler<Nudge> for RunDispatcher {
    type Result = ();
    fn handle(&mut self, _: Nudge, ctx: &mut Context<Self>) {
        self.look(ctx);
    }
}
