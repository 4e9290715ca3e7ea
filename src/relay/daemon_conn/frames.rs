//! Frames from a daemon after its hello, applied in order: terminal
//! lifecycle (Started, SpawnError, Exit, Usage, Snapshot), stream frames
//! for the arbiters, and answers to requests (applied only when they answer
//! a pending request of their kind, see `requests`).

use super::requests::AnswerKind;
use super::*;

/// A terminal id as a daemon sends it; `None` when it is not a UUID.
pub fn terminal_id(raw: &str) -> Option<Uuid> {
    Uuid::parse_str(raw).ok()
}

/// A grid dimension from a daemon, clamped to 1..=1000.
pub fn grid(value: u32) -> u16 {
    u16::try_from(value.clamp(1, 1000)).unwrap_or(1000)
}

/// A spawn error's message as stored: one line (a daemon's message may
/// list what it tried, a line each; they are joined with `; `), its first
/// 1000 characters. It is the terminal's `error` and a failed run's log
/// (docs/REST.md, "Runs": one line of text).
pub fn spawn_error_message(message: &str) -> String {
    let lines: Vec<&str> = message.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    lines.join("; ").chars().take(1000).collect()
}

/// A run's usage as a daemon reports it, each figure capped at `i64::MAX`.
pub fn run_usage(u: &crate::proto::v1::Usage) -> RunUsage {
    RunUsage {
        cpu_ms: i64::try_from(u.cpu_ms).unwrap_or(i64::MAX),
        max_rss_kb: i64::try_from(u.max_rss_kb).unwrap_or(i64::MAX),
        output_bytes: i64::try_from(u.output_bytes).unwrap_or(i64::MAX),
        wall_ms: i64::try_from(u.wall_ms).unwrap_or(i64::MAX),
    }
}

/// The answer a `LimitsResult` carries: the daemon's refusal, or its
/// limits, which must be JSON.
pub fn limits_answer(r: &crate::proto::v1::LimitsResult) -> Result<DaemonAnswer, RequestError> {
    match &r.error {
        Some(error) => Err(RequestError::Refused(error.clone())),
        None => serde_json::from_str(&r.limits_json)
            .map(DaemonAnswer::Limits)
            .map_err(|_| RequestError::Refused("the daemon sent limits that are not JSON".into())),
    }
}

/// A stream chunk whose end would pass 2^64 bytes: no daemon gets there
/// (16 EiB of output), so the frame is malformed, and every hop's offset
/// arithmetic may count on the end fitting.
fn offset_wraps(offset: u64, data: &Bytes) -> bool {
    u64::try_from(data.len()).ok().and_then(|len| offset.checked_add(len)).is_none()
}

impl DaemonConn {
    /// Stores a terminal's grid as the daemon reported it (a Size, or the
    /// grid of a Scrollback), unless it is the one stored already.
    fn store_size(&mut self, host_id: Uuid, id: Uuid, size: (u16, u16)) -> AtomicResponse<Self, ()> {
        let Some(owned) = self.owned.get_mut(&id).filter(|owned| owned.size != Some(size)) else {
            return AtomicResponse::new(Box::pin(actix::fut::ready(())));
        };
        owned.size = Some(size);
        let (cols, rows) = size;
        let write =
            Write::new(
                "terminal size",
                move |store| async move { store.set_terminal_size(host_id, id, cols, rows).await },
            )
            .size_of(id);
        AtomicResponse::new(Box::pin(self.store(write).map(|_, _, _| ())))
    }
}

impl Handler<Inbound> for DaemonConn {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, msg: Inbound, ctx: &mut Context<Self>) -> Self::Result {
        self.heard.stamp();
        let done = || AtomicResponse::new(Box::pin(actix::fut::ready(())));
        let Some(host_id) = self.host_id() else { return done() };
        let Some(frame) = msg.0.frame else { return done() };
        // Frames about a terminal this host does not own are dropped.
        let owned_id = |raw: &str, owned: &HashMap<Uuid, Owned>| terminal_id(raw).filter(|id| owned.contains_key(id));
        match frame {
            daemon_frame::Frame::Output(out) => {
                if offset_wraps(out.offset, &out.data) {
                    self.close(close::POLICY, "malformed frame", ctx);
                    return done();
                }
                let Some(id) = owned_id(&out.terminal_id, &self.owned) else {
                    metrics::counter!("tether_daemon_frames_dropped_total").increment(1);
                    return done();
                };
                metrics::counter!("tether_daemon_output_bytes_total").increment(out.data.len() as u64);
                let Some(arbiter) = self.attached.get(&id).cloned() else { return done() };
                let chunk = OutputChunk { offset: out.offset, data: out.data };
                if self.window().is_some() {
                    // Never waits for the arbiter: the terminal's flow-control
                    // window bounds what is in flight (see `arbiter`).
                    arbiter.output(chunk);
                    return done();
                }
                // A daemon without flow control is slowed as a whole: the
                // reader waits while the terminal's stream is paused.
                AtomicResponse::new(Box::pin(
                    async move {
                        arbiter.output_handled(chunk).await;
                    }
                    .into_actor(self),
                ))
            }
            daemon_frame::Frame::Scrollback(s) => {
                if offset_wraps(s.offset, &s.data) {
                    self.close(close::POLICY, "malformed frame", ctx);
                    return done();
                }
                let Some(id) = owned_id(&s.terminal_id, &self.owned) else { return done() };
                let (cols, rows) = (grid(s.cols), grid(s.rows));
                self.arbiter_event(
                    id,
                    StreamEvent::Scrollback {
                        attach_id: s.attach_id,
                        data: s.data,
                        cols,
                        rows,
                        offset: s.offset,
                        resumed: s.resumed,
                    },
                );
                self.store_size(host_id, id, (cols, rows))
            }
            daemon_frame::Frame::AttachError(e) => {
                if let Some(id) = terminal_id(&e.terminal_id) {
                    self.arbiter_event(id, StreamEvent::AttachError { attach_id: e.attach_id, message: e.message });
                }
                done()
            }
            daemon_frame::Frame::Size(s) => {
                let Some(id) = owned_id(&s.terminal_id, &self.owned) else { return done() };
                let (cols, rows) = (grid(s.cols), grid(s.rows));
                self.arbiter_event(id, StreamEvent::Size { cols, rows });
                self.store_size(host_id, id, (cols, rows))
            }
            daemon_frame::Frame::Ping(_) => {
                self.send(server_frame::Frame::Pong(crate::proto::v1::Pong {}), ctx);
                done()
            }
            daemon_frame::Frame::InputTaken(t) => {
                for input in self.input_flow.taken(&t.terminal_id, t.bytes) {
                    self.send(server_frame::Frame::Input(input), ctx);
                }
                done()
            }
            daemon_frame::Frame::Hello(_) => {
                self.close(close::POLICY, "a second hello on one connection", ctx);
                done()
            }
            daemon_frame::Frame::Started(s) => {
                let Some(id) = owned_id(&s.terminal_id, &self.owned) else { return done() };
                let run_id = self.owned.get_mut(&id).and_then(|o| {
                    o.started = true;
                    o.run_id
                });
                let registry = self.relay.registry.clone();
                let write = Write::new("terminal started", move |store| async move {
                    store.mark_started(host_id, id).await?;
                    if let Some(run_id) = run_id {
                        store.mark_run_running(run_id).await?;
                    }
                    Ok(())
                });
                // The process runs, stored yet or not: its viewers go live.
                AtomicResponse::new(Box::pin(self.store(write).map(move |outcome, _, _| {
                    if !matches!(outcome, Outcome::Failed) {
                        registry.do_send(TerminalLifecycle { terminal_id: id, event: LifecycleEvent::Started });
                    }
                })))
            }
            daemon_frame::Frame::SpawnError(s) => {
                let Some(id) = owned_id(&s.terminal_id, &self.owned) else { return done() };
                if self.owned.get(&id).is_some_and(|o| o.started || o.exited) {
                    tracing::debug!(terminal_id = %id, "tether_daemon_spawn_error_after_start_dropped");
                    return done();
                }
                let run_id = self.owned.remove(&id).and_then(|o| o.run_id);
                let registry = self.relay.registry.clone();
                let message = spawn_error_message(&s.message);
                let stored = message.clone();
                let write = Write::new("spawn error", move |store| {
                    let message = stored.clone();
                    async move {
                        store.mark_spawn_failed(host_id, id, &message).await?;
                        if let Some(run_id) = run_id {
                            store.append_run_log(run_id, 0, message.as_bytes(), usize::MAX / 2).await?;
                            store.finish_run(run_id, RunState::Failed, None).await?;
                        }
                        Ok(())
                    }
                });
                AtomicResponse::new(Box::pin(self.store(write).map(move |_, _, _| {
                    registry
                        .do_send(TerminalLifecycle { terminal_id: id, event: LifecycleEvent::SpawnFailed(message) });
                })))
            }
            daemon_frame::Frame::Snapshot(s) => {
                let Some(id) = owned_id(&s.terminal_id, &self.owned) else { return done() };
                let (cols, rows) = (grid(s.cols), grid(s.rows));
                if let Some(owned) = self.owned.get_mut(&id) {
                    owned.final_snapshot = Some((s.data.clone(), cols, rows));
                }
                let snapshot = Arc::new(crate::store::TerminalSnapshot { data: s.data.to_vec(), cols, rows });
                let write = Write::new("final screen", move |store| {
                    let snapshot = snapshot.clone();
                    async move { store.put_snapshot(host_id, id, &snapshot).await }
                });
                AtomicResponse::new(Box::pin(self.store(write).map(|_, _, _| ())))
            }
            daemon_frame::Frame::Exit(e) => {
                let Some(id) = owned_id(&e.terminal_id, &self.owned) else { return done() };
                self.input_flow.forget(id);
                let snapshot = self.owned.get_mut(&id).and_then(|o| o.final_snapshot.take());
                // A run's terminal is forgotten when its Usage arrives; others now.
                match self.owned.get_mut(&id) {
                    Some(o) if o.run_id.is_some() => o.exited = true,
                    _ => {
                        self.owned.remove(&id);
                    }
                }
                let status = ExitStatus { code: e.exit_code, signal: e.signal };
                let arbiter = self.attached.remove(&id);
                let registry = self.relay.registry.clone();
                let write = Write::new("terminal exited", move |store| async move {
                    store.mark_exited(host_id, id, status).await.map(|_| ())
                });
                AtomicResponse::new(Box::pin(self.store(write).map(move |_, _, _| {
                    let event = LifecycleEvent::Exited { status, snapshot };
                    match arbiter {
                        Some(arbiter) => arbiter.lifecycle(event),
                        None => registry.do_send(TerminalLifecycle { terminal_id: id, event }),
                    }
                })))
            }
            daemon_frame::Frame::Usage(u) => {
                let Some(id) = owned_id(&u.terminal_id, &self.owned) else { return done() };
                // Only a run keeps its usage. It follows Exit, and the
                // terminal is forgotten once it arrives (not before).
                let Some((run_id, exited)) = self.owned.get(&id).and_then(|o| Some((o.run_id?, o.exited))) else {
                    return done();
                };
                if exited {
                    self.owned.remove(&id);
                }
                let usage = run_usage(&u);
                let write =
                    Write::new("run usage", move |store| async move { store.set_run_usage(run_id, &usage).await });
                AtomicResponse::new(Box::pin(self.store(write).map(|_, _, _| ())))
            }
            daemon_frame::Frame::DirsResult(r) => {
                if super::hello::bad_dirs(&r.dirs).is_some() {
                    self.close(close::POLICY, "malformed frame", ctx);
                    return done();
                }
                // A request that timed out (504) is no longer pending, but
                // the change its answer reports was made all the same.
                let awaited = self.is_pending(&r.request_id);
                if !awaited && !self.take_overdue_dirs(&r.request_id) {
                    tracing::debug!(%host_id, request_id = %r.request_id, "tether_daemon_answer_unmatched");
                    return done();
                }
                if awaited && !self.claim_answer(&r.request_id, AnswerKind::Dirs) {
                    return done();
                }
                if let Some(error) = r.error {
                    if awaited {
                        self.answer(&r.request_id, Err(RequestError::Refused(error)));
                    }
                    return done();
                }
                // The daemon's list is recorded whoever still waits for it
                // (REST checks a terminal's dir against the stored list),
                // and before the caller hears the answer, so a read of the
                // host right after shows the dirs the answer listed.
                let dirs = Arc::new(r.dirs);
                let write = Write::new("host dirs", {
                    let dirs = dirs.clone();
                    move |store| {
                        let dirs = dirs.clone();
                        async move { store.set_host_dirs(host_id, &dirs).await }
                    }
                });
                AtomicResponse::new(Box::pin(self.store(write).map(move |_, act, _| {
                    if awaited {
                        act.answer(&r.request_id, Ok(DaemonAnswer::Dirs(dirs.as_ref().clone())));
                    }
                })))
            }
            daemon_frame::Frame::LimitsResult(r) => {
                if self.claim_answer(&r.request_id, AnswerKind::Limits) {
                    let answer = limits_answer(&r);
                    self.answer(&r.request_id, answer);
                }
                done()
            }
            daemon_frame::Frame::CredentialsResult(r) => {
                if self.claim_answer(&r.request_id, AnswerKind::Credentials) {
                    let answer = match r.error {
                        Some(error) => Err(RequestError::Refused(error)),
                        None => Ok(DaemonAnswer::Credentials(r.credentials_json.to_vec())),
                    };
                    self.answer(&r.request_id, answer);
                }
                done()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawn_error_is_stored_as_one_line() {
        let message = "cannot start nope: not found in PATH\n  /usr/bin/ exists but is a directory.\n\n  /bin/nope: no such file\n";
        assert_eq!(
            spawn_error_message(message),
            "cannot start nope: not found in PATH; /usr/bin/ exists but is a directory.; /bin/nope: no such file"
        );
        assert_eq!(spawn_error_message(&"x".repeat(2000)).len(), 1000);
    }
}
