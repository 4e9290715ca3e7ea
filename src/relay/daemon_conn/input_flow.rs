//! Input flow control, the server's side (docs/PROTOCOL.md, "Input flow
//! control"): for a daemon that reports the Input it took off its queue
//! (`InputTaken`), at most [`INPUT_WINDOW`] bytes of a terminal's Input are
//! unreported at a time; the rest waits here, in order, and goes as the
//! daemon reports. What waits here for a terminal counts towards that
//! terminal's input backlog ([`HeldInput`]), so input past
//! `INPUT_QUEUE_LIMIT` is refused (viewer 1008, REST 429) rather than sent
//! to a daemon that would have to drop it, and only that terminal's.

use std::collections::{HashMap, VecDeque};
use std::sync::MutexGuard;

use uuid::Uuid;

use crate::proto::v1::Input;
use crate::relay::HeldInput;

/// Bytes of one terminal's Input the daemon may hold unreported: half its
/// queue (1 MiB), so what a previous connection left queued fits beside it.
pub const INPUT_WINDOW: u64 = 512 * 1024;

/// One connection's input windows.
#[derive(Default)]
pub struct InputFlow {
    terminals: HashMap<Uuid, Window>,
    /// Bytes held here per terminal, read by the terminal's input checks.
    held: HeldInput,
}

#[derive(Default)]
struct Window {
    /// Sent and not reported taken.
    in_flight: u64,
    held: VecDeque<Input>,
    held_bytes: usize,
}

fn lock(held: &HeldInput) -> MutexGuard<'_, HashMap<Uuid, usize>> {
    held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl InputFlow {
    /// The bytes held here per terminal, for the host's input backlog.
    pub fn held(&self) -> HeldInput {
        self.held.clone()
    }

    /// `input` to send now, or `None` when it waits behind the window. An
    /// id that is not a terminal's goes at once (the daemon ignores it).
    pub fn offer(&mut self, input: Input) -> Option<Input> {
        let Ok(terminal) = Uuid::parse_str(&input.terminal_id) else { return Some(input) };
        let window = self.terminals.entry(terminal).or_default();
        let len = input.data.len();
        if window.held.is_empty() && window.in_flight + len as u64 <= INPUT_WINDOW {
            window.in_flight += len as u64;
            return Some(input);
        }
        window.held_bytes += len;
        window.held.push_back(input);
        lock(&self.held).insert(terminal, window.held_bytes);
        None
    }

    /// The daemon took `bytes` of the terminal's Input: what waited and
    /// now fits, in order.
    pub fn taken(&mut self, terminal_id: &str, bytes: u64) -> Vec<Input> {
        let Ok(terminal) = Uuid::parse_str(terminal_id) else { return Vec::new() };
        let Some(window) = self.terminals.get_mut(&terminal) else { return Vec::new() };
        window.in_flight = window.in_flight.saturating_sub(bytes);
        let mut ready = Vec::new();
        while let Some(next) = window.held.front() {
            let len = next.data.len();
            if window.in_flight + len as u64 > INPUT_WINDOW {
                break;
            }
            window.in_flight += len as u64;
            window.held_bytes -= len;
            ready.extend(window.held.pop_front());
        }
        if !ready.is_empty() {
            let mut held = lock(&self.held);
            match window.held_bytes {
                0 => held.remove(&terminal),
                bytes => held.insert(terminal, bytes),
            };
        }
        if window.in_flight == 0 && window.held.is_empty() {
            self.terminals.remove(&terminal);
        }
        ready
    }

    /// The terminal ended: what waited for it is dropped.
    pub fn forget(&mut self, terminal: Uuid) {
        if self.terminals.remove(&terminal).is_some() {
            lock(&self.held).remove(&terminal);
        }
    }
}

impl Drop for InputFlow {
    fn drop(&mut self) {
        let mut held = lock(&self.held);
        for terminal in self.terminals.keys() {
            held.remove(terminal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(terminal: Uuid, len: usize) -> Input {
        Input { terminal_id: terminal.to_string(), data: vec![b'x'; len].into() }
    }

    fn held(flow: &InputFlow, terminal: Uuid) -> usize {
        lock(&flow.held()).get(&terminal).copied().unwrap_or(0)
    }

    #[test]
    fn input_past_the_window_waits_in_order_until_the_daemon_reports() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut flow = InputFlow::default();
        let chunk = 64 * 1024;
        let fits = (INPUT_WINDOW as usize) / chunk;
        for _ in 0..fits {
            assert!(flow.offer(input(a, chunk)).is_some());
        }
        assert!(flow.offer(input(a, 1)).is_none(), "the window is full");
        assert!(flow.offer(input(a, chunk)).is_none(), "and behind what waits");
        assert!(flow.offer(input(b, chunk)).is_some(), "another terminal has its own window");
        assert_eq!((held(&flow, a), held(&flow, b)), (chunk + 1, 0), "held input is counted per terminal");
        let ready = flow.taken(&a.to_string(), 1);
        assert_eq!(ready.iter().map(|i| i.data.len()).collect::<Vec<_>>(), [1], "one byte made room for one");
        let ready = flow.taken(&a.to_string(), chunk as u64);
        assert_eq!(ready.iter().map(|i| i.data.len()).collect::<Vec<_>>(), [chunk]);
        assert_eq!(held(&flow, a), 0);
        assert!(flow.taken(&Uuid::new_v4().to_string(), 5).is_empty());
        assert!(flow.taken("not an id", 5).is_empty());
    }

    #[test]
    fn what_waits_for_an_ended_terminal_or_a_closed_connection_leaves_the_count() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut flow = InputFlow::default();
        let counts = flow.held();
        assert!(flow.offer(input(a, INPUT_WINDOW as usize)).is_some());
        assert!(flow.offer(input(a, 10)).is_none());
        assert!(flow.offer(input(b, INPUT_WINDOW as usize)).is_some());
        assert!(flow.offer(input(b, 20)).is_none());
        flow.forget(a);
        assert_eq!(lock(&counts).get(&a), None);
        assert_eq!(lock(&counts).get(&b), Some(&20));
        drop(flow);
        assert!(lock(&counts).is_empty());
    }
}
