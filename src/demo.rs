//! `tether serve --demo`: a daemon inside the server process, a demo user
//! and token, and one shell terminal, so a person can try tether with one
//! command and then `tether attach`.

use std::time::Duration;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::audit::Subject;
use crate::http::state::AppState;
use crate::store::{AuditAction, Revocation};

/// What the demo set up.
pub struct Demo {
    pub base_url: String,
    pub token: String,
    pub terminal_id: Uuid,
}

/// Why the demo could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("the in-process daemon did not come online within 30 s")]
    DaemonNotOnline,
    #[error("creating the terminal failed: {0}")]
    Terminal(String),
}

impl Demo {
    /// The lines printed for the person running the demo.
    pub fn instructions(&self) -> String {
        format!(
            "tether demo ready\n  page:     {base}/ (open it and sign in with the token)\n  token:    {token}\n  terminal: {id}\n  attach:   tether attach {id} --server {base} --token {token}\n  (with cargo: cargo run --release -- attach {id} --server {base} --token {token})",
            token = self.token,
            id = self.terminal_id,
            base = self.base_url,
        )
    }
}

/// The in-process daemon's state dir; `serve` removes it when it exits.
pub fn state_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tether-demo-{}", std::process::id()))
}

/// Creates the demo user and token, starts a daemon in this process and
/// opens a shell terminal on it. The tokens of earlier demos on this
/// database are revoked: each demo prints one, and only the running
/// demo's should open its shell.
pub async fn start(state: &AppState, base_url: &str) -> Result<Demo, DemoError> {
    let user = state.store.ensure_user("demo").await?;
    for earlier in state.store.list_tokens(user.id).await?.into_iter().filter(|t| t.revoked_at.is_none()) {
        if let Some(Revocation::Now { .. }) = state.store.revoke_token(Some(user.id), earlier.id).await? {
            let subject = Subject::default().with_detail(format!("token {} of an earlier demo", earlier.id));
            state.relay.audit.record(user.id, AuditAction::TokenRevoked, subject);
        }
    }
    let token = crate::auth::generate_token();
    state.store.insert_token(&crate::store::NewToken::full(user.id, &crate::auth::hash_token(&token))).await?;
    let options = crate::daemon::DaemonOptions {
        server: base_url.to_string(),
        token: token.clone(),
        name: Some("demo".into()),
        state_dir: state_dir(),
        allow_dirs: Vec::new(),
        lock_dirs: false,
        ca_file: None,
    };
    actix_rt::spawn(async move {
        if let Err(e) = crate::daemon::run(options).await {
            tracing::error!(error = %e, "tether_demo_daemon_failed");
        }
    });
    let host_id = wait_for_host(state, user.id).await?;
    let client = awc::Client::new();
    let mut res = client
        .post(format!("{base_url}/api/v1/terminals"))
        .insert_header(("Authorization", format!("Bearer {token}")))
        .send_json(&json!({"hostId": host_id, "title": "demo shell"}))
        .await
        .map_err(|e| DemoError::Terminal(e.to_string()))?;
    let body: Value = res.json().await.map_err(|e| DemoError::Terminal(e.to_string()))?;
    let terminal_id = body["terminal"]["id"]
        .as_str()
        .and_then(|id| Uuid::parse_str(id).ok())
        .ok_or_else(|| DemoError::Terminal(body.to_string()))?;
    Ok(Demo { base_url: base_url.to_string(), token, terminal_id })
}

async fn wait_for_host(state: &AppState, user_id: Uuid) -> Result<Uuid, DemoError> {
    for _ in 0..300 {
        for host in state.store.list_hosts(user_id).await? {
            let key = crate::store::host_lease_key(host.id);
            if state.store.lease_holder(&key).await?.is_some() {
                return Ok(host.id);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(DemoError::DaemonNotOnline)
}
