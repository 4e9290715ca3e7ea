//! API token rows (docs/REST.md, "Tokens"): an id, a label, a scope, an
//! optional expiry, the last use, a revocation, and the host a daemon token
//! is bound to or the one terminal a share token reaches. The secret never
//! appears here: the store keeps only its SHA-256 hash.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::StoreError;

/// What a token may do (docs/REST.md, "Scopes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TokenScope {
    /// Everything its user may do.
    Full,
    /// Only the daemon socket and host registration, for one host.
    Daemon,
    /// Watch terminals and read resources; never type, resize or claim the grid.
    Read,
}

impl TokenScope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Daemon => "daemon",
            Self::Read => "read",
        }
    }
}

impl fmt::Display for TokenScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TokenScope {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "full" => Self::Full,
            "daemon" => Self::Daemon,
            "read" => Self::Read,
            other => return Err(StoreError::Corrupt(format!("token scope `{other}`"))),
        })
    }
}

/// What [`super::Store::ended_tokens`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedTokens {
    /// Tokens no longer usable, each once.
    pub ended: Vec<Uuid>,
    /// The database's clock when it read them.
    pub checked_at: DateTime<Utc>,
}

/// A token row; its JSON form is the API's token resource (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiToken {
    pub id: Uuid,
    #[serde(skip)]
    pub user_id: Uuid,
    pub name: Option<String>,
    pub scope: TokenScope,
    /// The host a daemon token is bound to.
    pub host_id: Option<Uuid>,
    /// The one terminal a share token reaches.
    pub terminal_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A token to insert.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub user_id: Uuid,
    /// Hex SHA-256 of the secret (`auth::hash_token`).
    pub token_hash: String,
    pub name: Option<String>,
    pub scope: TokenScope,
    pub expires_at: Option<DateTime<Utc>>,
    pub host_id: Option<Uuid>,
    pub terminal_id: Option<Uuid>,
}

impl NewToken {
    /// A `full` token with no label and no expiry (what `token create` makes by default).
    pub fn full(user_id: Uuid, token_hash: &str) -> Self {
        Self {
            user_id,
            token_hash: token_hash.to_string(),
            name: None,
            scope: TokenScope::Full,
            expires_at: None,
            host_id: None,
            terminal_id: None,
        }
    }
}

/// How often `last_used_at` may be written per token.
pub const LAST_USED_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
