//! The `DeadManController` actor (docs/CELLS.md, "The dead-man controller
//! and the writer"): it runs the plain rules of
//! [`super::deadman::DeadManController`] with real time. Its inputs are
//! contact (a seat-feed poll or a real booking, from [`CellState::contact`]),
//! the switch row [`super::switch_poll`] reads every `cell.switch_poll_ms`,
//! its own wakeups at the rules' next deadline, and the claim answers of
//! the [`CellAdmitEffectiveWriter`].
//!
//! What it does with the rules' actions:
//! - a slot claim goes to the writer (every write of the row goes there);
//! - held: `tether_cell_dead_man_held` is logged once per held episode;
//! - the trip voids the bookings and re-registers in relay_assignments the
//!   hosts admitted without a database read, a third of the full pool at a
//!   time, disconnecting no one ([`super::trip`]);
//! - a mode goes to the writer and sizes the pool: the reserve pool in
//!   `reserve`, the full pool in `db`.
//!
//! After each input it publishes the cell's status for admission, the seat
//! feed and `GET /api/v1/instance`.
//!
//! [`CellState::contact`]: super::state::CellState::contact

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::deadman::{self, DeadManAction, Switch};
use super::state::{CellState, CellStatus, Contact};
use super::writer::{CellAdmitEffectiveWriter, ClaimAnswer, ControllerInbox, RequestClaim, SetWanted, SlotLost};
use super::AdmitMode;
use crate::store::Store;

/// The switch row as read now.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct SwitchRead(pub Switch);

/// The pool sizes the cell runs at.
#[derive(Debug, Clone, Copy)]
pub struct PoolSizes {
    /// `database.pool_size`: db mode and after a trip.
    pub full: usize,
    /// `cell.reserve_pool_size`: reserve mode.
    pub reserve: usize,
}

pub struct DeadManController {
    rules: deadman::DeadManController,
    cell: Arc<CellState>,
    store: Arc<dyn Store>,
    writer: Option<Addr<CellAdmitEffectiveWriter>>,
    pools: PoolSizes,
    wakeup: Option<SpawnHandle>,
}

impl DeadManController {
    /// `window` from [`super::window::dead_man_window`], `held_retry` is
    /// `cell.held_retry_ms`, `switch` the row read at start.
    pub fn new(
        cell: Arc<CellState>,
        store: Arc<dyn Store>,
        pools: PoolSizes,
        window: Duration,
        held_retry: Duration,
        switch: Switch,
    ) -> Self {
        let rules = deadman::DeadManController::new(window, held_retry, switch, Instant::now());
        Self { rules, cell, store, writer: None, pools, wakeup: None }
    }

    /// The mode the cell starts in (the writer's first row).
    pub fn mode(&self) -> AdmitMode {
        self.rules.mode()
    }

    /// Starts the controller with its writer, each knowing the other.
    pub fn start_with_writer(self, writer: impl FnOnce(ControllerInbox) -> CellAdmitEffectiveWriter) -> Addr<Self> {
        let ctx = Context::new();
        let inbox = ControllerInbox { answers: ctx.address().recipient(), slot_lost: ctx.address().recipient() };
        let writer = writer(inbox).start();
        let mut controller = self;
        controller.writer = Some(writer);
        ctx.run(controller)
    }

    fn apply(&mut self, actions: Vec<DeadManAction>, ctx: &mut Context<Self>) {
        self.publish();
        for action in actions {
            match action {
                DeadManAction::ClaimSlot(permit) => self.to_writer(RequestClaim(permit)),
                DeadManAction::Trip => {
                    tracing::warn!(cell_id = %self.cell.cell_id, "tether_cell_dead_man_tripped");
                    metrics::counter!("tether_cell_trips_total").increment(1);
                    self.reregister();
                }
                DeadManAction::LogHeld => {
                    tracing::warn!(
                        cell_id = %self.cell.cell_id,
                        trip_slots = ?self.rules.switch().trip_slots,
                        "tether_cell_dead_man_held"
                    );
                }
                DeadManAction::Mode(mode) => {
                    // The operator switched this reserve cell to db: it
                    // admits by the database from now on, so, as a trip
                    // does, it writes the rows of the hosts it admitted
                    // without one; their next redial would otherwise be
                    // sent to whatever cell a stale row names (4409).
                    if mode == AdmitMode::Db && !self.rules.tripped() {
                        tracing::info!(cell_id = %self.cell.cell_id, "tether_cell_switched_to_db");
                        self.reregister();
                    }
                    self.to_writer(SetWanted(mode));
                    self.size_pool(mode);
                }
                DeadManAction::ClaimDropped { permit, reason } => {
                    tracing::info!(permit = permit.id, ?reason, "tether_cell_claim_dropped");
                }
            }
        }
        self.reschedule(ctx);
    }

    /// Voids the bookings and re-registers, in the background, the hosts
    /// seated here without a database read (`super::trip`).
    fn reregister(&self) {
        let voided = self.cell.seats().void_bookings();
        let batches = self.cell.seats().from_memory_batches(self.pools.full);
        actix_rt::spawn(super::trip::reregister(self.store.clone(), self.cell.clone(), voided, batches));
    }

    fn to_writer<M>(&self, msg: M)
    where
        M: Message<Result = ()> + Send + 'static,
        CellAdmitEffectiveWriter: Handler<M>,
    {
        if let Some(writer) = &self.writer {
            writer.do_send(msg);
        }
    }

    fn size_pool(&self, mode: AdmitMode) {
        let size = match mode {
            AdmitMode::Reserve => self.pools.reserve,
            AdmitMode::Db => self.pools.full,
        };
        self.store.resize_pool(size);
    }

    /// The status admission, the seat feed and the instance card read.
    fn publish(&self) {
        let status = CellStatus {
            switch: self.rules.switch().mode,
            mode: self.rules.mode(),
            tripped: self.rules.tripped(),
            held: self.rules.held(),
            trip_slots: self.rules.switch().trip_slots,
        };
        self.cell.set_status(status);
        for mode in [AdmitMode::Db, AdmitMode::Reserve] {
            let on = if status.mode == mode { 1.0 } else { 0.0 };
            metrics::gauge!("tether_cell_admit_mode", "mode" => mode.as_str()).set(on);
        }
        metrics::gauge!("tether_cell_tripped").set(if status.tripped { 1.0 } else { 0.0 });
        metrics::gauge!("tether_cell_held").set(if status.held { 1.0 } else { 0.0 });
    }

    /// Wakes the rules at their next deadline, if they have one.
    fn reschedule(&mut self, ctx: &mut Context<Self>) {
        if let Some(handle) = self.wakeup.take() {
            ctx.cancel_future(handle);
        }
        if let Some(at) = self.rules.next_wakeup() {
            let delay = at.saturating_duration_since(Instant::now());
            self.wakeup = Some(ctx.run_later(delay, |act, ctx| {
                act.wakeup = None;
                let actions = act.rules.tick(Instant::now());
                act.apply(actions, ctx);
            }));
        }
    }
}

impl Actor for DeadManController {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.size_pool(self.rules.mode());
        self.apply(Vec::new(), ctx);
    }
}

impl Handler<Contact> for DeadManController {
    type Result = ();
    fn handle(&mut self, msg: Contact, ctx: &mut Context<Self>) {
        self.rules.contact(msg.0);
        self.apply(Vec::new(), ctx);
    }
}

impl Handler<SwitchRead> for DeadManController {
    type Result = ();
    fn handle(&mut self, msg: SwitchRead, ctx: &mut Context<Self>) {
        let actions = self.rules.switch_read(Instant::now(), msg.0);
        self.apply(actions, ctx);
    }
}

impl Handler<SlotLost> for DeadManController {
    type Result = ();
    fn handle(&mut self, _: SlotLost, ctx: &mut Context<Self>) {
        let actions = self.rules.slot_lost(Instant::now());
        if !actions.is_empty() {
            tracing::warn!(
                cell_id = %self.cell.cell_id,
                trip_slots = ?self.rules.switch().trip_slots,
                "tether_cell_trip_slot_lost"
            );
        }
        self.apply(actions, ctx);
    }
}

impl Handler<ClaimAnswer> for DeadManController {
    type Result = ();
    fn handle(&mut self, msg: ClaimAnswer, ctx: &mut Context<Self>) {
        let ClaimAnswer(permit, outcome) = msg;
        let actions = self.rules.claim_outcome(permit, outcome, Instant::now());
        self.apply(actions, ctx);
    }
}
