//! Requests to the daemon that expect an answer (dirs, limits,
//! credentials): sent with a request id, answered from the daemon's
//! result frame, forgotten on timeout so a late answer finds nobody
//! waiting.
//!
//! A result frame answers only the pending request its id names, and only
//! if it is of that request's kind ([`DaemonConn::claim_answer`]): one that
//! names no pending request changes nothing, one of another kind ends the
//! request as refused (docs/PROTOCOL.md, "What the server enforces"). The
//! one exception is the late answer to a dirs request that timed out: the
//! daemon made the change all the same, so the list it reports is
//! recorded ([`DaemonConn::take_overdue_dirs`]).

/// How many timed-out dirs requests a connection remembers.
pub(super) const OVERDUE_DIRS: usize = 16;

use super::*;

/// The kind of a daemon's result frame, and of the answer a request waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AnswerKind {
    Dirs,
    Limits,
    Credentials,
}

impl AnswerKind {
    /// The answer a request of `kind` waits for.
    fn awaited_by(kind: &DaemonRequestKind) -> Self {
        match kind {
            DaemonRequestKind::AddDir(_) | DaemonRequestKind::RemoveDir(_) => Self::Dirs,
            DaemonRequestKind::RefreshLimits => Self::Limits,
            DaemonRequestKind::Credentials => Self::Credentials,
        }
    }

    /// The result frame's name (docs/PROTOCOL.md).
    fn frame(self) -> &'static str {
        match self {
            Self::Dirs => "DirsResult",
            Self::Limits => "LimitsResult",
            Self::Credentials => "CredentialsResult",
        }
    }

    /// The request's name, as the REST error message says it.
    fn request(self) -> &'static str {
        match self {
            Self::Dirs => "dirs",
            Self::Limits => "limits refresh",
            Self::Credentials => "credentials",
        }
    }
}

impl DaemonConn {
    pub(super) fn answer(&mut self, request_id: &str, answer: Result<DaemonAnswer, RequestError>) {
        if let Some((_, reply)) = self.pending.remove(request_id) {
            let _ = reply.send(answer);
        }
    }

    /// Ends a request that was not answered in time (504); a dirs request
    /// is remembered as overdue.
    fn time_out(&mut self, request_id: String) {
        let Some((kind, reply)) = self.pending.remove(&request_id) else { return };
        let _ = reply.send(Err(RequestError::Timeout));
        if matches!(kind, DaemonRequestKind::AddDir(_) | DaemonRequestKind::RemoveDir(_)) {
            if self.overdue_dirs.len() == OVERDUE_DIRS {
                self.overdue_dirs.remove(0);
            }
            self.overdue_dirs.push(request_id);
        }
    }

    /// Whether `request_id` names a dirs request that timed out; it is
    /// forgotten then (one late answer per request).
    pub(super) fn take_overdue_dirs(&mut self, request_id: &str) -> bool {
        let found = self.overdue_dirs.iter().position(|id| id == request_id);
        found.map(|i| self.overdue_dirs.remove(i)).is_some()
    }

    /// Whether `request_id` names a request still waiting for its answer.
    pub(super) fn is_pending(&self, request_id: &str) -> bool {
        self.pending.contains_key(request_id)
    }

    /// Whether a result frame of kind `got` answers the pending request
    /// `request_id`: true when that request waits for this kind of answer.
    /// A frame that names no pending request (an answer after the timeout,
    /// or an id never sent) is dropped; one of another kind ends the
    /// request it names as refused (`502 daemon_refused`). Either way the
    /// caller applies nothing of the frame.
    pub(super) fn claim_answer(&mut self, request_id: &str, got: AnswerKind) -> bool {
        let host_id = self.host_id();
        let Some((kind, _)) = self.pending.get(request_id) else {
            tracing::debug!(?host_id, request_id, frame = got.frame(), "tether_daemon_answer_unmatched");
            return false;
        };
        let awaited = AnswerKind::awaited_by(kind);
        if awaited == got {
            return true;
        }
        tracing::warn!(
            ?host_id,
            request_id,
            frame = got.frame(),
            awaited = awaited.frame(),
            "tether_daemon_answer_wrong_kind"
        );
        let message = format!("the daemon answered a {} request with a {}", awaited.request(), got.frame());
        self.answer(request_id, Err(RequestError::Refused(message)));
        false
    }
}

impl Handler<DaemonRequest> for DaemonConn {
    type Result = ();

    fn handle(&mut self, msg: DaemonRequest, ctx: &mut Context<Self>) {
        let DaemonRequest { kind, answer } = msg;
        let Some(host) = self.host.as_ref().filter(|h| h.ready) else {
            let _ = answer.send(Err(RequestError::Offline));
            return;
        };
        let caps = host.capabilities;
        let supported = match kind {
            DaemonRequestKind::AddDir(_) | DaemonRequestKind::RemoveDir(_) => caps.manage_dirs,
            DaemonRequestKind::RefreshLimits => caps.refresh_limits,
            DaemonRequestKind::Credentials => caps.credentials,
        };
        if !supported {
            let _ = answer.send(Err(RequestError::Unsupported));
            return;
        }
        // Each waiting request holds an entry and a timer: a caller that
        // keeps asking a daemon that does not answer is refused, not queued.
        if self.pending.len() >= self.relay.settings.daemon.max_pending_requests {
            let _ = answer.send(Err(RequestError::Busy));
            return;
        }
        let request_id = Uuid::new_v4().to_string();
        let (frame, timeout) = match &kind {
            DaemonRequestKind::AddDir(path) | DaemonRequestKind::RemoveDir(path) => {
                let op = if matches!(kind, DaemonRequestKind::AddDir(_)) {
                    crate::proto::v1::DirsOp::Add
                } else {
                    crate::proto::v1::DirsOp::Remove
                };
                let dirs = crate::proto::v1::Dirs { request_id: request_id.clone(), op: op as i32, path: path.clone() };
                (server_frame::Frame::Dirs(dirs), Duration::from_secs(10))
            }
            DaemonRequestKind::RefreshLimits => (
                server_frame::Frame::LimitsRefresh(crate::proto::v1::LimitsRefresh { request_id: request_id.clone() }),
                Duration::from_secs(30),
            ),
            DaemonRequestKind::Credentials => (
                server_frame::Frame::Credentials(crate::proto::v1::Credentials { request_id: request_id.clone() }),
                Duration::from_secs(10),
            ),
        };
        self.pending.insert(request_id.clone(), (kind, answer));
        self.send(frame, ctx);
        // Unanswered in time: the caller hears Timeout and a late answer
        // finds nobody waiting.
        ctx.run_later(timeout, move |act, _| act.time_out(request_id));
    }
}
