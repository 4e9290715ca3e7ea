# Ephemeral PostgreSQL and Redis servers for the benchmark scripts
# (scripts/cluster-bench, scripts/scale-bench), started the way scripts/test
# starts them: free loopback ports, files in one temp dir, a parent-death
# signal on each server, and a cleanup on exit that stops them and removes
# the files. Source it from bash after defining log() and die(), then call
# bench_servers_init once and start_postgres / start_redis as needed.

is_root() { [ "$(id -u)" -eq 0 ]; }

find_pg_bindir() {
    local initdb dir
    if initdb=$(command -v initdb 2>/dev/null); then
        dir=$(dirname "$(readlink -f "$initdb")")
        [ -x "$dir/postgres" ] && { echo "$dir"; return 0; }
    fi
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ] && { echo "$dir"; return 0; }
    done
    return 1
}

as_postgres() { if is_root; then runuser -u postgres -- "$@"; else "$@"; fi; }
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() {
    local port
    for _ in $(seq 1 200); do
        port=$((15000 + RANDOM % 7000))
        port_in_use "$port" || { echo "$port"; return 0; }
    done
    die "found no free port"
}

BENCH_WORK=""
BENCH_PIDS=()
bench_cleanup() {
    local status=$? pid
    for pid in "${BENCH_PIDS[@]}"; do kill -QUIT "$pid" 2>/dev/null || true; done
    sleep 0.5
    for pid in "${BENCH_PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
    [ -n "$BENCH_WORK" ] && rm -rf "$BENCH_WORK"
    exit "$status"
}

# bench_spawn pg|other LOG COMMAND...: background, dies with the script
# (setpriv --pdeathsig after the user change, as in scripts/test).
bench_spawn() {
    local kind=$1 logfile=$2
    shift 2
    local wrapper=(setpriv --pdeathsig KILL --)
    if [ "$kind" = pg ] && is_root; then
        wrapper=(setpriv --reuid=postgres --regid=postgres --clear-groups --pdeathsig KILL --)
    fi
    "${wrapper[@]}" "$@" >>"$logfile" 2>&1 </dev/null &
    BENCH_PIDS+=("$!")
    disown "$!"
}

wait_until() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.05
    done
}

# The cleanup trap and the temp dir (PREFIX names it).
bench_servers_init() {
    trap bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    BENCH_WORK=$(mktemp -d "/tmp/$1-XXXXXX")
    chmod 0755 "$BENCH_WORK"
}

pg_ready() { [ "$(sed -n 8p "$BENCH_WORK/pg/data/postmaster.pid" 2>/dev/null | tr -d ' ')" = ready ]; }

# Starts PostgreSQL with pg_stat_statements preloaded (to count statements)
# and exports TETHER_BENCH_DATABASE_URL.
start_postgres() {
    local bin port
    bin=$(find_pg_bindir) || die "PostgreSQL server binaries not found (Debian package postgresql)"
    if is_root && ! id -u postgres >/dev/null 2>&1; then
        useradd --system --user-group --home-dir /var/lib/postgresql --shell /usr/sbin/nologin postgres
    fi
    mkdir -p "$BENCH_WORK/pg"
    chmod 0755 "$BENCH_WORK/pg"
    is_root && chown postgres:postgres "$BENCH_WORK/pg"
    (cd "$BENCH_WORK/pg" && as_postgres "$bin/initdb" -D "$BENCH_WORK/pg/data" -A trust --no-sync -U postgres -E UTF8 --locale=C) \
        >"$BENCH_WORK/pg/initdb.log" 2>&1 || { cat "$BENCH_WORK/pg/initdb.log" >&2; die "initdb failed"; }
    port=$(pick_port)
    bench_spawn pg "$BENCH_WORK/pg/postgres.log" "$bin/postgres" -D "$BENCH_WORK/pg/data" -k "$BENCH_WORK/pg" -p "$port" \
        -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
        -c max_connections=300 -c shared_buffers=128MB \
        -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.max=10000
    wait_until 60 pg_ready || { cat "$BENCH_WORK/pg/postgres.log" >&2; die "PostgreSQL did not start"; }
    export TETHER_BENCH_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
    log "PostgreSQL $TETHER_BENCH_DATABASE_URL"
}

redis_pong() { [ "$(redis-cli -h 127.0.0.1 -p "$1" ping)" = PONG ]; }

# Starts a standalone redis-server and exports TETHER_BENCH_REDIS_URL.
start_redis() {
    local port
    command -v redis-server >/dev/null || die "redis-server not found (Debian package redis-server)"
    mkdir -p "$BENCH_WORK/redis"
    port=$(pick_port)
    bench_spawn redis "$BENCH_WORK/redis/redis.log" redis-server --port "$port" --bind 127.0.0.1 --save "" \
        --appendonly no --daemonize no --dir "$BENCH_WORK/redis" --maxclients 20000
    wait_until 30 redis_pong "$port" || { cat "$BENCH_WORK/redis/redis.log" >&2; die "redis-server did not start"; }
    export TETHER_BENCH_REDIS_URL="redis://127.0.0.1:$port"
    log "Redis $TETHER_BENCH_REDIS_URL"
}
