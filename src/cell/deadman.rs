//! The dead-man controller's rules (docs/CELLS.md, "The dead-man trip"), as
//! plain state: it decides when a reserve cell that no longer hears from the
//! director falls back to database admission, and when it must not.
//!
//! The cell's `DeadManController` actor feeds it contact (a seat-feed poll
//! or a real booking), the switch row it reads every `cell.switch_poll_ms`,
//! ticks, and the outcomes of the slot claims it asked for; it executes the
//! [`DeadManAction`]s that come back. Every input carries `now`, so tests
//! walk through half an hour of outage without waiting.
//!
//! - Only in reserve mode: while the switch says `db` the controller is off.
//! - Contact restarts the window ([`super::window`]) and ends the current
//!   silence. When the window passes without contact:
//!   - without `dead_man_trip_slots` (NULL) the cell trips at once;
//!   - with the flag it asks for a slot ([`DeadManAction::ClaimSlot`]) and
//!     trips only on a won claim; with a flag of 0 it never asks and never
//!     trips;
//!   - a refused or busy claim leaves the cell held: it stays reserve,
//!     logs `tether_cell_dead_man_held` once per held episode, and asks
//!     again every `cell.held_retry_ms`.
//! - A trip is latched: contact does not undo it. Only a new switch
//!   generation re-arms the cell (its row goes back to `reserve`, which
//!   frees the slot) and starts a new window.
//! - A claim outcome is applied only to the claim the controller is
//!   waiting for. One for a silence that contact already ended, or for an
//!   earlier switch generation, is dropped. The writer records a won claim
//!   as a `db` row; when such a win is dropped, the controller answers with
//!   its own mode again ([`DeadManAction::Mode`], `reserve` unless it has
//!   since tripped or been switched to db), so the writer puts the row back
//!   and the slot it took is freed.

use std::time::{Duration, Instant};

use super::AdmitMode;

/// The operator's switch for this cell (`relay_cell_admit_modes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switch {
    pub mode: AdmitMode,
    /// `dead_man_trip_slots`: `None` is NULL (no cap).
    pub trip_slots: Option<u8>,
    /// Bumped by every write of the switch row.
    pub generation: i64,
}

/// The right to ask for a trip slot, naming the silence and the switch
/// generation it was issued in and the cap to claim under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Permit {
    pub id: u64,
    pub silence: u64,
    pub generation: i64,
    pub slots: u8,
}

/// What a slot claim came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Fewer than `slots` other cells held one: this cell's row now says db.
    Won,
    /// The slots were all held by other cells; nothing was written.
    Refused,
    /// The claim was not decided (another claim held the lock, the pool had
    /// waiters, or the database failed); nothing was written.
    Busy,
}

/// Why a claim outcome was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The permit was issued under an earlier switch generation.
    OldGeneration,
    /// Contact ended the silence the permit was issued in.
    SilenceEnded,
    /// The controller was not waiting for this permit (already answered).
    NotAwaited,
}

/// What the actor must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadManAction {
    /// Ask the effective writer to claim a trip slot under `permit.slots`
    /// and report the outcome with the permit.
    ClaimSlot(Permit),
    /// Trip: void the bookings and re-register the hosts admitted from
    /// memory (a third of the pool at a time, disconnecting no one).
    Trip,
    /// Log `tether_cell_dead_man_held` (once per held episode).
    LogHeld,
    /// The mode the cell admits in from now on and its effective row must
    /// say: hand it to the writer, and size the pool for it (the reserve
    /// pool in `reserve`, the full pool in `db`).
    Mode(AdmitMode),
    /// A claim outcome that no longer applied (for the log).
    ClaimDropped { permit: Permit, reason: DropReason },
}

/// Where the controller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The switch says db: database admission, no window.
    Off,
    /// Reserve, with the window running.
    Armed,
    /// Reserve, the window has passed: a claim is out, or the cell is held.
    Silent,
    /// Tripped to database admission, latched until a new generation.
    Tripped,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Off,
    Armed { deadline: Instant },
    Silent { awaiting: Option<Permit>, retry_at: Option<Instant>, held: bool },
    Tripped,
}

#[derive(Debug)]
pub struct DeadManController {
    window: Duration,
    held_retry: Duration,
    switch: Switch,
    /// Counts silences: every contact and every re-arm starts a new one.
    silence: u64,
    next_permit: u64,
    state: State,
}

impl DeadManController {
    /// `window` from [`super::window::dead_man_window`]; `held_retry` is
    /// `cell.held_retry_ms`; `switch` is the row read at start.
    pub fn new(window: Duration, held_retry: Duration, switch: Switch, now: Instant) -> Self {
        let state = match switch.mode {
            AdmitMode::Reserve => State::Armed { deadline: now + window },
            AdmitMode::Db => State::Off,
        };
        Self { window, held_retry, switch, silence: 0, next_permit: 0, state }
    }

    pub fn phase(&self) -> Phase {
        match self.state {
            State::Off => Phase::Off,
            State::Armed { .. } => Phase::Armed,
            State::Silent { .. } => Phase::Silent,
            State::Tripped => Phase::Tripped,
        }
    }

    /// Held: the window passed, and no slot was had (yet).
    pub fn held(&self) -> bool {
        matches!(self.state, State::Silent { held: true, .. })
    }

    pub fn tripped(&self) -> bool {
        matches!(self.state, State::Tripped)
    }

    /// The mode the cell admits in, which its effective row must say.
    pub fn mode(&self) -> AdmitMode {
        match self.state {
            State::Off | State::Tripped => AdmitMode::Db,
            State::Armed { .. } | State::Silent { .. } => AdmitMode::Reserve,
        }
    }

    pub fn switch(&self) -> Switch {
        self.switch
    }

    /// When the actor must call [`Self::tick`] next, if anything is due.
    pub fn next_wakeup(&self) -> Option<Instant> {
        match self.state {
            State::Armed { deadline } => Some(deadline),
            State::Silent { retry_at, .. } => retry_at,
            State::Off | State::Tripped => None,
        }
    }

    /// The director was heard from (a seat-feed poll or a real booking):
    /// the window restarts and any silence, held or claiming, ends. A trip
    /// stays latched.
    pub fn contact(&mut self, now: Instant) {
        self.silence += 1;
        if let State::Armed { .. } | State::Silent { .. } = self.state {
            self.state = State::Armed { deadline: now + self.window };
        }
    }

    /// The switch row as read now. Only a newer generation changes
    /// anything: to `db` turns the controller off; to `reserve` re-arms a
    /// tripped or off cell with a fresh window; while silent, it asks
    /// again at once under the new cap (the earlier permit is now for an
    /// old generation).
    pub fn switch_read(&mut self, now: Instant, switch: Switch) -> Vec<DeadManAction> {
        if switch.generation <= self.switch.generation {
            return Vec::new();
        }
        self.switch = switch;
        match (switch.mode, self.state) {
            (AdmitMode::Db, State::Off | State::Tripped) => {
                self.state = State::Off;
                Vec::new()
            }
            (AdmitMode::Db, State::Armed { .. } | State::Silent { .. }) => {
                self.state = State::Off;
                vec![DeadManAction::Mode(AdmitMode::Db)]
            }
            (AdmitMode::Reserve, State::Off | State::Tripped) => {
                self.silence += 1;
                self.state = State::Armed { deadline: now + self.window };
                vec![DeadManAction::Mode(AdmitMode::Reserve)]
            }
            (AdmitMode::Reserve, State::Armed { .. }) => Vec::new(),
            (AdmitMode::Reserve, State::Silent { held, .. }) => self.ask(now, held),
        }
    }

    /// Time passed: the window may have passed, or a held retry be due.
    pub fn tick(&mut self, now: Instant) -> Vec<DeadManAction> {
        match self.state {
            State::Armed { deadline } if now >= deadline => self.ask(now, false),
            State::Silent { awaiting: None, retry_at: Some(at), held } if now >= at => self.ask(now, held),
            _ => Vec::new(),
        }
    }

    /// The tripped cell's slot was found taken at a refresh of its row
    /// (`super::writer::SlotLost`): it is held, back in reserve mode, and
    /// asks for a slot again every `cell.held_retry_ms`.
    pub fn slot_lost(&mut self, now: Instant) -> Vec<DeadManAction> {
        if !matches!(self.state, State::Tripped) || self.switch.mode != AdmitMode::Reserve {
            return Vec::new();
        }
        let mut actions = self.hold(now, false);
        actions.push(DeadManAction::Mode(AdmitMode::Reserve));
        actions
    }

    /// The outcome of the claim made under `permit`.
    pub fn claim_outcome(&mut self, permit: Permit, outcome: ClaimOutcome, now: Instant) -> Vec<DeadManAction> {
        if let State::Silent { awaiting: Some(awaited), held, .. } = self.state {
            if awaited == permit {
                return match outcome {
                    ClaimOutcome::Won => self.trip(),
                    ClaimOutcome::Refused | ClaimOutcome::Busy => self.hold(now, held),
                };
            }
        }
        let reason = if permit.generation != self.switch.generation {
            DropReason::OldGeneration
        } else if permit.silence != self.silence {
            DropReason::SilenceEnded
        } else {
            DropReason::NotAwaited
        };
        let mut actions = vec![DeadManAction::ClaimDropped { permit, reason }];
        if outcome == ClaimOutcome::Won {
            // The writer took the win as a db row; restore what this cell is.
            actions.push(DeadManAction::Mode(self.mode()));
        }
        actions
    }

    /// The window has passed (or a held retry is due, or the cap changed):
    /// trip, hold or claim, by the flag.
    fn ask(&mut self, now: Instant, held: bool) -> Vec<DeadManAction> {
        match self.switch.trip_slots {
            None => self.trip(),
            Some(0) => self.hold(now, held),
            Some(slots) => {
                self.next_permit += 1;
                let permit =
                    Permit { id: self.next_permit, silence: self.silence, generation: self.switch.generation, slots };
                self.state = State::Silent { awaiting: Some(permit), retry_at: None, held };
                vec![DeadManAction::ClaimSlot(permit)]
            }
        }
    }

    fn hold(&mut self, now: Instant, already_held: bool) -> Vec<DeadManAction> {
        self.state = State::Silent { awaiting: None, retry_at: Some(now + self.held_retry), held: true };
        if already_held {
            Vec::new()
        } else {
            vec![DeadManAction::LogHeld]
        }
    }

    fn trip(&mut self) -> Vec<DeadManAction> {
        self.state = State::Tripped;
        vec![DeadManAction::Trip, DeadManAction::Mode(AdmitMode::Db)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(90);
    const RETRY: Duration = Duration::from_secs(30);

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn reserve(trip_slots: Option<u8>, generation: i64) -> Switch {
        Switch { mode: AdmitMode::Reserve, trip_slots, generation }
    }

    fn controller(trip_slots: Option<u8>, t0: Instant) -> DeadManController {
        DeadManController::new(WINDOW, RETRY, reserve(trip_slots, 1), t0)
    }

    fn claim(actions: &[DeadManAction]) -> Permit {
        match actions {
            [DeadManAction::ClaimSlot(permit)] => *permit,
            other => panic!("expected one claim, got {other:?}"),
        }
    }

    #[test]
    fn without_the_flag_the_cell_trips_when_the_window_passes() {
        let t0 = Instant::now();
        let mut dm = controller(None, t0);
        assert_eq!(dm.next_wakeup(), Some(t0 + WINDOW));
        assert!(dm.tick(t0 + WINDOW - Duration::from_millis(1)).is_empty());
        assert_eq!(dm.tick(t0 + WINDOW), vec![DeadManAction::Trip, DeadManAction::Mode(AdmitMode::Db)]);
        assert!(dm.tripped());
        assert_eq!(dm.mode(), AdmitMode::Db);
    }

    #[test]
    fn a_tripped_cell_that_lost_its_slot_is_held_and_asks_again() {
        let t0 = Instant::now();
        let mut dm = controller(Some(1), t0);
        let permit = claim(&dm.tick(t0 + WINDOW));
        let t1 = t0 + WINDOW + secs(1);
        assert_eq!(
            dm.claim_outcome(permit, ClaimOutcome::Won, t1),
            vec![DeadManAction::Trip, DeadManAction::Mode(AdmitMode::Db)]
        );
        let t2 = t1 + secs(700);
        assert_eq!(dm.slot_lost(t2), vec![DeadManAction::LogHeld, DeadManAction::Mode(AdmitMode::Reserve)]);
        assert!(dm.held() && !dm.tripped());
        assert_eq!(dm.mode(), AdmitMode::Reserve);
        assert!(dm.slot_lost(t2).is_empty(), "only a tripped cell loses a slot");
        claim(&dm.tick(t2 + RETRY));
    }

    #[test]
    fn contact_restarts_the_window() {
        let t0 = Instant::now();
        let mut dm = controller(None, t0);
        dm.contact(t0 + secs(60));
        assert!(dm.tick(t0 + WINDOW).is_empty());
        assert_eq!(dm.next_wakeup(), Some(t0 + secs(60) + WINDOW));
        assert!(!dm.tick(t0 + secs(60) + WINDOW).is_empty());
    }

    #[test]
    fn with_the_flag_the_cell_is_held_until_a_permit_then_latched() {
        let t0 = Instant::now();
        let mut dm = controller(Some(2), t0);
        let first = claim(&dm.tick(t0 + WINDOW));
        assert_eq!((first.slots, first.generation), (2, 1));
        assert_eq!(dm.mode(), AdmitMode::Reserve, "no trip before the claim is won");

        let t1 = t0 + WINDOW + secs(1);
        assert_eq!(dm.claim_outcome(first, ClaimOutcome::Refused, t1), vec![DeadManAction::LogHeld]);
        assert!(dm.held());
        assert_eq!(dm.mode(), AdmitMode::Reserve);
        assert!(dm.tick(t1 + RETRY - Duration::from_millis(1)).is_empty());
        let second = claim(&dm.tick(t1 + RETRY));
        assert_ne!(second, first);
        let t2 = t1 + RETRY + secs(1);
        assert!(dm.claim_outcome(second, ClaimOutcome::Busy, t2).is_empty(), "held is logged once");
        let third = claim(&dm.tick(t2 + RETRY));
        assert_eq!(
            dm.claim_outcome(third, ClaimOutcome::Won, t2 + RETRY),
            vec![DeadManAction::Trip, DeadManAction::Mode(AdmitMode::Db)]
        );
        assert!(dm.tripped() && !dm.held());

        // The director comes back: the trip stays latched.
        dm.contact(t2 + secs(100));
        assert!(dm.tick(t2 + secs(1000)).is_empty());
        assert!(dm.tripped());
        assert_eq!(dm.mode(), AdmitMode::Db);
        assert_eq!(dm.next_wakeup(), None);
    }

    #[test]
    fn slot_zero_rides_out_thirty_minutes_without_tripping() {
        let t0 = Instant::now();
        let mut dm = controller(Some(0), t0);
        let mut actions = Vec::new();
        let mut now = t0;
        while now < t0 + secs(30 * 60) {
            now += secs(5);
            actions.extend(dm.tick(now));
        }
        assert_eq!(actions, vec![DeadManAction::LogHeld], "held once, no claim, no trip");
        assert!(dm.held());
        assert_eq!(dm.mode(), AdmitMode::Reserve);
    }

    #[test]
    fn contact_ends_a_held_episode_and_the_next_one_logs_again() {
        let t0 = Instant::now();
        let mut dm = controller(Some(0), t0);
        assert_eq!(dm.tick(t0 + WINDOW), vec![DeadManAction::LogHeld]);
        dm.contact(t0 + WINDOW + secs(10));
        assert_eq!(dm.phase(), Phase::Armed);
        assert!(!dm.held());
        assert_eq!(dm.tick(t0 + 2 * WINDOW + secs(10)), vec![DeadManAction::LogHeld]);
    }

    #[test]
    fn a_permit_for_a_silence_contact_ended_is_dropped() {
        let t0 = Instant::now();
        let mut dm = controller(Some(1), t0);
        let permit = claim(&dm.tick(t0 + WINDOW));
        dm.contact(t0 + WINDOW + secs(1));
        let dropped = DeadManAction::ClaimDropped { permit, reason: DropReason::SilenceEnded };
        // A won claim is dropped too, and the row is put back to reserve.
        assert_eq!(
            dm.claim_outcome(permit, ClaimOutcome::Won, t0 + WINDOW + secs(2)),
            vec![dropped, DeadManAction::Mode(AdmitMode::Reserve)]
        );
        assert_eq!(dm.phase(), Phase::Armed);
        assert_eq!(dm.claim_outcome(permit, ClaimOutcome::Refused, t0 + WINDOW + secs(2)), vec![dropped]);
        assert!(!dm.held(), "a refusal for an ended silence does not hold the cell");
    }

    #[test]
    fn a_permit_for_an_old_generation_is_dropped() {
        let t0 = Instant::now();
        let mut dm = controller(Some(1), t0);
        let old = claim(&dm.tick(t0 + WINDOW));
        // The operator raises the cap mid-silence: the cell asks again at once.
        let new = claim(&dm.switch_read(t0 + WINDOW + secs(1), reserve(Some(3), 2)));
        assert_eq!((new.generation, new.slots), (2, 3));
        assert_eq!(
            dm.claim_outcome(old, ClaimOutcome::Won, t0 + WINDOW + secs(2)),
            vec![
                DeadManAction::ClaimDropped { permit: old, reason: DropReason::OldGeneration },
                DeadManAction::Mode(AdmitMode::Reserve)
            ]
        );
        assert!(!dm.tripped());
        assert_eq!(dm.claim_outcome(new, ClaimOutcome::Refused, t0 + WINDOW + secs(2)), vec![DeadManAction::LogHeld]);
    }

    #[test]
    fn a_dropped_win_after_the_trip_keeps_the_row_db() {
        let t0 = Instant::now();
        let mut dm = controller(Some(1), t0);
        let first = claim(&dm.tick(t0 + WINDOW));
        dm.contact(t0 + WINDOW + secs(1));
        let second = claim(&dm.tick(t0 + 2 * WINDOW + secs(1)));
        dm.claim_outcome(second, ClaimOutcome::Won, t0 + 2 * WINDOW + secs(2));
        assert_eq!(
            dm.claim_outcome(first, ClaimOutcome::Won, t0 + 2 * WINDOW + secs(3)),
            vec![
                DeadManAction::ClaimDropped { permit: first, reason: DropReason::SilenceEnded },
                DeadManAction::Mode(AdmitMode::Db)
            ]
        );
        assert!(dm.tripped());
    }

    #[test]
    fn a_new_generation_re_arms_a_tripped_cell() {
        let t0 = Instant::now();
        let mut dm = controller(None, t0);
        dm.tick(t0 + WINDOW);
        assert!(dm.tripped());
        let t1 = t0 + secs(600);
        assert!(dm.switch_read(t1, reserve(None, 1)).is_empty(), "the same generation changes nothing");
        assert!(dm.tripped());
        assert_eq!(dm.switch_read(t1, reserve(None, 2)), vec![DeadManAction::Mode(AdmitMode::Reserve)]);
        assert_eq!(dm.phase(), Phase::Armed);
        assert_eq!(dm.mode(), AdmitMode::Reserve);
        assert!(dm.tick(t1 + WINDOW - Duration::from_millis(1)).is_empty(), "a fresh window");
        assert_eq!(dm.tick(t1 + WINDOW)[0], DeadManAction::Trip);
    }

    #[test]
    fn the_controller_is_off_while_the_switch_says_db() {
        let t0 = Instant::now();
        let mut dm = controller(None, t0);
        let db = Switch { mode: AdmitMode::Db, trip_slots: None, generation: 2 };
        assert_eq!(dm.switch_read(t0 + secs(1), db), vec![DeadManAction::Mode(AdmitMode::Db)]);
        assert_eq!(dm.phase(), Phase::Off);
        assert!(dm.tick(t0 + secs(3600)).is_empty(), "no trip in db mode");
        // Back to reserve: armed with a window from the switch.
        let t1 = t0 + secs(3600);
        assert_eq!(dm.switch_read(t1, reserve(None, 3)), vec![DeadManAction::Mode(AdmitMode::Reserve)]);
        assert!(dm.tick(t1 + secs(1)).is_empty());
        assert!(!dm.tick(t1 + WINDOW).is_empty());
    }

    #[test]
    fn removing_the_flag_from_a_held_cell_trips_it() {
        let t0 = Instant::now();
        let mut dm = controller(Some(0), t0);
        dm.tick(t0 + WINDOW);
        assert!(dm.held());
        assert_eq!(
            dm.switch_read(t0 + WINDOW + secs(5), reserve(None, 2)),
            vec![DeadManAction::Trip, DeadManAction::Mode(AdmitMode::Db)]
        );
    }
}
