-- Tokens with an id, a label, a scope, an expiry and a revocation (docs/REST.md, "Tokens").
-- The secret is still stored only as its SHA-256 hash; `id` names a token everywhere else.
-- Tokens made before this migration become scope `full` with no expiry.
-- SQLite cannot change a primary key in place, so the table is rebuilt.

CREATE TABLE api_tokens_v2 (
    id            text PRIMARY KEY,
    token_hash    text NOT NULL UNIQUE,   -- hex SHA-256 of the secret; the secret itself is never stored
    user_id       text NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name          text,
    scope         text NOT NULL DEFAULT 'full' CHECK (scope IN ('full', 'daemon', 'read')),
    host_id       text,                   -- a daemon token's bound host (set by --host or its first host)
    terminal_id   text REFERENCES terminals(id) ON DELETE CASCADE, -- a share token's one terminal
    created_at    integer NOT NULL,
    expires_at    integer,
    last_used_at  integer,
    revoked_at    integer,
    CHECK (terminal_id IS NULL OR scope = 'read')
);

INSERT INTO api_tokens_v2 (id, token_hash, user_id, scope, created_at)
SELECT lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || substr(hex(randomblob(2)), 2) || '-'
             || substr('89ab', 1 + (abs(random()) % 4), 1) || substr(hex(randomblob(2)), 2) || '-'
             || hex(randomblob(6))),
       token_hash, user_id, 'full', created_at
FROM api_tokens;

DROP TABLE api_tokens;
ALTER TABLE api_tokens_v2 RENAME TO api_tokens;
CREATE INDEX api_tokens_user ON api_tokens(user_id, created_at);
