-- Foundation schema: accounts, hosts, terminals, runs, leases and the cell tables.

CREATE TABLE users (
    id          uuid PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_tokens (
    token_hash  text PRIMARY KEY,          -- hex SHA-256 of the token; the token itself is never stored
    user_id     uuid NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX api_tokens_user ON api_tokens(user_id);

CREATE TABLE hosts (
    id            uuid PRIMARY KEY,
    user_id       uuid NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name          text NOT NULL,
    hostname      text NOT NULL,
    platform      text NOT NULL,
    arch          text NOT NULL,
    state         text NOT NULL DEFAULT 'offline' CHECK (state IN ('online', 'offline')),
    capabilities  text NOT NULL DEFAULT '{}',
    dirs          text NOT NULL DEFAULT '[]',
    last_seen_at  timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (user_id, hostname)
);

CREATE TABLE host_credentials (
    host_id     uuid PRIMARY KEY REFERENCES hosts(id) ON DELETE CASCADE,
    nonce       bytea NOT NULL,
    ciphertext  bytea NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE runs (
    id            uuid PRIMARY KEY,
    user_id       uuid NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    host_id       uuid NOT NULL REFERENCES hosts(id) ON DELETE CASCADE,
    argv          text NOT NULL,
    dir           text,
    state         text NOT NULL CHECK (state IN ('queued','dispatched','running','succeeded','failed','lost')),
    exit_code     integer,
    cpu_ms        bigint,
    max_rss_kb    bigint,
    output_bytes  bigint,
    wall_ms       bigint,
    terminal_id   uuid,
    log           bytea NOT NULL DEFAULT ''::bytea,
    created_at    timestamptz NOT NULL DEFAULT now(),
    dispatched_at timestamptz,
    finished_at   timestamptz
);
CREATE INDEX runs_queue ON runs(created_at) WHERE state = 'queued';
CREATE INDEX runs_user ON runs(user_id, created_at);

CREATE TABLE terminals (
    id                  uuid PRIMARY KEY,
    user_id             uuid NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    host_id             uuid NOT NULL REFERENCES hosts(id) ON DELETE CASCADE,
    title               text,
    dir                 text,
    argv                text NOT NULL,
    state               text NOT NULL CHECK (state IN ('pending','launching','running','exited','error')),
    pending_reason      text,
    exit_code           integer,
    exit_signal         integer,
    error               text,
    cols                integer NOT NULL,
    rows                integer NOT NULL,
    run_id              uuid REFERENCES runs(id) ON DELETE SET NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    launched_at         timestamptz,
    started_at          timestamptz,
    ended_at            timestamptz,
    last_interacted_at  timestamptz
);
CREATE INDEX terminals_host_state ON terminals(host_id, state);
CREATE INDEX terminals_user ON terminals(user_id, created_at);

CREATE TABLE terminal_snapshots (
    terminal_id  uuid PRIMARY KEY REFERENCES terminals(id) ON DELETE CASCADE,
    data         bytea NOT NULL,
    cols         integer NOT NULL,
    rows         integer NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE leases (
    key         text PRIMARY KEY,
    holder      text NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX leases_holder ON leases(holder);

CREATE TABLE relay_cells (
    cell_id            text PRIMARY KEY,
    url                text NOT NULL,
    region             text NOT NULL DEFAULT '',
    pool_size          integer NOT NULL DEFAULT 0,
    reserve_pool_size  integer NOT NULL DEFAULT 0
);

CREATE TABLE relay_cell_admit_modes (
    cell_id              text PRIMARY KEY,
    admit_mode           text NOT NULL CHECK (admit_mode IN ('db', 'reserve')),
    dead_man_trip_slots  integer CHECK (dead_man_trip_slots BETWEEN 0 AND 64),
    generation           bigint NOT NULL DEFAULT 1,
    updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE relay_cell_admit_effective (
    cell_id           text PRIMARY KEY,
    mode              text NOT NULL CHECK (mode IN ('db', 'reserve')),
    cell_incarnation  text NOT NULL,
    updated_at        timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE relay_assignments (
    host_id     uuid PRIMARY KEY,
    cell_id     text NOT NULL,
    epoch       bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX relay_assignments_cell ON relay_assignments(cell_id);
