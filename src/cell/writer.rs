//! The `CellAdmitEffectiveWriter` actor (docs/CELLS.md, "The dead-man
//! controller and the writer"): the only writer of this cell's
//! `relay_cell_admit_effective` row. Its mailbox serialises every write of
//! the row, the trip-slot claim included, so a `reserve` write in flight
//! can never land after a claim and undo it.
//!
//! It runs the plain rules of [`super::effective::EffectiveWriter`] with real
//! time, the store and the pool: it ticks a few times per
//! `cell.effective_refresh_ms`, reads the pool's waiters from
//! `Store::pool_status` and the switch from the cell's status, starts the
//! store calls the rules hand it, and answers every claim to the dead-man
//! controller.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::deadman::{ClaimOutcome, Permit};
use super::effective::{Conditions, EffectiveWriter, Operation, WriterAction};
use super::state::CellState;
use super::AdmitMode;
use crate::store::{SlotClaim, Store};

/// The outcome of a claim, for the dead-man controller.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct ClaimAnswer(pub Permit, pub ClaimOutcome);

/// The mode the row must say from now on.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct SetWanted(pub AdmitMode);

/// A tripped cell's refresh found its trip slot taken: another cell
/// claimed it while this cell's row was stale (the process was frozen
/// past `cell.slot_stale_ms`, say), and the slots are all held.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct SlotLost;

/// Where the writer reports to the dead-man controller.
pub struct ControllerInbox {
    pub answers: Recipient<ClaimAnswer>,
    pub slot_lost: Recipient<SlotLost>,
}

/// Claim a trip slot under the permit.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct RequestClaim(pub Permit);

pub struct CellAdmitEffectiveWriter {
    rules: EffectiveWriter,
    cell: Arc<CellState>,
    store: Arc<dyn Store>,
    controller: Recipient<ClaimAnswer>,
    slot_lost: Recipient<SlotLost>,
    /// `cell.slot_stale_ms`: how fresh another holder's row must be.
    slot_stale: Duration,
    tick: Duration,
    /// The last failure, logged at most once a minute.
    last_error: Option<String>,
}

impl CellAdmitEffectiveWriter {
    /// `refresh`/`forced` are `cell.effective_refresh_ms` and
    /// `cell.effective_forced_ms`; `wanted` the mode the cell starts in.
    pub fn new(
        cell: Arc<CellState>,
        store: Arc<dyn Store>,
        controller: ControllerInbox,
        refresh: Duration,
        forced: Duration,
        slot_stale: Duration,
        wanted: AdmitMode,
    ) -> Self {
        let tick = super::effective::tick_for(refresh);
        Self {
            rules: EffectiveWriter::new(refresh, forced, wanted, Instant::now()),
            cell,
            store,
            controller: controller.answers,
            slot_lost: controller.slot_lost,
            slot_stale,
            tick,
            last_error: None,
        }
    }

    fn conditions(&self) -> Conditions {
        Conditions { pool_waiters: self.store.pool_status().waiting, switch: self.cell.status().switch }
    }

    fn run(&mut self, actions: Vec<WriterAction>, ctx: &mut Context<Self>) {
        for action in actions {
            match action {
                WriterAction::Start(Operation::Write(mode)) => self.write(mode, ctx),
                WriterAction::Start(Operation::Claim(permit)) => self.claim(permit, ctx),
                WriterAction::Answer(permit, outcome) => self.controller.do_send(ClaimAnswer(permit, outcome)),
                WriterAction::LogFailure => {
                    let error = self.last_error.as_deref().unwrap_or("unknown");
                    tracing::warn!(error, cell_id = %self.cell.cell_id, "tether_cell_effective_write_failed");
                }
            }
        }
    }

    /// Writes the row. A tripped cell with a slot cap refreshes its `db`
    /// row as a claim (one transaction: count the other holders, write only
    /// below the cap): a row that went stale counted as a free slot, and a
    /// cell that lost it so must not go on holding its full pool.
    fn write(&mut self, mode: AdmitMode, ctx: &mut Context<Self>) {
        let (store, cell, fresh) = (self.store.clone(), self.cell.clone(), self.slot_stale);
        let status = cell.status();
        let recheck = match status.trip_slots {
            Some(slots) if mode == AdmitMode::Db && status.tripped && slots > 0 => Some(slots),
            _ => None,
        };
        let write = async move {
            match recheck {
                Some(slots) => store.claim_trip_slot(&cell.cell_id, &cell.incarnation, slots, fresh).await,
                None => {
                    store.write_cell_effective(&cell.cell_id, mode, &cell.incarnation).await.map(|()| SlotClaim::Won)
                }
            }
        };
        ctx.spawn(write.into_actor(self).map(|result, act, ctx| {
            let succeeded = match result {
                Ok(SlotClaim::Won) => true,
                Ok(SlotClaim::Refused { holders }) => {
                    tracing::info!(holders, "tether_cell_slot_refused");
                    act.slot_lost.do_send(SlotLost);
                    true
                }
                Ok(SlotClaim::Busy) => {
                    act.last_error = Some("another slot claim held the lock".into());
                    false
                }
                Err(e) => {
                    act.last_error = Some(e.to_string());
                    false
                }
            };
            let actions = act.rules.write_done(Instant::now(), succeeded, act.conditions());
            act.run(actions, ctx);
        }));
    }

    fn claim(&mut self, permit: Permit, ctx: &mut Context<Self>) {
        let (store, cell, fresh) = (self.store.clone(), self.cell.clone(), self.slot_stale);
        let claim = async move { store.claim_trip_slot(&cell.cell_id, &cell.incarnation, permit.slots, fresh).await };
        ctx.spawn(claim.into_actor(self).map(move |result, act, ctx| {
            let (outcome, label) = match result {
                Ok(SlotClaim::Won) => (Some(ClaimOutcome::Won), "won"),
                Ok(SlotClaim::Refused { holders }) => {
                    tracing::info!(holders, slots = permit.slots, "tether_cell_slot_refused");
                    (Some(ClaimOutcome::Refused), "refused")
                }
                Ok(SlotClaim::Busy) => (Some(ClaimOutcome::Busy), "busy"),
                Err(e) => {
                    act.last_error = Some(e.to_string());
                    (None, "failed")
                }
            };
            metrics::counter!("tether_cell_slot_claims_total", "outcome" => label).increment(1);
            let actions = act.rules.claim_done(Instant::now(), outcome, act.conditions());
            act.run(actions, ctx);
        }));
    }
}

impl Actor for CellAdmitEffectiveWriter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let actions = self.rules.tick(Instant::now(), self.conditions());
        self.run(actions, ctx);
        ctx.run_interval(self.tick, |act, ctx| {
            let actions = act.rules.tick(Instant::now(), act.conditions());
            act.run(actions, ctx);
        });
    }
}

impl Handler<SetWanted> for CellAdmitEffectiveWriter {
    type Result = ();
    fn handle(&mut self, msg: SetWanted, ctx: &mut Context<Self>) {
        let actions = self.rules.set_wanted(msg.0, Instant::now(), self.conditions());
        self.run(actions, ctx);
    }
}

impl Handler<RequestClaim> for CellAdmitEffectiveWriter {
    type Result = ();
    fn handle(&mut self, msg: RequestClaim, ctx: &mut Context<Self>) {
        let actions = self.rules.request_claim(msg.0, self.conditions());
        self.run(actions, ctx);
    }
}
