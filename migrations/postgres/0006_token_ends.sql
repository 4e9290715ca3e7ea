-- Ended tokens for the revocation watch (docs/ARCHITECTURE.md, "Closing the sockets of an ended token").
-- Every change to a token's revocation or expiry, and every deleted token (cascades included), is logged
-- here, so an instance asks "what ended since my last look" instead of sending the ids of all its open
-- sockets' tokens every tick. A logged id is closed only if the token is unusable when read; rows older
-- than an hour are deleted by the sweep.
CREATE TABLE api_token_ends (
    token_id  uuid NOT NULL,
    ended_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX api_token_ends_at ON api_token_ends(ended_at);
CREATE INDEX api_tokens_expiry ON api_tokens(expires_at) WHERE expires_at IS NOT NULL;

CREATE FUNCTION api_token_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO api_token_ends (token_id) VALUES (OLD.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER api_tokens_changed AFTER UPDATE OF revoked_at, expires_at ON api_tokens
FOR EACH ROW WHEN (OLD.revoked_at IS DISTINCT FROM NEW.revoked_at OR OLD.expires_at IS DISTINCT FROM NEW.expires_at)
EXECUTE FUNCTION api_token_ended();

CREATE TRIGGER api_tokens_deleted AFTER DELETE ON api_tokens
FOR EACH ROW EXECUTE FUNCTION api_token_ended();
