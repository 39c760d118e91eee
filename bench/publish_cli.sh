#!/usr/bin/env bash
# Publishes benchmark triggers the way a user does: `qlsched project set` and `qlsched task
# publish` with the CLI, then one transaction per trigger exactly as `qlsched trigger publish`
# writes it (bench/publish_trigger.sql: the statements of src/store/manage.rs publish_trigger,
# and with PER_TASK=1 first those of publish_task), P at a time, each on a new connection
# (pgbench -C), trigger ids in order from a sequence. That is what `seq | xargs -P4 qlsched
# trigger publish` writes, without spawning 10,000 processes (bench/herd_ab.sh --verify compares
# the rows of both paths).
#   usage: bench/publish_cli.sh QL BINDIR PORT DB PREFIX N K M PER_TASK P [ID_PREFIX] [GRACE_MS]
#   QL: the qlsched binary; BINDIR: PostgreSQL's bin directory (pgbench); DB/PREFIX: the
#   database and its role prefix (the CLI publishes as PREFIX_admin); cron `0 K-59/M * * * *`
#   (M = 1: `0 * * * * *`, every minute).
set -euo pipefail
QL=$1 BINDIR=$2 PORT=$3 DB=$4 PREFIX=$5 N=$6 K=$7 M=$8 PER_TASK=$9 P=${10} PFX=${11:-b} GRACE=${12:-60000}
root="$(cd "$(dirname "$0")/.." && pwd)"
ADMIN="host=127.0.0.1 port=$PORT user=${PREFIX}_admin dbname=$DB"
"$QL" project set --dsn "$ADMIN" --id bench --status active >/dev/null
"$QL" task publish --dsn "$ADMIN" --project bench --id bench-task --spec '{"image":"bench/noop:1","args":[]}' >/dev/null
"$BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d "$DB" \
  -c "CREATE SEQUENCE IF NOT EXISTS public.bench_publish_seq" >/dev/null
bench() { # clients transactions-per-client
  [ "$2" -gt 0 ] || return 0
  "$BINDIR/pgbench" -n -C -c "$1" -j "$1" -t "$2" -D pfx="$PFX" -D per_task="$PER_TASK" -D k="$K" -D m="$M" \
      -D grace="$GRACE" -h 127.0.0.1 -p "$PORT" -U postgres -f "$root/bench/publish_trigger.sql" "$DB" >/tmp/publish_cli.$$.out 2>&1 \
    || { cat /tmp/publish_cli.$$.out >&2; rm -f /tmp/publish_cli.$$.out; exit 1; }
  grep -q 'number of failed transactions: 0' /tmp/publish_cli.$$.out || { cat /tmp/publish_cli.$$.out >&2; exit 1; }
  rm -f /tmp/publish_cli.$$.out
}
bench "$P" $(( N / P ))
bench 1 $(( N % P ))
