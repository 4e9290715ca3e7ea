//! Input flow control, the server's side (docs/PROTOCOL.md, "Input flow
//! control"): for a daemon that reports the Input it took off its queue
//! (`InputTaken`), at most [`INPUT_WINDOW`] bytes of a terminal's Input are
//! unreported at a time; the rest waits here, in order, and goes as the
//! daemon reports. What waits here counts towards the host's input backlog
//! (`held`), so input past `INPUT_QUEUE_LIMIT` is refused (viewer 1008,
//! REST 429) rather than sent to a daemon that would have to drop it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::proto::v1::Input;

/// Bytes of one terminal's Input the daemon may hold unreported: half its
/// queue (1 MiB), so what a previous connection left queued fits beside it.
pub const INPUT_WINDOW: u64 = 512 * 1024;

/// One connection's input windows.
#[derive(Default)]
pub struct InputFlow {
    terminals: HashMap<String, Window>,
    /// Bytes held here across the connection's terminals.
    held: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Window {
    /// Sent and not reported taken.
    in_flight: u64,
    held: VecDeque<Input>,
}

impl InputFlow {
    /// The count of bytes held here, for the host's input backlog.
    pub fn held_counter(&self) -> Arc<AtomicUsize> {
        self.held.clone()
    }

    /// `input` to send now, or `None` when it waits behind the window.
    pub fn offer(&mut self, input: Input) -> Option<Input> {
        let window = self.terminals.entry(input.terminal_id.clone()).or_default();
        let len = input.data.len() as u64;
        if window.held.is_empty() && window.in_flight + len <= INPUT_WINDOW {
            window.in_flight += len;
            return Some(input);
        }
        self.held.fetch_add(input.data.len(), Ordering::Relaxed);
        window.held.push_back(input);
        None
    }

    /// The daemon took `bytes` of the terminal's Input: what waited and
    /// now fits, in order.
    pub fn taken(&mut self, terminal_id: &str, bytes: u64) -> Vec<Input> {
        let Some(window) = self.terminals.get_mut(terminal_id) else { return Vec::new() };
        window.in_flight = window.in_flight.saturating_sub(bytes);
        let mut ready = Vec::new();
        while let Some(next) = window.held.front() {
            let len = next.data.len() as u64;
            if window.in_flight + len > INPUT_WINDOW {
                break;
            }
            window.in_flight += len;
            self.held.fetch_sub(next.data.len(), Ordering::Relaxed);
            ready.extend(window.held.pop_front());
        }
        if window.in_flight == 0 && window.held.is_empty() {
            self.terminals.remove(terminal_id);
        }
        ready
    }

    /// The terminal ended: what waited for it is dropped.
    pub fn forget(&mut self, terminal_id: &str) {
        if let Some(window) = self.terminals.remove(terminal_id) {
            self.held.fetch_sub(window.held.iter().map(|i| i.data.len()).sum(), Ordering::Relaxed);
        }
    }
}

impl Drop for InputFlow {
    fn drop(&mut self) {
        let held: usize = self.terminals.values().flat_map(|w| &w.held).map(|i| i.data.len()).sum();
        self.held.fetch_sub(held, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(terminal: &str, len: usize) -> Input {
        Input { terminal_id: terminal.into(), data: vec![b'x'; len].into() }
    }

    #[test]
    fn input_past_the_window_waits_in_order_until_the_daemon_reports() {
        let mut flow = InputFlow::default();
        let chunk = 64 * 1024;
        let fits = (INPUT_WINDOW as usize) / chunk;
        for _ in 0..fits {
            assert!(flow.offer(input("a", chunk)).is_some());
        }
        assert!(flow.offer(input("a", 1)).is_none(), "the window is full");
        assert!(flow.offer(input("a", chunk)).is_none(), "and behind what waits");
        assert!(flow.offer(input("b", chunk)).is_some(), "another terminal has its own window");
        assert_eq!(flow.held_counter().load(Ordering::Relaxed), chunk + 1);
        let ready = flow.taken("a", 1);
        assert_eq!(ready.iter().map(|i| i.data.len()).collect::<Vec<_>>(), [1], "one byte made room for one");
        let ready = flow.taken("a", chunk as u64);
        assert_eq!(ready.iter().map(|i| i.data.len()).collect::<Vec<_>>(), [chunk]);
        assert_eq!(flow.held_counter().load(Ordering::Relaxed), 0);
        assert!(flow.taken("unknown", 5).is_empty());
    }

    #[test]
    fn what_waits_for_an_ended_terminal_or_a_closed_connection_leaves_the_count() {
        let mut flow = InputFlow::default();
        let held = flow.held_counter();
        assert!(flow.offer(input("a", INPUT_WINDOW as usize)).is_some());
        assert!(flow.offer(input("a", 10)).is_none());
        assert!(flow.offer(input("b", INPUT_WINDOW as usize)).is_some());
        assert!(flow.offer(input("b", 20)).is_none());
        flow.forget("a");
        assert_eq!(held.load(Ordering::Relaxed), 20);
        drop(flow);
        assert_eq!(held.load(Ordering::Relaxed), 0);
    }
}
