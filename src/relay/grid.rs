//! The grid arbiter's rules (docs/PROTOCOL.md, "The grid"), as plain state
//! and decisions so they can be tested without sockets or clocks.
//!
//! One viewer at a time holds the PTY grid. A view from the holder resizes
//! the PTY to its natural grid. An open and visible view from another
//! viewer is an arrival: the newcomer takes the grid when the holder is not
//! in use (hidden, unresponsive, or idle for `in_use`), except that a
//! holder that is only idle keeps it from a newcomer idle for `in_use` too
//! (two idle tabs would otherwise take it in turns at each periodic view,
//! resizing the PTY back and forth); a holder heard
//! within `fresh` keeps it; otherwise the holder is pinged, and without a
//! pong within `ping_timeout` it counts as unresponsive and the arrival is
//! retried. `resize` always claims; a leaving holder frees the grid. A
//! viewer that claims with `resize` before it sent any `view` counts as
//! showing the terminal (open and visible) until a view says otherwise: a
//! client that only resizes is as much in use as one that reports views.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::ViewReport;

/// Timing of the rules (settings `viewer.*_ms`).
#[derive(Debug, Clone, Copy)]
pub struct GridTimings {
    pub in_use: Duration,
    pub fresh: Duration,
    pub ping_timeout: Duration,
}

/// What the caller must do after a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GridAction {
    /// Resize the PTY.
    Resize { cols: u16, rows: u16 },
    /// The holder changed: tell every viewer whose grid it is.
    HolderChanged,
    /// Ping the holder; call [`Grid::ping_expired`] after `ping_timeout`.
    PingHolder { holder: u64, arrival: u64 },
}

#[derive(Debug, Clone)]
struct ViewerGrid {
    natural: Option<(u16, u16)>,
    visible: bool,
    open: bool,
    /// It sent a `view`: `visible` and `open` are its own.
    viewed: bool,
    last_use: Instant,
    last_heard: Instant,
    unresponsive: bool,
    ping_sent: Option<Instant>,
}

/// Clamps a grid dimension to 1..=1000.
pub fn clamp(value: u32) -> u16 {
    u16::try_from(value.clamp(1, 1000)).unwrap_or(1000)
}

#[derive(Debug)]
pub struct Grid {
    timings: GridTimings,
    pty: (u16, u16),
    requested: Option<(u16, u16)>,
    holder: Option<u64>,
    viewers: HashMap<u64, ViewerGrid>,
}

impl Grid {
    pub fn new(timings: GridTimings, pty: (u16, u16)) -> Self {
        Self { timings, pty, requested: None, holder: None, viewers: HashMap::new() }
    }

    pub fn holder(&self) -> Option<u64> {
        self.holder
    }

    pub fn pty(&self) -> (u16, u16) {
        self.pty
    }

    /// The daemon reported the PTY's size.
    pub fn pty_resized(&mut self, cols: u16, rows: u16) {
        self.pty = (cols, rows);
        if self.requested == Some((cols, rows)) {
            self.requested = None;
        }
    }

    /// A resize asked for could not be sent (no daemon is connected): it is
    /// no longer in flight, so the holder's grid is asked for again later.
    pub fn resize_not_sent(&mut self) {
        self.requested = None;
    }

    /// The PTY's size as the daemon reports it when a stream starts: the
    /// holder's grid, if it differs and was not asked for already. A
    /// terminal that started (or whose daemon came back) after its holder
    /// last reported a view would otherwise keep a grid nobody shows.
    pub fn refit(&mut self) -> Option<GridAction> {
        let holder = self.holder?;
        self.fit_to(holder)
    }

    pub fn join(&mut self, viewer: u64, now: Instant) {
        self.viewers.insert(
            viewer,
            ViewerGrid {
                natural: None,
                visible: false,
                open: false,
                viewed: false,
                last_use: now,
                last_heard: now,
                unresponsive: false,
                ping_sent: None,
            },
        );
    }

    pub fn leave(&mut self, viewer: u64) -> Vec<GridAction> {
        self.viewers.remove(&viewer);
        if self.holder == Some(viewer) {
            self.holder = None;
            return vec![GridAction::HolderChanged];
        }
        Vec::new()
    }

    /// Any sign of life (a pong, any message).
    pub fn heard(&mut self, viewer: u64, now: Instant) {
        if let Some(v) = self.viewers.get_mut(&viewer) {
            v.last_heard = now;
            v.unresponsive = false;
            v.ping_sent = None;
        }
    }

    /// Input counts as use.
    pub fn used(&mut self, viewer: u64, now: Instant) {
        self.heard(viewer, now);
        if let Some(v) = self.viewers.get_mut(&viewer) {
            v.last_use = now;
        }
    }

    /// A `view` message.
    pub fn view(&mut self, viewer: u64, report: &ViewReport, now: Instant) -> Vec<GridAction> {
        self.heard(viewer, now);
        let Some(v) = self.viewers.get_mut(&viewer) else { return Vec::new() };
        v.natural = Some((report.cols, report.rows));
        v.visible = report.visible;
        v.open = report.open;
        v.viewed = true;
        v.last_use = now.checked_sub(Duration::from_millis(report.idle_ms)).unwrap_or(now);
        if self.holder == Some(viewer) {
            return self.fit_to(viewer).into_iter().collect();
        }
        if report.open && report.visible {
            return self.arrival(viewer, now);
        }
        Vec::new()
    }

    /// A `resize` message: always claims the grid.
    pub fn resize(&mut self, viewer: u64, cols: u16, rows: u16, now: Instant) -> Vec<GridAction> {
        self.used(viewer, now);
        let Some(v) = self.viewers.get_mut(&viewer) else { return Vec::new() };
        v.natural = Some((cols, rows));
        if !v.viewed {
            (v.visible, v.open) = (true, true);
        }
        let mut actions = self.take(viewer);
        // A resize is explicit: send it even when it matches what we last asked.
        if !actions.iter().any(|a| matches!(a, GridAction::Resize { .. })) && (cols, rows) != self.pty {
            self.requested = Some((cols, rows));
            actions.push(GridAction::Resize { cols, rows });
        }
        actions
    }

    /// The ping of `holder` got no pong in time: retry the arrival.
    pub fn ping_expired(&mut self, holder: u64, arrival: u64, now: Instant) -> Vec<GridAction> {
        let Some(h) = self.viewers.get_mut(&holder) else {
            return self.arrival(arrival, now);
        };
        match h.ping_sent {
            Some(sent) if h.last_heard <= sent => {
                h.unresponsive = true;
                h.ping_sent = None;
                self.arrival(arrival, now)
            }
            _ => Vec::new(),
        }
    }

    fn arrival(&mut self, viewer: u64, now: Instant) -> Vec<GridAction> {
        if !self.viewers.contains_key(&viewer) {
            return Vec::new();
        }
        let Some(holder) = self.holder.filter(|h| self.viewers.contains_key(h)) else {
            return self.take(viewer);
        };
        if holder == viewer {
            return Vec::new();
        }
        let in_use_window = self.timings.in_use;
        let newcomer_idle =
            self.viewers.get(&viewer).is_some_and(|v| now.saturating_duration_since(v.last_use) >= in_use_window);
        let Some(h) = self.viewers.get_mut(&holder) else { return self.take(viewer) };
        let shown = h.visible && h.open && !h.unresponsive;
        let idle = now.saturating_duration_since(h.last_use) >= in_use_window;
        if !shown || (idle && !newcomer_idle) {
            return self.take(viewer);
        }
        if idle {
            return Vec::new(); // both idle: the grid stays where it is
        }
        if now.saturating_duration_since(h.last_heard) < self.timings.fresh {
            return Vec::new();
        }
        if h.ping_sent.is_some() {
            return Vec::new(); // a ping is already out; its expiry retries
        }
        h.ping_sent = Some(now);
        vec![GridAction::PingHolder { holder, arrival: viewer }]
    }

    fn take(&mut self, viewer: u64) -> Vec<GridAction> {
        let mut actions = Vec::new();
        if self.holder != Some(viewer) {
            self.holder = Some(viewer);
            actions.push(GridAction::HolderChanged);
        }
        actions.extend(self.fit_to(viewer));
        actions
    }

    fn fit_to(&mut self, viewer: u64) -> Option<GridAction> {
        let natural = self.viewers.get(&viewer)?.natural?;
        if natural == self.requested.unwrap_or(self.pty) {
            return None;
        }
        self.requested = Some(natural);
        Some(GridAction::Resize { cols: natural.0, rows: natural.1 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: GridTimings = GridTimings {
        in_use: Duration::from_secs(60),
        fresh: Duration::from_secs(5),
        ping_timeout: Duration::from_millis(1500),
    };

    fn grid() -> (Grid, Instant) {
        let now = Instant::now();
        let mut g = Grid::new(T, (80, 24));
        g.join(1, now);
        g.join(2, now);
        (g, now)
    }

    fn view(g: &mut Grid, v: u64, cols: u16, visible: bool, idle_s: u64, now: Instant) -> Vec<GridAction> {
        g.view(v, &ViewReport { cols, rows: 30, visible, idle_ms: idle_s * 1000, open: true }, now)
    }

    #[test]
    fn first_visible_viewer_takes_and_resizes() {
        let (mut g, now) = grid();
        let actions = view(&mut g, 1, 100, true, 0, now);
        assert_eq!(actions, vec![GridAction::HolderChanged, GridAction::Resize { cols: 100, rows: 30 }]);
        assert_eq!(g.holder(), Some(1));
        // The holder's next view with the same grid changes nothing.
        assert!(view(&mut g, 1, 100, true, 0, now).is_empty());
        g.pty_resized(100, 30);
        // A new natural grid from the holder resizes the PTY.
        assert_eq!(view(&mut g, 1, 120, true, 0, now), vec![GridAction::Resize { cols: 120, rows: 30 }]);
    }

    #[test]
    fn holder_in_use_and_fresh_keeps_the_grid() {
        let (mut g, now) = grid();
        view(&mut g, 1, 100, true, 0, now);
        let later = now + Duration::from_secs(1);
        assert!(view(&mut g, 2, 90, true, 0, later).is_empty());
        assert_eq!(g.holder(), Some(1));
    }

    #[test]
    fn idle_or_hidden_holder_loses_to_an_arrival() {
        let (mut g, now) = grid();
        view(&mut g, 1, 100, true, 0, now);
        let later = now + Duration::from_secs(1);
        view(&mut g, 1, 100, true, 61, later); // idle for 61 s
        let actions = view(&mut g, 2, 90, true, 0, later);
        assert_eq!(g.holder(), Some(2));
        assert!(actions.contains(&GridAction::Resize { cols: 90, rows: 30 }));

        let (mut g, now) = grid();
        view(&mut g, 1, 100, true, 0, now);
        view(&mut g, 1, 100, false, 0, now); // hidden
        view(&mut g, 2, 90, true, 0, now);
        assert_eq!(g.holder(), Some(2));
    }

    #[test]
    fn an_idle_holder_keeps_the_grid_from_an_idle_newcomer() {
        let (mut g, now) = grid();
        view(&mut g, 1, 100, true, 0, now);
        let later = now + Duration::from_secs(1);
        view(&mut g, 1, 100, true, 61, later);
        // The other tab, idle as long, reports its periodic view: no swap.
        assert!(view(&mut g, 2, 90, true, 70, later).is_empty());
        assert_eq!(g.holder(), Some(1));
        // Once it is used, it takes the grid.
        let actions = view(&mut g, 2, 90, true, 0, later);
        assert_eq!(g.holder(), Some(2));
        assert!(actions.contains(&GridAction::Resize { cols: 90, rows: 30 }));
        // A hidden holder loses to an idle newcomer all the same.
        view(&mut g, 2, 90, false, 80, later);
        view(&mut g, 1, 100, true, 90, later);
        assert_eq!(g.holder(), Some(1));
    }

    #[test]
    fn stale_holder_is_pinged_and_loses_without_a_pong() {
        let (mut g, now) = grid();
        view(&mut g, 1, 100, true, 0, now);
        let later = now + Duration::from_secs(6); // holder not heard for 6 s
        let actions = view(&mut g, 2, 90, true, 0, later);
        assert_eq!(actions, vec![GridAction::PingHolder { holder: 1, arrival: 2 }]);
        assert_eq!(g.holder(), Some(1));
        let expired = later + T.ping_timeout;
        let actions = g.ping_expired(1, 2, expired);
        assert_eq!(g.holder(), Some(2));
        assert!(actions.contains(&GridAction::HolderChanged));
    }

    #[test]
    fn stale_holder_that_answers_keeps_the_grid() {
        let (mut g, now) = grid();
        view(&mut g, 1, 100, true, 0, now);
        let later = now + Duration::from_secs(6);
        view(&mut g, 2, 90, true, 0, later);
        g.heard(1, later + Duration::from_millis(100)); // the pong
        assert!(g.ping_expired(1, 2, later + T.ping_timeout).is_empty());
        assert_eq!(g.holder(), Some(1));
    }

    #[test]
    fn resize_always_claims_and_leaving_frees() {
        let (mut g, now) = grid();
        view(&mut g, 1, 100, true, 0, now);
        let actions = g.resize(2, 70, 20, now);
        assert_eq!(actions, vec![GridAction::HolderChanged, GridAction::Resize { cols: 70, rows: 20 }]);
        assert_eq!(g.holder(), Some(2));
        assert_eq!(g.leave(2), vec![GridAction::HolderChanged]);
        assert_eq!(g.holder(), None);
        assert!(g.leave(1).is_empty());
    }

    /// A client that only resizes (no `view`) holds the grid as a visible
    /// holder does: an arrival within `fresh` does not take it, a later one
    /// pings it first; once it reports a hidden view, an arrival takes it.
    #[test]
    fn a_holder_that_claimed_by_resize_alone_is_in_use() {
        let (mut g, now) = grid();
        g.resize(1, 70, 20, now);
        let soon = now + Duration::from_millis(1500);
        assert!(view(&mut g, 2, 120, true, 0, soon).is_empty());
        assert_eq!(g.holder(), Some(1));
        let later = now + Duration::from_secs(6);
        assert_eq!(view(&mut g, 2, 120, true, 0, later), vec![GridAction::PingHolder { holder: 1, arrival: 2 }]);
        g.heard(1, later + Duration::from_millis(100)); // the pong
        assert!(g.ping_expired(1, 2, later + T.ping_timeout).is_empty());
        assert_eq!(g.holder(), Some(1));

        view(&mut g, 1, 70, false, 0, later); // now hidden, by its own word
        view(&mut g, 2, 120, true, 0, later);
        assert_eq!(g.holder(), Some(2));
    }
}
