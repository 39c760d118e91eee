#!/usr/bin/env bash
# Runs every test: unit, property and integration tests against a real PostgreSQL that the
# test harness starts itself (installing PostgreSQL first when it is missing and we are root),
# then the tests of the Debian package, man pages, completions and alert rules.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pg.sh
pg_ensure_installed
ensure_faketime
ensure_pgbouncer
export QLSCHED_PG_BINDIR="$(pg_find_bindir)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --features fault-injection --lib --tests "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The Debian package, man pages, completions and alert rules (scripts/test-package.sh).
scripts/test-package.sh 2>&1 | tee -a "$log"
package_status=${PIPESTATUS[0]}
set -e
[ "$package_status" -eq 0 ] || status=1
passed=$(grep -oE '^test result: .* ([0-9]+) passed' "$log" | grep -oE '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -oE '; ([0-9]+) failed' "$log" | grep -oE '[0-9]+' | awk '{s+=$1} END {print s+0}')
package_passed=$(sed -n 's/^package tests: \([0-9]*\) passed.*/\1/p' "$log" | tail -n1)
package_failed=$(sed -n 's/^package tests: .* \([0-9]*\) failed$/\1/p' "$log" | tail -n1)
passed=$((passed + ${package_passed:-0}))
failed=$((failed + ${package_failed:-0}))
echo
echo "Summary: $passed passed, $failed failed"
exit "$status"
