//! The effective writer's rules (docs/CELLS.md, "The effective row"), as
//! plain state: when the cell writes its own `relay_cell_admit_effective`
//! row, and when it may claim a trip slot.
//!
//! Every write of the row goes through the `CellAdmitEffectiveWriter` actor,
//! the slot claim included (the claim writes the row `db` when it wins), and
//! the actor starts only the operations this state hands it:
//! - it writes the mode the cell wants on the first tick, at once when
//!   that mode changes, and again every `cell.effective_refresh_ms`;
//! - at most one operation (write or claim) is in flight; a claim asked for
//!   while a write is in flight waits for it, so a `reserve` write can
//!   never land after a claim and undo it;
//! - while the pool has waiters it skips writes (the row can wait; the
//!   hellos cannot), except that a `db` row older than
//!   `cell.effective_forced_ms` is written anyway: a tripped cell's row
//!   must stay fresher than `cell.slot_stale_ms`, or its slot would be
//!   counted free while it still admits through the database;
//! - it does not claim while the pool has waiters or the switch is off
//!   `reserve`: such a claim is answered busy at once, and the dead-man
//!   controller asks again after `cell.held_retry_ms`;
//! - a failed write is retried on the next tick (not at once, which would
//!   spin against a failing database), and failures are logged at most once
//!   a minute.
//!
//! A won claim is recorded as a `db` row and makes `db` the wanted mode: the
//! controller either trips (and wants `db` too) or drops the win and asks
//! for its own mode back ([`super::deadman`]).

use std::time::{Duration, Instant};

use super::deadman::{ClaimOutcome, Permit};
use super::AdmitMode;

/// Failures are logged at most this often.
pub const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// What the cell's pool and switch look like when an operation could start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditions {
    /// Callers waiting for a connection of the cell's database pool.
    pub pool_waiters: usize,
    /// The mode the operator's switch says.
    pub switch: AdmitMode,
}

/// A store call on the effective row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Write the row with this mode.
    Write(AdmitMode),
    /// Claim a trip slot (docs/CELLS.md, "The slot claim").
    Claim(Permit),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriterAction {
    /// Start this operation; report its end with [`EffectiveWriter::write_done`]
    /// or [`EffectiveWriter::claim_done`].
    Start(Operation),
    /// Hand this claim outcome to the dead-man controller.
    Answer(Permit, ClaimOutcome),
    /// An operation failed and a minute has passed since the last failure
    /// was logged: log this one.
    LogFailure,
}

#[derive(Debug, Clone, Copy)]
struct Row {
    mode: AdmitMode,
    /// When the write that made it started: the row's own time is the
    /// database's at the statement, so the period counts from there.
    written_at: Instant,
}

/// How often the writer looks whether a refresh is due: a due refresh is
/// late by at most this (a quarter of the period, at most 1 s); a change
/// of mode is written at once, not on a tick.
pub fn tick_for(refresh: Duration) -> Duration {
    (refresh / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

#[derive(Debug)]
pub struct EffectiveWriter {
    refresh: Duration,
    forced: Duration,
    wanted: AdmitMode,
    /// The row as this cell last wrote it.
    row: Option<Row>,
    /// Ages a row never written.
    started: Instant,
    in_flight: Option<Operation>,
    /// When the write in flight started.
    write_started: Option<Instant>,
    queued_claim: Option<Permit>,
    failure_logged_at: Option<Instant>,
}

impl EffectiveWriter {
    /// `refresh` is `cell.effective_refresh_ms`, `forced` is
    /// `cell.effective_forced_ms`; `wanted` the mode the cell starts in.
    pub fn new(refresh: Duration, forced: Duration, wanted: AdmitMode, now: Instant) -> Self {
        Self {
            refresh,
            forced,
            wanted,
            row: None,
            started: now,
            in_flight: None,
            write_started: None,
            queued_claim: None,
            failure_logged_at: None,
        }
    }

    /// The mode the row should say.
    pub fn wanted(&self) -> AdmitMode {
        self.wanted
    }

    /// The mode and time of the last successful write (or won claim).
    pub fn written(&self) -> Option<(AdmitMode, Instant)> {
        self.row.map(|row| (row.mode, row.written_at))
    }

    pub fn in_flight(&self) -> Option<Operation> {
        self.in_flight
    }

    /// The refresh timer: writes the row if it is due.
    pub fn tick(&mut self, now: Instant, conditions: Conditions) -> Vec<WriterAction> {
        if self.in_flight.is_some() {
            return Vec::new();
        }
        self.write_if_due(now, conditions).into_iter().collect()
    }

    /// The cell's mode changed (or is asserted again): written at once
    /// unless an operation is in flight, then right after it.
    pub fn set_wanted(&mut self, mode: AdmitMode, now: Instant, conditions: Conditions) -> Vec<WriterAction> {
        self.wanted = mode;
        self.tick(now, conditions)
    }

    /// The dead-man controller asks for a slot claim. Every permit is
    /// answered exactly once: by the claim, or busy when it cannot run (or
    /// a newer permit replaced it while it waited).
    pub fn request_claim(&mut self, permit: Permit, conditions: Conditions) -> Vec<WriterAction> {
        if !Self::may_claim(conditions) {
            return vec![WriterAction::Answer(permit, ClaimOutcome::Busy)];
        }
        if self.in_flight.is_some() {
            return self
                .queued_claim
                .replace(permit)
                .map(|older| WriterAction::Answer(older, ClaimOutcome::Busy))
                .into_iter()
                .collect();
        }
        self.start(Operation::Claim(permit))
    }

    /// The write started by [`WriterAction::Start`] ended.
    pub fn write_done(&mut self, now: Instant, succeeded: bool, conditions: Conditions) -> Vec<WriterAction> {
        let mut actions = Vec::new();
        if let Some(Operation::Write(mode)) = self.in_flight.take() {
            let started = self.write_started.take().unwrap_or(now);
            if succeeded {
                self.row = Some(Row { mode, written_at: started });
            } else {
                actions.extend(self.failed(now));
            }
        }
        actions.extend(self.after_operation(now, succeeded, conditions));
        actions
    }

    /// The claim started by [`WriterAction::Start`] ended; `None` if it
    /// failed (answered busy: the controller retries after its held delay).
    pub fn claim_done(
        &mut self,
        now: Instant,
        outcome: Option<ClaimOutcome>,
        conditions: Conditions,
    ) -> Vec<WriterAction> {
        let mut actions = Vec::new();
        if let Some(Operation::Claim(permit)) = self.in_flight.take() {
            match outcome {
                Some(ClaimOutcome::Won) => {
                    self.row = Some(Row { mode: AdmitMode::Db, written_at: now });
                    self.wanted = AdmitMode::Db;
                }
                Some(_) => {}
                None => actions.extend(self.failed(now)),
            }
            actions.push(WriterAction::Answer(permit, outcome.unwrap_or(ClaimOutcome::Busy)));
        }
        actions.extend(self.after_operation(now, outcome.is_some(), conditions));
        actions
    }

    /// Next after an operation: the claim that waited for it, else a change
    /// of mode that came in meanwhile (after a failure, the next tick).
    fn after_operation(&mut self, now: Instant, succeeded: bool, conditions: Conditions) -> Vec<WriterAction> {
        if let Some(permit) = self.queued_claim.take() {
            if !Self::may_claim(conditions) {
                return vec![WriterAction::Answer(permit, ClaimOutcome::Busy)];
            }
            return self.start(Operation::Claim(permit));
        }
        let changed = self.row.is_none_or(|row| row.mode != self.wanted);
        if succeeded && changed {
            return self.write_if_due(now, conditions).into_iter().collect();
        }
        Vec::new()
    }

    fn write_if_due(&mut self, now: Instant, conditions: Conditions) -> Option<WriterAction> {
        let due = match self.row {
            None => true,
            Some(row) => row.mode != self.wanted || now.duration_since(row.written_at) >= self.refresh,
        };
        if !due {
            return None;
        }
        if conditions.pool_waiters > 0 {
            let age = now.duration_since(self.row.map_or(self.started, |row| row.written_at));
            if !(self.wanted == AdmitMode::Db && age >= self.forced) {
                return None;
            }
        }
        self.write_started = Some(now);
        self.start(Operation::Write(self.wanted)).pop()
    }

    fn start(&mut self, operation: Operation) -> Vec<WriterAction> {
        self.in_flight = Some(operation);
        vec![WriterAction::Start(operation)]
    }

    fn may_claim(conditions: Conditions) -> bool {
        conditions.pool_waiters == 0 && conditions.switch == AdmitMode::Reserve
    }

    fn failed(&mut self, now: Instant) -> Option<WriterAction> {
        let log = self.failure_logged_at.is_none_or(|at| now.duration_since(at) >= FAILURE_LOG_INTERVAL);
        if log {
            self.failure_logged_at = Some(now);
            return Some(WriterAction::LogFailure);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::deadman::{DeadManAction, DeadManController, Switch};
    use super::*;

    const REFRESH: Duration = Duration::from_secs(15);
    const FORCED: Duration = Duration::from_secs(300);
    const CALM: Conditions = Conditions { pool_waiters: 0, switch: AdmitMode::Reserve };
    const SATURATED: Conditions = Conditions { pool_waiters: 3, switch: AdmitMode::Reserve };

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn permit(id: u64) -> Permit {
        Permit { id, silence: 1, generation: 1, slots: 2 }
    }

    fn write(mode: AdmitMode) -> Vec<WriterAction> {
        vec![WriterAction::Start(Operation::Write(mode))]
    }

    #[test]
    fn writes_on_the_first_tick_then_every_refresh() {
        let t0 = Instant::now();
        let mut w = EffectiveWriter::new(REFRESH, FORCED, AdmitMode::Reserve, t0);
        assert_eq!(w.tick(t0, CALM), write(AdmitMode::Reserve));
        assert!(w.tick(t0 + secs(1), CALM).is_empty(), "one write in flight");
        assert!(w.write_done(t0 + secs(1), true, CALM).is_empty());
        // The period counts from when the write began, not when it ended
        // (counted from the end, every period came a tick late).
        assert!(w.tick(t0 + REFRESH - tick_for(REFRESH), CALM).is_empty());
        assert_eq!(w.tick(t0 + REFRESH, CALM), write(AdmitMode::Reserve));
    }

    #[test]
    fn a_change_is_written_at_once_or_right_after_the_write_in_flight() {
        let t0 = Instant::now();
        let mut w = EffectiveWriter::new(REFRESH, FORCED, AdmitMode::Reserve, t0);
        w.tick(t0, CALM);
        assert!(w.set_wanted(AdmitMode::Db, t0, CALM).is_empty());
        assert_eq!(w.write_done(t0 + secs(1), true, CALM), write(AdmitMode::Db));
        w.write_done(t0 + secs(2), true, CALM);
        assert_eq!(w.set_wanted(AdmitMode::Reserve, t0 + secs(3), CALM), write(AdmitMode::Reserve));
    }

    #[test]
    fn a_claim_waits_for_an_in_flight_reserve_write() {
        let t0 = Instant::now();
        let mut w = EffectiveWriter::new(REFRESH, FORCED, AdmitMode::Reserve, t0);
        assert_eq!(w.tick(t0, CALM), write(AdmitMode::Reserve));
        assert!(w.request_claim(permit(1), CALM).is_empty(), "the claim waits");
        assert_eq!(w.write_done(t0 + secs(1), true, CALM), vec![WriterAction::Start(Operation::Claim(permit(1)))]);
        // Nothing else starts while the claim runs, however late it is.
        assert!(w.tick(t0 + secs(60), CALM).is_empty());
        assert_eq!(
            w.claim_done(t0 + secs(60), Some(ClaimOutcome::Won), CALM),
            vec![WriterAction::Answer(permit(1), ClaimOutcome::Won)]
        );
        assert_eq!(w.written(), Some((AdmitMode::Db, t0 + secs(60))));
        // The refresh after a won claim writes db, never reserve.
        assert_eq!(w.tick(t0 + secs(75), CALM), write(AdmitMode::Db));
    }

    #[test]
    fn a_newer_permit_replaces_a_waiting_one_which_is_answered_busy() {
        let t0 = Instant::now();
        let mut w = EffectiveWriter::new(REFRESH, FORCED, AdmitMode::Reserve, t0);
        w.tick(t0, CALM);
        w.request_claim(permit(1), CALM);
        assert_eq!(w.request_claim(permit(2), CALM), vec![WriterAction::Answer(permit(1), ClaimOutcome::Busy)]);
        assert_eq!(w.write_done(t0, true, CALM), vec![WriterAction::Start(Operation::Claim(permit(2)))]);
    }

    #[test]
    fn no_claim_while_the_pool_has_waiters_or_the_switch_is_off_reserve() {
        let t0 = Instant::now();
        let mut w = EffectiveWriter::new(REFRESH, FORCED, AdmitMode::Reserve, t0);
        let busy = vec![WriterAction::Answer(permit(1), ClaimOutcome::Busy)];
        assert_eq!(w.request_claim(permit(1), SATURATED), busy);
        let switched = Conditions { pool_waiters: 0, switch: AdmitMode::Db };
        assert_eq!(w.request_claim(permit(1), switched), busy);
        assert_eq!(w.in_flight(), None);
        // A claim that waited is checked again when its turn comes.
        w.tick(t0, CALM);
        assert!(w.request_claim(permit(1), CALM).is_empty());
        assert_eq!(w.write_done(t0 + secs(1), true, SATURATED), busy);
        assert_eq!(w.in_flight(), None);
    }

    #[test]
    fn a_tripped_row_is_refreshed_past_a_saturated_pool_after_five_minutes_a_reserve_row_is_not() {
        let t0 = Instant::now();
        let mut reserve = EffectiveWriter::new(REFRESH, FORCED, AdmitMode::Reserve, t0);
        reserve.tick(t0, CALM);
        reserve.write_done(t0, true, CALM);
        let mut tripped = EffectiveWriter::new(REFRESH, FORCED, AdmitMode::Reserve, t0);
        tripped.request_claim(permit(1), CALM);
        tripped.claim_done(t0, Some(ClaimOutcome::Won), CALM);

        let mut now = t0;
        while now < t0 + FORCED - secs(1) {
            now += secs(1);
            assert!(reserve.tick(now, SATURATED).is_empty());
            assert!(tripped.tick(now, SATURATED).is_empty(), "a db row younger than 5 min waits too");
        }
        assert_eq!(tripped.tick(t0 + FORCED, SATURATED), write(AdmitMode::Db));
        for minute in 5..=20 {
            assert!(reserve.tick(t0 + secs(60 * minute), SATURATED).is_empty());
        }
    }

    #[test]
    fn failures_are_retried_on_the_next_tick_and_logged_once_a_minute() {
        let t0 = Instant::now();
        let mut w = EffectiveWriter::new(REFRESH, FORCED, AdmitMode::Reserve, t0);
        let mut logged = Vec::new();
        for s in 0..=130 {
            let now = t0 + secs(s);
            assert_eq!(w.tick(now, CALM), write(AdmitMode::Reserve), "retried at {s} s");
            if w.write_done(now, false, CALM) == vec![WriterAction::LogFailure] {
                logged.push(s);
            }
        }
        assert_eq!(logged, vec![0, 60, 120]);
        assert_eq!(w.written(), None);
        // A failed claim is answered busy, and the failure counts for the log.
        w.request_claim(permit(1), CALM);
        assert_eq!(w.claim_done(t0 + secs(131), None, CALM), vec![WriterAction::Answer(permit(1), ClaimOutcome::Busy)]);
    }

    /// The store as the claim sees it: one slot, held by another cell.
    struct SlotTakenElsewhere {
        deadman: DeadManController,
        writer: EffectiveWriter,
        started: Vec<(Duration, Operation)>,
        t0: Instant,
    }

    impl SlotTakenElsewhere {
        fn run(&mut self, now: Instant, mut actions: Vec<WriterAction>) {
            while let Some(action) = actions.pop() {
                match action {
                    WriterAction::Start(op) => {
                        self.started.push((now - self.t0, op));
                        actions.extend(match op {
                            Operation::Write(_) => self.writer.write_done(now, true, CALM),
                            Operation::Claim(_) => self.writer.claim_done(now, Some(ClaimOutcome::Refused), CALM),
                        });
                    }
                    WriterAction::Answer(permit, outcome) => {
                        let from_deadman = self.deadman.claim_outcome(permit, outcome, now);
                        actions.extend(self.apply(now, from_deadman));
                    }
                    WriterAction::LogFailure => {}
                }
            }
        }

        fn apply(&mut self, now: Instant, actions: Vec<DeadManAction>) -> Vec<WriterAction> {
            let mut out = Vec::new();
            for action in actions {
                match action {
                    DeadManAction::ClaimSlot(permit) => out.extend(self.writer.request_claim(permit, CALM)),
                    DeadManAction::Mode(mode) => out.extend(self.writer.set_wanted(mode, now, CALM)),
                    DeadManAction::Trip => panic!("tripped without a slot"),
                    DeadManAction::LogHeld | DeadManAction::ClaimDropped { .. } => {}
                }
            }
            out
        }
    }

    #[test]
    fn a_refused_claim_keeps_the_reserve_row_fresh_and_retries_after_thirty_seconds() {
        let t0 = Instant::now();
        let window = secs(90);
        let switch = Switch { mode: AdmitMode::Reserve, trip_slots: Some(1), generation: 1 };
        let mut cell = SlotTakenElsewhere {
            deadman: DeadManController::new(window, secs(30), switch, t0),
            writer: EffectiveWriter::new(REFRESH, FORCED, AdmitMode::Reserve, t0),
            started: Vec::new(),
            t0,
        };
        for s in 0..=240 {
            let now = t0 + secs(s);
            let from_deadman = cell.deadman.tick(now);
            let actions = cell.apply(now, from_deadman);
            cell.run(now, actions);
            let actions = cell.writer.tick(now, CALM);
            cell.run(now, actions);
        }
        let claims: Vec<u64> = cell
            .started
            .iter()
            .filter(|(_, op)| matches!(op, Operation::Claim(_)))
            .map(|(at, _)| at.as_secs())
            .collect();
        assert_eq!(claims, vec![90, 120, 150, 180, 210, 240]);
        let writes: Vec<(u64, AdmitMode)> = cell
            .started
            .iter()
            .filter_map(|(at, op)| match op {
                Operation::Write(mode) => Some((at.as_secs(), *mode)),
                Operation::Claim(_) => None,
            })
            .collect();
        assert!(writes.iter().all(|(_, mode)| *mode == AdmitMode::Reserve), "{writes:?}");
        let times: Vec<u64> = writes.iter().map(|(at, _)| *at).collect();
        assert_eq!(times, (0..=240).step_by(15).collect::<Vec<_>>(), "refreshed every 15 s");
        assert!(cell.deadman.held());
    }
}
