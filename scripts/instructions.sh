#!/usr/bin/env bash
# Counts the instructions a hop runs in user space per transaction, under valgrind's
# callgrind: leafproxy in transaction mode (this module's build, and any other binaries
# given) and PgBouncer in transaction mode, each with a pool of POOL server connections
# (with POOL_MODE=session, both in session mode, a server connection per client),
# under `pgbench -S` with CLIENTS clients for DURATION seconds. Instructions are counted
# from pgbench's first connection to its last transaction, and divided by the
# transactions pgbench reports; the hop's background work (health checks, timers) and
# the clients' logins are in the figure. A first run of 5 seconds, not counted, warms each
# hop up.
#
# On a shared machine a count of instructions moves by a few percent from one run to the
# next, where CPU time moves by tens: it is the figure to compare two builds of the same
# code. It leaves out what the kernel does for the hop and the time cache misses cost.
#
# With COUNT=syscalls it counts the hop's system calls per transaction instead, under
# `strace -c` (each call then stops the hop: the transactions a second mean nothing, the
# calls per transaction do), with the calls that move the data broken out.
#
# Run it under the test environment, which starts PostgreSQL (`make bench-instructions`
# does):
#   go run ./internal/testenv/cmd/testenv -no-zk -- scripts/instructions.sh [OTHER_BINARY ...]
# Settings, from the environment: COUNT (instructions or syscalls), CLIENTS (50), POOL (20), POOL_MODE (transaction or
# session), DURATION (20, seconds), MODES (simple extended prepared), PGBOUNCER (1; 0
# leaves it out), KEEP (a directory: each counted run's callgrind profile is copied there as
# HOP-MODE.callgrind, for `callgrind_annotate` to break the count down by function).
set -euo pipefail

CLIENTS=${CLIENTS:-50}
POOL=${POOL:-20}
POOL_MODE=${POOL_MODE:-transaction}
case "$POOL_MODE" in
  transaction) leafPool=(--pool-mode transaction --pool-size "$POOL" --auth-type trust) ;;
  session)
    leafPool=(--pool-mode session)
    POOL=$CLIENTS
    ;;
  *) echo "instructions: POOL_MODE is transaction or session, not $POOL_MODE" >&2; exit 2 ;;
esac
COUNT=${COUNT:-instructions}
case "$COUNT" in
  instructions) tools=(valgrind callgrind_control) ;;
  syscalls) tools=(strace) ;;
  *) echo "instructions: COUNT is instructions or syscalls, not $COUNT" >&2; exit 2 ;;
esac
SECONDS_RUN=${DURATION:-20}
MODES=${MODES:-simple extended prepared}
PGBOUNCER=${PGBOUNCER:-1}
: "${LEAF_TEST_PG:?run under the test environment: go run ./internal/testenv/cmd/testenv -no-zk -- $0}"
for tool in "${tools[@]}" pgbench psql; do
  command -v "$tool" >/dev/null || { echo "instructions: $tool is missing (scripts/install-deps.sh --bench)" >&2; exit 1; }
done
[ "$PGBOUNCER" = 0 ] || command -v pgbouncer >/dev/null ||
  { echo "instructions: pgbouncer is missing (scripts/install-deps.sh --bench)" >&2; exit 1; }

work=$(mktemp -d)
chmod 755 "$work"
pids=()
db=leafproxy_instructions
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PGOPTIONS='-c client_min_messages=warning' psql "$LEAF_TEST_PG" -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# The server, from the test environment's URL: postgres://user@host:port/db?...
hostport=$(sed -E 's#^[a-z]+://([^@/]*@)?([^/?]+).*#\2#' <<<"$LEAF_TEST_PG")
host=${hostport%:*}
port=${hostport##*:}
user=$(sed -E 's#^[a-z]+://([^:@/]+).*#\1#' <<<"$LEAF_TEST_PG")
PGOPTIONS='-c client_min_messages=warning' psql "$LEAF_TEST_PG" -qc "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
dbURL=$(sed -E "s#/[^/?]*(\?|$)#/$db\1#" <<<"$LEAF_TEST_PG")
pgbench -i -q -s 10 "$dbURL" >"$work/init.out" 2>&1 || { cat "$work/init.out" >&2; exit 1; }

go build -o "$work/leafproxy" ./cmd/leafproxy
bins=("$work/leafproxy" "$@")

# freeport prints a loopback port nothing listens on.
freeport() {
  local p
  while :; do
    p=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}

# waitport PORT: wait until something accepts connections on PORT (valgrind starts slowly).
waitport() {
  for _ in $(seq 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.2
  done
  echo "instructions: nothing listens on port $1" >&2
  return 1
}

# dumps OUT: how many dumps callgrind has written to OUT.N.
dumps() {
  local n=0 f
  for f in "$1".*; do [ -e "$f" ] && n=$((n + 1)); done
  echo "$n"
}

# measure NAME PORT PID AS_USER OUT: one pgbench run per mode against PORT, with
# instrumentation on for exactly that run; prints a line per mode.
measure() {
  local name=$1 p=$2 pid=$3 as=$4 out=$5 mode tx before after
  local ctl=(callgrind_control)
  [ -z "$as" ] || ctl=(runuser -u "$as" -- callgrind_control)
  # A first run, not counted, opens the pool's server connections and fills the caches
  # a hop keeps (statements planned, settings applied).
  pgbench -n -S -c "$CLIENTS" -j 2 -T 5 -M extended \
    "postgres://$user@127.0.0.1:$p/$db?sslmode=disable" >"$work/pgbench.out" 2>&1 ||
    { cat "$work/pgbench.out" >&2; return 1; }
  for mode in $MODES; do
    if [ "$name" = pgbouncer ] && [ "$mode" = prepared ] && [ "$POOL_MODE" = transaction ]; then
      # PgBouncer before 1.21 does not track protocol-level prepared statements in
      # transaction mode: pgbench -M prepared fails through it at once.
      printf '%-22s %-9s cannot (no prepared statements in transaction mode)\n' "$name" "$mode"
      continue
    fi
    if [ "$COUNT" = syscalls ]; then
      countSyscalls "$name" "$mode" "$p" "$pid" || return 1
      continue
    fi
    "${ctl[@]}" -i on "$pid" >/dev/null 2>&1
    pgbench -n -S -c "$CLIENTS" -j 2 -T "$SECONDS_RUN" -M "$mode" \
      "postgres://$user@127.0.0.1:$p/$db?sslmode=disable" >"$work/pgbench.out" 2>&1 ||
      { cat "$work/pgbench.out" >&2; return 1; }
    "${ctl[@]}" -i off "$pid" >/dev/null 2>&1
    before=$(dumps "$out")
    "${ctl[@]}" -d "$pid" >/dev/null 2>&1
    for _ in $(seq 100); do
      after=$(dumps "$out")
      [ "$after" -gt "$before" ] && break
      sleep 0.1
    done
    tx=$(awk '/number of transactions actually processed/{split($NF, a, "/"); print a[1]}' "$work/pgbench.out")
    local dump="$out.$after"
    awk -v name="$name" -v mode="$mode" -v tx="$tx" '
      /^totals:/ { ir = $2 }
      END { printf "%-22s %-9s %9d tx %14d instructions %8.0f per transaction\n", name, mode, tx, ir, ir / tx }' "$dump"
    if [ -n "${KEEP:-}" ]; then
      mkdir -p "$KEEP"
      cp "$dump" "$KEEP/${name// /-}-$mode.callgrind"
    fi
  done
}

# countSyscalls NAME MODE PORT PID: one pgbench run in MODE against PORT with the hop's
# system calls counted by strace (all its threads); prints a line.
countSyscalls() {
  local name=$1 mode=$2 p=$3 pid=$4 sp tx
  strace -c -f -q -p "$pid" -o "$work/strace.out" &
  sp=$!
  sleep 1 # strace attaches to each thread of the hop
  pgbench -n -S -c "$CLIENTS" -j 2 -T "$SECONDS_RUN" -M "$mode" \
    "postgres://$user@127.0.0.1:$p/$db?sslmode=disable" >"$work/pgbench.out" 2>&1 ||
    { cat "$work/pgbench.out" >&2; kill -INT "$sp"; return 1; }
  kill -INT "$sp"
  wait "$sp" || true
  tx=$(awk '/number of transactions actually processed/{split($NF, a, "/"); print a[1]}' "$work/pgbench.out")
  awk -v name="$name" -v mode="$mode" -v tx="$tx" '
    $NF == "total" { total = $4 }
    $NF ~ /^(recvfrom|read|sendto|write|epoll_wait|epoll_pwait|io_uring_enter)$/ { n[$NF] = $4 }
    END {
      printf "%-22s %-9s %9d tx %10d system calls %6.2f per transaction:", name, mode, tx, total, total / tx
      for (c in n) printf " %s %.2f", c, n[c] / tx
      printf "\n"
    }' "$work/strace.out"
}

# Counting starts off: measure turns it on for each run. (Go's asynchronous preemption
# signals trip callgrind up; leafproxy runs with them off. Where the CPU has RDTSCP, Go's
# runtime reads the clock with it when a lock is contended, an instruction valgrind 3.19
# does not know: the process dies of SIGILL. cpu.rdtscp=off makes it use RDTSC.)
callgrind=(valgrind --tool=callgrind --instr-atstart=no)

# runner OUT: sets runner to the words that start a hop: under callgrind, writing to OUT,
# when counting instructions; as it is when counting system calls.
runner() {
  runner=()
  [ "$COUNT" = syscalls ] || runner=("${callgrind[@]}" --callgrind-out-file="$1")
}

what="user-space instructions under callgrind"
[ "$COUNT" = instructions ] || what="system calls under strace"
echo "pgbench -S, $CLIENTS clients, $POOL_MODE mode, pool of $POOL, ${SECONDS_RUN}s per mode; $what"
i=0
for bin in "${bins[@]}"; do
  i=$((i + 1))
  p=$(freeport)
  h=$(freeport)
  out="$work/leafproxy-$i.callgrind"
  runner "$out"
  GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off "${runner[@]}" \
    "$bin" serve --listen "127.0.0.1:$p" --http "127.0.0.1:$h" --upstream "$host:$port" \
    --upstream-sslmode disable --store "$dbURL" --migrate-on-start --snowflake-tags order,pay \
    --fill orders.id=order "${leafPool[@]}" \
    >"$work/leafproxy-$i.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  waitport "$p" || { tail -20 "$work/leafproxy-$i.log" >&2; exit 1; }
  name="leafproxy"
  [ "$i" = 1 ] || name="leafproxy $(basename "$bin")"
  measure "$name" "$p" "$pid" "" "$out"
  kill "$pid"
done

if [ "$PGBOUNCER" != 0 ]; then
  q=$(freeport)
  cat >"$work/pgbouncer.ini" <<INI
[databases]
$db = host=$host port=$port dbname=$db
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $q
auth_type = trust
auth_file = $work/users.txt
pool_mode = $POOL_MODE
default_pool_size = $POOL
max_db_connections = $POOL
max_client_conn = $((CLIENTS + 50))
logfile = $work/pgbouncer.log
INI
  echo "\"$user\" \"\"" >"$work/users.txt"
  as="" asUser=()
  if [ "$(id -u)" = 0 ]; then
    as=postgres asUser=(runuser -u postgres --) # PgBouncer refuses to run as root
    chown postgres "$work" "$work/pgbouncer.ini" "$work/users.txt"
  fi
  out="$work/pgbouncer.callgrind"
  runner "$out"
  "${asUser[@]}" "${runner[@]}" \
    pgbouncer "$work/pgbouncer.ini" >"$work/pgbouncer.out" 2>&1 &
  pids+=("$!")
  waitport "$q" || { tail -20 "$work/pgbouncer.out" >&2; exit 1; }
  pid=$(pgrep -f "pgbouncer $work/pgbouncer.ini" | while read -r c; do
    [ "$(cat /proc/"$c"/comm 2>/dev/null)" = runuser ] || echo "$c"
  done | head -1)
  pids+=("$pid")
  measure "pgbouncer" "$q" "$pid" "$as" "$out"
fi
