-- The triggers of 0005 and 0007 again, with the time written so that any
-- SQLite reads it: unixepoch('subsec') needs SQLite 3.42, and an older
-- `sqlite3` shell (Debian 12 ships 3.40) evaluates it to NULL, so an
-- operator's UPDATE or DELETE of a token, or of a lease, failed on the
-- NOT NULL column. julianday('now') has the same millisecond resolution.
DROP TRIGGER api_tokens_changed;
DROP TRIGGER api_tokens_deleted;
DROP TRIGGER leases_renewal_touches_host;

CREATE TRIGGER api_tokens_changed AFTER UPDATE OF revoked_at, expires_at ON api_tokens
WHEN OLD.revoked_at IS NOT NEW.revoked_at OR OLD.expires_at IS NOT NEW.expires_at
BEGIN
    INSERT INTO api_token_ends (token_id, ended_at)
    VALUES (OLD.id, CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER));
END;

CREATE TRIGGER api_tokens_deleted AFTER DELETE ON api_tokens
BEGIN
    INSERT INTO api_token_ends (token_id, ended_at)
    VALUES (OLD.id, CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER));
END;

CREATE TRIGGER leases_renewal_touches_host
AFTER UPDATE OF expires_at ON leases
WHEN NEW.key LIKE 'host:%' AND NEW.holder = OLD.holder
BEGIN
    UPDATE hosts SET last_seen_at = CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER),
        state = 'online'
    WHERE id = substr(NEW.key, 6);
END;
