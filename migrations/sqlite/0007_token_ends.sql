-- Ended tokens for the revocation watch (docs/ARCHITECTURE.md, "Closing the sockets of an ended token").
-- Every change to a token's revocation or expiry, and every deleted token (cascades included), is logged
-- here, so an instance asks "what ended since my last look" instead of sending the ids of all its open
-- sockets' tokens every tick. A logged id is closed only if the token is unusable when read; rows older
-- than an hour are deleted by the sweep. Times are Unix milliseconds, as everywhere in this schema.
CREATE TABLE api_token_ends (
    token_id  text NOT NULL,
    ended_at  integer NOT NULL
);
CREATE INDEX api_token_ends_at ON api_token_ends(ended_at);
CREATE INDEX api_tokens_expiry ON api_tokens(expires_at) WHERE expires_at IS NOT NULL;

CREATE TRIGGER api_tokens_changed AFTER UPDATE OF revoked_at, expires_at ON api_tokens
WHEN OLD.revoked_at IS NOT NEW.revoked_at OR OLD.expires_at IS NOT NEW.expires_at
BEGIN
    INSERT INTO api_token_ends (token_id, ended_at) VALUES (OLD.id, CAST(unixepoch('subsec') * 1000 AS INTEGER));
END;

CREATE TRIGGER api_tokens_deleted AFTER DELETE ON api_tokens
BEGIN
    INSERT INTO api_token_ends (token_id, ended_at) VALUES (OLD.id, CAST(unixepoch('subsec') * 1000 AS INTEGER));
END;
