-- Audit (docs/SECURITY.md, "Audit"): an append-only record of who did what. Rows are never updated; the sweep deletes rows older than `audit.retention_ms`. No foreign keys to hosts or terminals: an event outlives the thing it names.

CREATE TABLE audit_events (
    id           text PRIMARY KEY,
    at           integer NOT NULL,
    user_id      text NOT NULL,
    token_id     text,
    action       text NOT NULL CHECK (action IN ('attach','detach','spawn','kill','input','resize',
                                                 'token_created','token_revoked','host_registered')),
    host_id      text,
    terminal_id  text,
    instance_id  text NOT NULL,
    detail       text
);
CREATE INDEX audit_events_user_at ON audit_events(user_id, at);
CREATE INDEX audit_events_at ON audit_events(at);

CREATE TRIGGER audit_events_append_only BEFORE UPDATE ON audit_events
BEGIN
    SELECT RAISE(ABORT, 'audit events are append-only');
END;
