#!/usr/bin/env bash
# `make run`: start (or reuse) a local PostgreSQL, migrate it, create the demo tag and
# table (scripts/demo.sql, which docker-compose.yml runs too), and serve leafproxy on
# 127.0.0.1:6432 (admin HTTP on 127.0.0.1:8080). Each step says what it does on stderr.
#
#   scripts/run.sh           start everything; Ctrl-C stops the proxy, PostgreSQL keeps running
#   scripts/run.sh --stop    stop the PostgreSQL this script started
#   scripts/run.sh --reset   stop it and delete its data
#
# Environment: LEAFPROXY_RUN_DIR (PostgreSQL's data and log; default a directory under
# $TMPDIR), LEAFPROXY_RUN_PGPORT (default 5433), LEAFPROXY_LISTEN (default 127.0.0.1:6432),
# LEAFPROXY_HTTP (default 127.0.0.1:8080), LEAFPROXY_RUN_BIN (a leafproxy binary to use
# instead of building bin/leafproxy); every other LEAFPROXY_* variable reaches serve.
set -euo pipefail
cd "$(dirname "$0")/.."

run_dir="${LEAFPROXY_RUN_DIR:-${TMPDIR:-/tmp}/leafproxy-run-$(id -u)}"
pg_port="${LEAFPROXY_RUN_PGPORT:-5433}"
listen="${LEAFPROXY_LISTEN:-127.0.0.1:6432}"
http="${LEAFPROXY_HTTP:-127.0.0.1:8080}"
data="$run_dir/pgdata"
log="$run_dir/postgres.log"
dsn="postgres://postgres@127.0.0.1:${pg_port}/postgres?sslmode=disable"
GO="${GO:-go}"

say() { echo "run: $*" >&2; }

find_pg_bin() {
  if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
    pg_config --bindir
    return
  fi
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n | tail -n 1 || true)
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then
    echo "$d"
    return
  fi
  command -v initdb >/dev/null 2>&1 && dirname "$(command -v initdb)"
}

pg_bin="${LEAF_TEST_PG_BIN:-$(find_pg_bin || true)}"
if [ -z "$pg_bin" ]; then
  say "PostgreSQL server binaries not found; installing them"
  scripts/install-deps.sh
  pg_bin="$(find_pg_bin)"
fi

# initdb refuses to run as root: as root, PostgreSQL runs as the postgres user.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

pg_running() { as_pg "$pg_bin/pg_ctl" -D "$data" status >/dev/null 2>&1; }

case "${1:-}" in
  --stop|--reset)
    if [ -d "$data" ] && pg_running; then
      as_pg "$pg_bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null
      say "stopped PostgreSQL on port $pg_port"
    fi
    if [ "$1" = --reset ]; then
      rm -rf "$run_dir"
      say "removed $run_dir"
    fi
    exit 0
    ;;
  "") ;;
  *) echo "usage: scripts/run.sh [--stop|--reset]" >&2; exit 2 ;;
esac

mkdir -p "$run_dir"
if [ "$(id -u)" -eq 0 ]; then
  chown postgres: "$run_dir"
fi
if [ ! -f "$data/PG_VERSION" ]; then
  say "creating a PostgreSQL cluster in $data"
  as_pg "$pg_bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --no-locale >/dev/null
  cat >>"$data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$run_dir'
max_connections = 300
CONF
fi
if pg_running; then
  say "reusing PostgreSQL on port $pg_port ($data)"
else
  say "starting PostgreSQL on port $pg_port (log: $log)"
  as_pg "$pg_bin/pg_ctl" -D "$data" -l "$log" -w -t 60 -o "-p $pg_port" start >/dev/null
fi

# LEAFPROXY_RUN_BIN: use this binary instead of building bin/leafproxy (the tests do).
leafproxy="${LEAFPROXY_RUN_BIN:-bin/leafproxy}"
if [ -z "${LEAFPROXY_RUN_BIN:-}" ]; then
  say "building bin/leafproxy with $("$GO" env GOVERSION) (the first build compiles PostgreSQL's C parser, pg_query_go: about 75 s; later builds take seconds)"
  "$GO" build -o bin/leafproxy ./cmd/leafproxy
  say "built bin/leafproxy"
fi
say "applying the migrations (leaf_alloc, leaf_worker_lease) to $dsn"
"$leafproxy" migrate up --dsn "$dsn" >&2

# Demo: "audit" is a segment tag (a leaf_alloc row), "order" a snowflake tag, and INSERTs
# into orders get their id filled with an "order" ID. docker-compose.yml runs the same file.
say "creating the demo tag audit and the table orders (scripts/demo.sql)"
"$pg_bin/psql" -q -X -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres \
  -f scripts/demo.sql >&2

host=${listen%:*}
port=${listen##*:}
cat >&2 <<MSG

leafproxy is starting on $listen (admin and status page: http://$http/).
Try:
  psql -h $host -p $port -U postgres -c "select leaf_next('order')"
  psql -h $host -p $port -U postgres -c "select leaf_next('audit')"
  psql -h $host -p $port -U postgres -c "insert into orders (item) values ('book') returning id"
  curl http://$http/api/segment/get/audit
Ctrl-C stops the proxy; "scripts/run.sh --stop" stops PostgreSQL.

MSG
exec "$leafproxy" serve --store "$dsn" --upstream "127.0.0.1:$pg_port" --upstream-sslmode disable \
  --listen "$listen" --http "$http" --snowflake-tags order --fill orders.id=order
