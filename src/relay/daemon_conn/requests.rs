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
    type Result = ResponseFuture<Result<DaemonAnswer, RequestError>>;

    fn handle(&mut self, msg: DaemonRequest, ctx: &mut Context<Self>) -> Self::Result {
        let Some(host) = self.host.as_ref().filter(|h| h.ready) else {
            return Box::pin(async { Err(RequestError::Offline) });
        };
        let caps = host.capabilities;
        let supported = match msg.0 {
            DaemonRequestKind::AddDir(_) | DaemonRequestKind::RemoveDir(_) => caps.manage_dirs,
            DaemonRequestKind::RefreshLimits => caps.refresh_limits,
            DaemonRequestKind::Credentials => caps.credentials,
        };
        if !supported {
            return Box::pin(async { Err(RequestError::Unsupported) });
        }
        let request_id = Uuid::new_v4().to_string();
        let (frame, timeout) = match &msg.0 {
            DaemonRequestKind::AddDir(path) | DaemonRequestKind::RemoveDir(path) => {
                let op = if matches!(msg.0, DaemonRequestKind::AddDir(_)) {
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
        let (tx, rx) = oneshot::channel();
        self.pending.insert(request_id.clone(), (msg.0, tx));
        self.send(frame, ctx);
        let addr = ctx.address();
        Box::pin(async move {
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => Err(RequestError::Offline),
                Err(_) => {
                    addr.do_send(ForgetRequest(request_id));
                    Err(RequestError::Timeout)
                }
            }
        })
    }
}

/// Drops a request that timed out, so a late answer is ignored.
#[derive(Message)]
#[rtype(result = "()")]
struct ForgetRequest(String);

impl Handler<ForgetRequest> for DaemonConn {
    type Result = ();
    fn handle(&mut self, msg: ForgetRequest, _: &mut Context<Self>) {
        self.pending.remove(&msg.0);
    }
}
