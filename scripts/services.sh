#!/usr/bin/env bash
# System packages and services the test suite needs beyond Python: Debian's chromium (the HTML
# report is opened and screenshotted headless) and a PostgreSQL server (two workers share one
# study through it). Idempotent; needs root for apt-get (CI and these machines run as root).
# Prints `export AUTOTUNE_TEST_POSTGRES=...` for the caller to eval.
set -euo pipefail

need=()
command -v chromium >/dev/null || need+=(chromium)
[ -d /usr/share/fonts/truetype/liberation ] || need+=(fonts-liberation)  # text in the screenshots
command -v pg_ctlcluster >/dev/null || need+=(postgresql)
if ((${#need[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "services.sh: not root, cannot install ${need[*]}; the tests that need them will skip" >&2
    exit 0
  fi
  echo "services.sh: installing ${need[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# PostgreSQL: start the distribution's cluster (created by the package) and a role + database.
ver=$(pg_lsclusters -h | awk 'NR==1 {print $1}')
if [ -z "$ver" ]; then
  ver=$(ls /usr/lib/postgresql | sort -n | tail -1)
  pg_createcluster "$ver" main >&2
fi
pg_ctlcluster "$ver" main start >/dev/null 2>&1 || true  # already running is fine
for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 && break; sleep 1; done
psql_() { su postgres -c "psql -v ON_ERROR_STOP=1 -qtAc \"$1\""; }
[ "$(psql_ "SELECT 1 FROM pg_roles WHERE rolname='autotune'")" = 1 ] ||
  psql_ "CREATE ROLE autotune LOGIN PASSWORD 'autotune'" >&2
[ "$(psql_ "SELECT 1 FROM pg_database WHERE datname='autotune_test'")" = 1 ] ||
  psql_ "CREATE DATABASE autotune_test OWNER autotune" >&2
echo "export AUTOTUNE_TEST_POSTGRES=postgresql+psycopg2://autotune:autotune@127.0.0.1:5432/autotune_test"
