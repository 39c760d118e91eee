#!/usr/bin/env bash
# Runs every test: unit, property and integration tests against a real PostgreSQL that the
# test harness starts itself (installing PostgreSQL first when it is missing and we are root).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pg.sh
pg_ensure_installed
export QLSCHED_PG_BINDIR="$(pg_find_bindir)"
exec cargo test --features fault-injection "$@"
