-- Caps on live terminals per host and per user (docs/CONFIG.md, `terminals`): every terminal or run created counts
-- the live terminals of its host and its user, and the runs queued to become terminals. These partial indexes hold
-- only those rows, so the count does not grow with a user's history of ended terminals and finished runs (the
-- host's terminals are counted through terminals_host_state).
CREATE INDEX terminals_live_user ON terminals(user_id) WHERE state IN ('pending', 'launching', 'running');
CREATE INDEX runs_unstarted_host ON runs(host_id) WHERE state IN ('queued', 'dispatched') AND terminal_id IS NULL;
CREATE INDEX runs_unstarted_user ON runs(user_id) WHERE state IN ('queued', 'dispatched') AND terminal_id IS NULL;
