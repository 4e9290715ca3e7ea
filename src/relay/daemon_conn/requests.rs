//! Requests to the daemon that expect an answer (dirs, limits,
//! credentials): sent with a request id, answered from the daemon's
//! result frame, forgotten on timeout so a late answer is ignored.

use super::*;

impl DaemonConn {
    pub(super) fn answer(&mut self, request_id: &str, answer: Result<DaemonAnswer, RequestError>) {
        if let Some((_, reply)) = self.pending.remove(request_id) {
            let _ = reply.send(answer);
        }
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
        ctx.run_later(timeout, move |act, _| act.answer(&request_id, Err(RequestError::Timeout)));
    }
}
