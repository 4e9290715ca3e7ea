-- Foundation schema (SQLite: uuids as text, times as integer milliseconds since the epoch): accounts, hosts, terminals, runs, leases and the cell tables.

CREATE TABLE users (
    id          text PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    created_at  integer NOT NULL
);

CREATE TABLE api_tokens (
    token_hash  text PRIMARY KEY,          -- hex SHA-256 of the token; the token itself is never stored
    user_id     text NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at  integer NOT NULL
);
CREATE INDEX api_tokens_user ON api_tokens(user_id);

CREATE TABLE hosts (
    id            text PRIMARY KEY,
    user_id       text NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name          text NOT NULL,
    hostname      text NOT NULL,
    platform      text NOT NULL,
    arch          text NOT NULL,
    state         text NOT NULL DEFAULT 'offline' CHECK (state IN ('online', 'offline')),
    capabilities  text NOT NULL DEFAULT '{}',
    dirs          text NOT NULL DEFAULT '[]',
    last_seen_at  integer,
    created_at    integer NOT NULL,
    UNIQUE (user_id, hostname)
);

CREATE TABLE host_credentials (
    host_id     text PRIMARY KEY REFERENCES hosts(id) ON DELETE CASCADE,
    nonce       blob NOT NULL,
    ciphertext  blob NOT NULL,
    updated_at  integer NOT NULL
);

CREATE TABLE runs (
    id            text PRIMARY KEY,
    user_id       text NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    host_id       text NOT NULL REFERENCES hosts(id) ON DELETE CASCADE,
    argv          text NOT NULL,
    dir           text,
    state         text NOT NULL CHECK (state IN ('queued','dispatched','running','succeeded','failed','lost')),
    exit_code     integer,
    cpu_ms        integer,
    max_rss_kb    integer,
    output_bytes  integer,
    wall_ms       integer,
    terminal_id   text,
    log           blob NOT NULL DEFAULT x'',
    created_at    integer NOT NULL,
    dispatched_at integer,
    finished_at   integer
);
CREATE INDEX runs_queue ON runs(created_at) WHERE state = 'queued';
CREATE INDEX runs_user ON runs(user_id, created_at);

CREATE TABLE terminals (
    id                  text PRIMARY KEY,
    user_id             text NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    host_id             text NOT NULL REFERENCES hosts(id) ON DELETE CASCADE,
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
    run_id              text REFERENCES runs(id) ON DELETE SET NULL,
    created_at          integer NOT NULL,
    launched_at         integer,
    started_at          integer,
    ended_at            integer,
    last_interacted_at  integer
);
CREATE INDEX terminals_host_state ON terminals(host_id, state);
CREATE INDEX terminals_user ON terminals(user_id, created_at);

CREATE TABLE terminal_snapshots (
    terminal_id  text PRIMARY KEY REFERENCES terminals(id) ON DELETE CASCADE,
    data         blob NOT NULL,
    cols         integer NOT NULL,
    rows         integer NOT NULL,
    created_at   integer NOT NULL
);

CREATE TABLE leases (
    key         text PRIMARY KEY,
    holder      text NOT NULL,
    expires_at  integer NOT NULL
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
    generation           integer NOT NULL DEFAULT 1,
    updated_at           integer NOT NULL
);

CREATE TABLE relay_cell_admit_effective (
    cell_id           text PRIMARY KEY,
    mode              text NOT NULL CHECK (mode IN ('db', 'reserve')),
    cell_incarnation  text NOT NULL,
    updated_at        integer NOT NULL
);

CREATE TABLE relay_assignments (
    host_id     text PRIMARY KEY,
    cell_id     text NOT NULL,
    epoch       integer NOT NULL,
    updated_at  integer NOT NULL
);
CREATE INDEX relay_assignments_cell ON relay_assignments(cell_id);
