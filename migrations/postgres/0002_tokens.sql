-- Tokens with an id, a label, a scope, an expiry and a revocation (docs/REST.md, "Tokens").
-- The secret is still stored only as its SHA-256 hash; `id` names a token everywhere else.
-- Tokens made before this migration become scope `full` with no expiry.

ALTER TABLE api_tokens ADD COLUMN id uuid;
UPDATE api_tokens SET id = gen_random_uuid();
ALTER TABLE api_tokens ALTER COLUMN id SET NOT NULL;
ALTER TABLE api_tokens DROP CONSTRAINT api_tokens_pkey;
ALTER TABLE api_tokens ADD PRIMARY KEY (id);
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_token_hash_key UNIQUE (token_hash);

ALTER TABLE api_tokens
    ADD COLUMN name          text,
    ADD COLUMN scope         text NOT NULL DEFAULT 'full' CHECK (scope IN ('full', 'daemon', 'read')),
    ADD COLUMN host_id       uuid,        -- a daemon token's bound host (set by --host or its first host)
    ADD COLUMN terminal_id   uuid REFERENCES terminals(id) ON DELETE CASCADE, -- a share token's one terminal
    ADD COLUMN expires_at    timestamptz,
    ADD COLUMN last_used_at  timestamptz,
    ADD COLUMN revoked_at    timestamptz,
    ADD CONSTRAINT api_tokens_share_is_read CHECK (terminal_id IS NULL OR scope = 'read');

DROP INDEX api_tokens_user;
CREATE INDEX api_tokens_user ON api_tokens(user_id, created_at);
