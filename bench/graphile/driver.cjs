// graphile-worker side of `scripts/bench.sh stock-vs-tuned` (rows S, examples/bench/stock.rs).
//   node driver.cjs migrate CONNSTR            run graphile-worker's migrations once
//   node driver.cjs run CONNSTR N NAME         one worker process: a crontab of N every-minute
//                                              entries (one task identifier `noop`, each entry
//                                              its own ?id= and payload), a no-op task, the
//                                              default options otherwise
// graphile-worker is loaded from $QLSCHED_GRAPHILE_DIR/node_modules (npm install graphile-worker@0.18
// there). On stdout, one JSON line per event: {"ev":"ready"}, and for each boundary the cron
// fires {"ev":"schedule"|"scheduled","ts":<boundary ms>,"at":<Date.now()>,"n":<entries>} (the
// "scheduled" event is emitted after the statement that inserts the boundary's jobs returned),
// and every 5 s {"ev":"executed","n":<no-op jobs run so far>}.
"use strict";
const path = require("path");
const { EventEmitter } = require("events");
const dir = process.env.QLSCHED_GRAPHILE_DIR || "/var/tmp/qlsched-graphile";
const gw = require(path.join(dir, "node_modules", "graphile-worker"));
const [mode, connectionString, nStr, name] = process.argv.slice(2);
const out = (o) => process.stdout.write(JSON.stringify({ name, ...o }) + "\n");

async function main() {
  if (mode === "migrate") {
    await gw.runMigrations({ connectionString });
    return;
  }
  const n = Number(nStr);
  const lines = [];
  for (let i = 1; i <= n; i++) {
    const id = "e" + String(i).padStart(7, "0");
    lines.push(`* * * * * noop ?id=${id} {"i":${i}}`);
  }
  let executed = 0;
  const events = new EventEmitter();
  events.on("cron:schedule", (e) => out({ ev: "schedule", ts: e.timestamp, at: Date.now(), n: e.jobsAndIdentifiers.length }));
  events.on("cron:scheduled", (e) => out({ ev: "scheduled", ts: e.timestamp, at: Date.now(), n: e.jobsAndIdentifiers.length }));
  const runner = await gw.run({
    connectionString,
    crontab: lines.join("\n"),
    events,
    taskList: { noop: async () => { executed++; } },
  });
  out({ ev: "ready", at: Date.now() });
  const tick = setInterval(() => out({ ev: "executed", n: executed, at: Date.now() }), 5000);
  const stop = async () => { clearInterval(tick); out({ ev: "executed", n: executed, at: Date.now() }); await runner.stop(); process.exit(0); };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  await runner.promise;
}
main().catch((e) => { console.error(e); process.exit(1); });
