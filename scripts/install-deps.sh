#!/usr/bin/env bash
# Installs what the tests run against when it is missing, on a Debian or Ubuntu machine
# that has Go: a C compiler (the SQL parser is C, built through cgo), a PostgreSQL server
# with its contrib modules, psql and pgbench, ZooKeeper with a Java runtime, Node.js with
# npm (the node-postgres client test), and Chromium (the status-page browser test).
# With --bench it adds PgBouncer, valgrind and strace (make bench-instructions and
# bench-syscalls). It uses apt-get when it is there; otherwise it says what is missing and
# fails. It is quiet when nothing is missing.
#
#   scripts/install-deps.sh            # everything `make test` needs
#   scripts/install-deps.sh --bench    # and what `make bench` compares against, and measures with
set -euo pipefail

want=()
need() { # need COMMAND PACKAGE…: want the packages when the command is not on PATH
  local cmd=$1
  shift
  command -v "$cmd" >/dev/null 2>&1 || want+=("$@")
}
have_pg_server() {
  command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ] && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}

need gcc gcc libc6-dev
have_pg_server || want+=(postgresql postgresql-contrib)
need psql postgresql-client
need pgbench postgresql-contrib
{ [ -f /usr/share/java/zookeeper.jar ] || [ -n "${LEAF_TEST_ZK_CLASSPATH:-}" ]; } || want+=(zookeeper)
need java default-jre-headless
need node nodejs
need npm npm
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
  command -v google-chrome >/dev/null 2>&1 || want+=(chromium)
# promtool checks the alert rules; an e2e test runs a Prometheus server.
need promtool prometheus
need prometheus prometheus
for arg in "$@"; do
  case "$arg" in
    --bench) need pgbouncer pgbouncer; need valgrind valgrind; need strace strace ;;
    --browser) ;; # Chromium is always installed now; the flag is kept for old callers
    *) echo "install-deps: unknown argument $arg (known: --bench)" >&2; exit 2 ;;
  esac
done

install() {
  # One package can be wanted for two commands (postgresql-contrib).
  mapfile -t want < <(printf '%s\n' "${want[@]}" | sort -u)
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: missing ${want[*]} and there is no apt-get: install them by hand" >&2
    exit 1
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-deps: installing ${want[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
}
[ ${#want[@]} -eq 0 ] || install

# Debian's npm package pulls Node.js in; an older Node than the client needs is as bad as none.
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$major" -lt 18 ]; then
  echo "install-deps: Node.js $(node --version 2>/dev/null || echo none) is older than 18, which the node-postgres test needs" >&2
  exit 1
fi
