//! API tokens (docs/REST.md, "Conventions"; docs/PROTOCOL.md, "Connecting"):
//! `tth_` + 32 random bytes (base64url), stored only as a SHA-256 hash,
//! presented as `Authorization: Bearer TOKEN` or, for browsers' WebSockets,
//! as the subprotocol `tether.auth.TOKEN`.
//!
//! Tokens in query strings are never read.
//!
//! A request that presented a usable token is made by a [`Principal`]: the
//! user, the token's id and its scope. [`Access`] is what a route or socket
//! asks of it (docs/REST.md, "Scopes"); [`Principal::may`] is the one place
//! that decides.

use actix_web::http::header;
use actix_web::HttpRequest;
use base64::Engine;
use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::store::{ApiToken, Store, StoreResult, TokenScope, User};

/// Prefix of every API token.
pub const TOKEN_PREFIX: &str = "tth_";
/// Subprotocol prefix that carries a token for browser WebSockets.
pub const SUBPROTOCOL_AUTH_PREFIX: &str = "tether.auth.";

/// A new random token (shown once, never stored).
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The stored form of a token: lowercase hex SHA-256.
pub fn hash_token(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// True when `token` has the shape of a tether token (cheap pre-check before
/// a database lookup).
pub fn looks_like_token(token: &str) -> bool {
    token.len() > TOKEN_PREFIX.len()
        && token.len() <= 128
        && token.starts_with(TOKEN_PREFIX)
        && token[TOKEN_PREFIX.len()..].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The token of an HTTP request: `Authorization: Bearer TOKEN`.
pub fn bearer_token(req: &HttpRequest) -> Option<String> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim().to_string())
}

/// The token of a WebSocket upgrade: the Bearer header, else a
/// `tether.auth.TOKEN` entry of `Sec-WebSocket-Protocol`.
pub fn websocket_token(req: &HttpRequest) -> Option<String> {
    bearer_token(req).or_else(|| {
        offered_subprotocols(req).into_iter().find_map(|p| p.strip_prefix(SUBPROTOCOL_AUTH_PREFIX).map(str::to_string))
    })
}

/// Subprotocols the client offered, in order.
pub fn offered_subprotocols(req: &HttpRequest) -> Vec<String> {
    req.headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Reads a token lifetime as `token create --ttl` takes it: a whole number
/// and one unit, `s`, `m`, `h` or `d` (`90s`, `30m`, `12h`, `30d`).
pub fn parse_ttl(text: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("`{text}` is not a lifetime: use a number and s, m, h or d (90s, 30m, 12h, 30d)");
    let text = text.trim();
    let unit = text.chars().last().ok_or_else(bad)?;
    let seconds: u64 = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(bad()),
    };
    let count: u64 = text[..text.len() - 1].parse().map_err(|_| bad())?;
    let total = count.checked_mul(seconds).filter(|t| *t > 0).ok_or_else(bad)?;
    Ok(std::time::Duration::from_secs(total))
}

/// Who made a request: the user and the token that authenticated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user: User,
    /// The token's id (never its secret): audit records and revocation use it.
    pub token_id: Uuid,
    pub scope: TokenScope,
    /// A share token's one terminal.
    pub share_terminal: Option<Uuid>,
    /// The host a daemon token is bound to (None: not yet).
    pub bound_host: Option<Uuid>,
}

impl Principal {
    pub fn new(user: User, token: &ApiToken) -> Self {
        Self {
            user,
            token_id: token.id,
            scope: token.scope,
            share_terminal: token.terminal_id,
            bound_host: token.host_id,
        }
    }

    pub fn user_id(&self) -> Uuid {
        self.user.id
    }

    /// Whose WebSocket caps this principal's sockets count against
    /// (`crate::relay::limiter`): its user's, but a `read` token's (a share
    /// token's too) count against the token alone, so whoever was given a
    /// read-only link cannot use up the sockets of the user who gave it.
    pub fn cap_holder(&self) -> Uuid {
        match self.scope {
            TokenScope::Read => self.token_id,
            TokenScope::Full | TokenScope::Daemon => self.user.id,
        }
    }

    /// True for a viewer that may only watch.
    pub fn read_only(&self) -> bool {
        self.scope != TokenScope::Full
    }

    /// Whether this principal may use a route or socket of kind `access`;
    /// `terminal` is the terminal the path names, if any. Ownership is the
    /// handler's check (another user's resource is 404); this is the scope's.
    pub fn may(&self, access: Access, terminal: Option<&str>) -> Result<(), Denied> {
        let allowed = match (self.scope, access) {
            (_, Access::Public) => true,
            (_, Access::ClusterSecret) => false,
            (TokenScope::Full, _) => true,
            (TokenScope::Daemon, Access::RegisterHost | Access::DaemonSocket | Access::Assign) => true,
            (TokenScope::Daemon, _) => false,
            (TokenScope::Read, Access::ReadTerminal | Access::ViewerSocket) => match self.share_terminal {
                None => true,
                Some(shared) => terminal.and_then(|t| Uuid::parse_str(t).ok()) == Some(shared),
            },
            (TokenScope::Read, Access::Read) => self.share_terminal.is_none(),
            (TokenScope::Read, _) => false,
        };
        if allowed {
            Ok(())
        } else {
            Err(Denied { scope: self.scope, shared: self.share_terminal.is_some(), access })
        }
    }
}

/// Whether `presented` is the cluster secret `configured`, compared in
/// constant time: both are hashed first, so neither their contents nor
/// their lengths shape how long the comparison takes.
pub fn is_cluster_secret(configured: &str, presented: &str) -> bool {
    let (a, b) = (Sha256::digest(configured.as_bytes()), Sha256::digest(presented.as_bytes()));
    a.iter().zip(b.iter()).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// Why a `daemon` token may not speak for a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotItsHost {
    /// The token is bound to another host.
    BoundElsewhere,
    /// The token is unbound, and another usable daemon token is bound to the host.
    HostHasToken,
}

impl NotItsHost {
    /// The REST error code.
    pub fn code(self) -> &'static str {
        match self {
            NotItsHost::BoundElsewhere => "token_bound_to_other_host",
            NotItsHost::HostHasToken => "host_bound_to_other_token",
        }
    }

    /// The REST error message.
    pub fn message(self) -> &'static str {
        match self {
            NotItsHost::BoundElsewhere => {
                "this daemon token is bound to another host; create a new daemon token for this machine"
            }
            NotItsHost::HostHasToken => {
                "this host is bound to another daemon token; revoke that one (tether token list, tether token \
                 revoke) or create this one with --host"
            }
        }
    }

    /// The reason of a hello's 4403.
    pub fn close_reason(self) -> &'static str {
        match self {
            NotItsHost::BoundElsewhere => "this daemon token is bound to another host",
            NotItsHost::HostHasToken => "this host is bound to another daemon token",
        }
    }
}

/// Whether `principal` may speak for `host_id` (a hello, a registration): a
/// `daemon` token is bound to the first host it registers or says hello for
/// (or the one given at create) and to no other, so one machine's token
/// cannot impersonate another. It binds only to a host that no other usable
/// daemon token is bound to, so a new daemon token cannot take over a
/// machine that has one either (`token create --host` binds on purpose).
/// Other scopes reach every host of their user (ownership is the caller's
/// check).
pub async fn speaks_for(
    store: &dyn Store,
    principal: &Principal,
    host_id: Uuid,
) -> StoreResult<Result<(), NotItsHost>> {
    if principal.scope != TokenScope::Daemon {
        return Ok(Ok(()));
    }
    let bound = match principal.bound_host {
        Some(bound) => Some(bound),
        None => store.bind_token_host(principal.token_id, host_id).await?,
    };
    Ok(match bound {
        Some(bound) if bound == host_id => Ok(()),
        Some(_) => Err(NotItsHost::BoundElsewhere),
        None => Err(NotItsHost::HostHasToken),
    })
}

/// What a route or socket asks of the token (docs/REST.md, "Scopes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No token needed (health, metrics, the instance card).
    Public,
    /// Reads a user's resources: `full` and `read` tokens.
    Read,
    /// Reads one terminal named by the path: also a share token of that terminal.
    ReadTerminal,
    /// Changes something, or manages tokens: `full` tokens only.
    Control,
    /// `POST /hosts`: `full` and `daemon` tokens.
    RegisterHost,
    /// `/ws/v1/daemon`: `full` and `daemon` tokens.
    DaemonSocket,
    /// `POST /v1/assign` (the director's placement): `full` and `daemon` tokens.
    Assign,
    /// `/ws/v1/terminals/{id}`: `full`, `read`, and a share token of that terminal.
    ViewerSocket,
    /// `/internal/...`: the cluster secret (`cluster.secret`) as the
    /// Bearer credential; no user token reaches it, a `full` one neither.
    ClusterSecret,
}

/// A scope that does not reach a route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.explain())]
pub struct Denied {
    pub scope: TokenScope,
    pub shared: bool,
    pub access: Access,
}

impl Denied {
    fn explain(&self) -> String {
        if self.shared {
            return "a share token reaches only its one terminal, read-only".into();
        }
        let needs = match self.access {
            Access::RegisterHost | Access::DaemonSocket | Access::Assign => "a full or daemon token",
            _ => "a full token",
        };
        match self.scope {
            TokenScope::Daemon => "a daemon token may only register its host and dial /ws/v1/daemon".into(),
            TokenScope::Read => format!("a read token may only read; this needs {needs}"),
            TokenScope::Full => "not allowed".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn tokens_have_prefix_and_hash_is_stable() {
        let t = generate_token();
        assert!(looks_like_token(&t), "{t}");
        assert_eq!(t.len(), 4 + 43);
        assert_ne!(t, generate_token());
        assert_eq!(hash_token("tth_x"), hash_token("tth_x"));
        assert_eq!(hash_token("tth_x").len(), 64);
        assert!(!looks_like_token("tth_"));
        assert!(!looks_like_token("abc"));
        assert!(!looks_like_token("tth_a b"));
    }

    #[test]
    fn lifetimes_take_one_unit() {
        assert_eq!(parse_ttl("90s"), Ok(std::time::Duration::from_secs(90)));
        assert_eq!(parse_ttl("30m"), Ok(std::time::Duration::from_secs(1800)));
        assert_eq!(parse_ttl("12h"), Ok(std::time::Duration::from_secs(43_200)));
        assert_eq!(parse_ttl("30d"), Ok(std::time::Duration::from_secs(2_592_000)));
        for bad in ["", "s", "0s", "10", "1w", "-5m", "1.5h", "99999999999999999999d"] {
            assert!(parse_ttl(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn scopes_reach_their_routes_only() {
        let user = User { id: Uuid::new_v4(), name: "ann".into(), created_at: chrono::Utc::now() };
        let mk = |scope, share: Option<Uuid>| Principal {
            user: user.clone(),
            token_id: Uuid::new_v4(),
            scope,
            share_terminal: share,
            bound_host: None,
        };
        let all = [
            Access::Public,
            Access::Read,
            Access::ReadTerminal,
            Access::Control,
            Access::RegisterHost,
            Access::DaemonSocket,
            Access::ViewerSocket,
            Access::ClusterSecret,
        ];
        let full = mk(TokenScope::Full, None);
        let reached: Vec<_> = all.iter().filter(|a| full.may(**a, None).is_ok()).collect();
        assert_eq!(reached.len(), all.len() - 1, "a full token reaches everything but the cluster's routes");
        assert!(full.may(Access::ClusterSecret, None).is_err());
        let daemon = mk(TokenScope::Daemon, None);
        let reached: Vec<_> = all.iter().filter(|a| daemon.may(**a, None).is_ok()).collect();
        assert_eq!(reached, [&Access::Public, &Access::RegisterHost, &Access::DaemonSocket]);
        let read = mk(TokenScope::Read, None);
        let reached: Vec<_> = all.iter().filter(|a| read.may(**a, None).is_ok()).collect();
        assert_eq!(reached, [&Access::Public, &Access::Read, &Access::ReadTerminal, &Access::ViewerSocket]);
        let shared = Uuid::new_v4();
        let share = mk(TokenScope::Read, Some(shared));
        let id = shared.to_string();
        let reached: Vec<_> = all.iter().filter(|a| share.may(**a, Some(&id)).is_ok()).collect();
        assert_eq!(reached, [&Access::Public, &Access::ReadTerminal, &Access::ViewerSocket]);
        assert!(share.may(Access::ViewerSocket, Some(&Uuid::new_v4().to_string())).is_err());
        assert!(share.may(Access::ReadTerminal, None).is_err());
    }

    #[test]
    fn only_the_cluster_secret_itself_matches() {
        let secret = "0123456789abcdef-cluster";
        assert!(is_cluster_secret(secret, secret));
        for wrong in ["", "0123456789abcdef", "0123456789abcdef-clusteR", "0123456789abcdef-cluster "] {
            assert!(!is_cluster_secret(secret, wrong), "{wrong:?}");
        }
    }

    #[test]
    fn websocket_token_from_header_or_subprotocol() {
        let req = TestRequest::default().insert_header((header::AUTHORIZATION, "Bearer tth_abc")).to_http_request();
        assert_eq!(websocket_token(&req).as_deref(), Some("tth_abc"));
        let req = TestRequest::default()
            .insert_header((header::SEC_WEBSOCKET_PROTOCOL, "tether.v1, tether.auth.tth_def"))
            .to_http_request();
        assert_eq!(websocket_token(&req).as_deref(), Some("tth_def"));
        let req = TestRequest::with_uri("/ws?token=tth_zzz").to_http_request();
        assert_eq!(websocket_token(&req), None);
    }
}
