-- Audit (docs/SECURITY.md, "Audit"): an append-only record of who did what. Rows are never updated; the sweep deletes rows older than `audit.retention_ms`. No foreign keys to hosts or terminals: an event outlives the thing it names.

CREATE TABLE audit_events (
    id           uuid PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    user_id      uuid NOT NULL,
    token_id     uuid,
    action       text NOT NULL CHECK (action IN ('attach','detach','spawn','kill','input','resize',
                                                 'token_created','token_revoked','host_registered')),
    host_id      uuid,
    terminal_id  uuid,
    instance_id  text NOT NULL,
    detail       text
);
CREATE INDEX audit_events_user_at ON audit_events(user_id, at);
CREATE INDEX audit_events_at ON audit_events(at);

CREATE FUNCTION audit_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only';
END;
$$;
CREATE TRIGGER audit_events_append_only BEFORE UPDATE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_append_only();
