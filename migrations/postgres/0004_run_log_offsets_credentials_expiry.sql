-- Run logs across moves (docs/CLUSTER.md, "Run logs across moves"): `log_end` is the stream offset after the last
-- byte the capture stored (a capture resumes there; a chunk is stored only past it), `log_gap_bytes` the bytes the
-- daemon's ring no longer held when a capture resumed. Logs written before this migration have no gap, so their
-- end is their length.
-- Credentials auto-refresh (docs/CLUSTER.md, "Periodic host tasks"): the expiry the daemon's credentials state.
ALTER TABLE runs ADD COLUMN log_end bigint NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN log_gap_bytes bigint NOT NULL DEFAULT 0;
UPDATE runs SET log_end = length(log);
ALTER TABLE host_credentials ADD COLUMN expires_at timestamptz;
CREATE INDEX host_credentials_expiry ON host_credentials(expires_at) WHERE expires_at IS NOT NULL;
