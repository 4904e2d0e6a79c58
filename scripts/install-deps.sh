#!/usr/bin/env bash
# Installs what the tests and benchmarks run against when it is missing: a PostgreSQL
# server, ZooKeeper (with a Java runtime), and with --bench PgBouncer, with --browser
# Chromium. Uses apt-get when it is there and we may use it; otherwise says what is missing.
set -euo pipefail

want=()
have_pg() {
  command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ] && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}
have_pg || want+=(postgresql postgresql-contrib)
command -v psql >/dev/null 2>&1 || want+=(postgresql-client)
command -v pgbench >/dev/null 2>&1 || want+=(postgresql-contrib)
{ [ -f /usr/share/java/zookeeper.jar ] || [ -n "${LEAF_TEST_ZK_CLASSPATH:-}" ]; } || want+=(zookeeper)
command -v java >/dev/null 2>&1 || want+=(default-jre-headless)
# promtool checks the alert rules; the e2e test runs a Prometheus server.
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || want+=(prometheus)
for arg in "$@"; do
  case "$arg" in
    --bench) command -v pgbouncer >/dev/null 2>&1 || want+=(pgbouncer) ;;
    --browser) command -v chromium >/dev/null 2>&1 || want+=(chromium) ;;
  esac
done

[ ${#want[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: missing ${want[*]} and there is no apt-get: install them by hand" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${want[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
