//! Caps on live terminals per host and per user (docs/CONFIG.md,
//! `terminals`; docs/REST.md, "Terminals"): the part both backends share.
//!
//! A terminal is live while it is `pending`, `launching` or `running`; an
//! exited or failed one no longer counts. A run that is `queued` or
//! `dispatched` and has no terminal yet counts too: it becomes a terminal
//! when a worker dispatches it, and that insert is not checked again (its
//! place was taken when the run was queued), so queued runs cannot carry a
//! user past the cap. Each backend counts and inserts in one transaction
//! that serialises the inserts of one user; the count and the verdict are
//! here.

use crate::config::Settings;

/// The most live terminals one host and one user may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminalCaps {
    pub per_host: u64,
    pub per_user: u64,
}

/// A new terminal or run refused because a cap is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CapReached {
    #[error("the host already has {0} live terminals, its most (setting terminals.max_per_host); end one first")]
    Host(u64),
    #[error("you already have {0} live terminals, your most (setting terminals.max_per_user); end one first")]
    User(u64),
}

impl TerminalCaps {
    /// The caps the settings name.
    pub fn of(settings: &Settings) -> Self {
        Self { per_host: settings.terminals.max_per_host, per_user: settings.terminals.max_per_user }
    }

    /// Whether one more terminal fits next to `host_live` and `user_live`
    /// (the two counts of [`LIVE_TERMINALS_SQL`]).
    pub fn admit(self, host_live: i64, user_live: i64) -> Result<(), CapReached> {
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        if count(host_live) >= self.per_host {
            return Err(CapReached::Host(self.per_host));
        }
        if count(user_live) >= self.per_user {
            return Err(CapReached::User(self.per_user));
        }
        Ok(())
    }
}

/// The live terminals of host `$1` and of user `$2`, in one row of two
/// counts. Written for both dialects: SQLite numbers `$1` and `$2` in order
/// of first use, as PostgreSQL does. The partial indexes of migration `live_terminal_indexes`
/// keep it to the live rows.
pub(crate) const LIVE_TERMINALS_SQL: &str = "SELECT \
       (SELECT count(*) FROM terminals WHERE host_id = $1 AND state IN ('pending', 'launching', 'running')) \
     + (SELECT count(*) FROM runs WHERE host_id = $1 AND state IN ('queued', 'dispatched') AND terminal_id IS NULL), \
       (SELECT count(*) FROM terminals WHERE user_id = $2 AND state IN ('pending', 'launching', 'running')) \
     + (SELECT count(*) FROM runs WHERE user_id = $2 AND state IN ('queued', 'dispatched') AND terminal_id IS NULL)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_more_fits_only_below_both_caps() {
        let caps = TerminalCaps { per_host: 2, per_user: 3 };
        assert_eq!(caps.admit(0, 0), Ok(()));
        assert_eq!(caps.admit(1, 2), Ok(()));
        assert_eq!(caps.admit(2, 2), Err(CapReached::Host(2)));
        assert_eq!(caps.admit(1, 3), Err(CapReached::User(3)));
        assert_eq!(caps.admit(5, 5), Err(CapReached::Host(2)), "the host's cap is named first");
    }
}
