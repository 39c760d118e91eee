#!/usr/bin/env python3
"""A short dispatcher in Python (psycopg 3) speaking the dispatcher protocol
(docs/dispatcher.md): the qlsched.dispatch_* functions only.

    python3 examples/dispatcher.py --dsn 'host=db user=qlsched_dispatcher dbname=qlsched' \
        [--command 'my-runner "$QLSCHED_RUN_ID"'] [--batch 10] [--lease-ms 30000]

Each loop: expire lapsed attempts, take a batch under leases, start each run, run the
command (sh -c, the run's idempotency key in QLSCHED_IDEMPOTENCY_KEY) while a thread
heartbeats the lease, finish it with the exit status. SIGTERM/SIGINT stop it before the
next take; runs taken and not yet started are released.
"""

import argparse
import os
import signal
import subprocess
import threading

import psycopg

stop = threading.Event()


def heartbeat(conninfo, attempt, token, lease_ms, done):
    """Extends the lease every third of it until the work is done."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while not done.wait(lease_ms / 3000):
            held, cancel = conn.execute(
                "SELECT lease_expires_at_ms, cancel_requested"
                "  FROM qlsched.dispatch_heartbeat(%s, %s, %s)",
                (attempt, token, lease_ms),
            ).fetchone()
            if held is None:
                print(f"dispatcher.py: attempt {attempt} lost its lease", flush=True)
            elif cancel:
                print(f"dispatcher.py: attempt {attempt}: a cancel was requested", flush=True)


def run_one(conn, args, run):
    run_id, attempt, token, trigger_id, scheduled_for_ms, key, spec = run
    started = conn.execute(
        "SELECT qlsched.dispatch_start(%s, %s, %s)", (attempt, token, args.lease_ms)
    ).fetchone()[0]
    if not started:
        return
    done = threading.Event()
    beat = threading.Thread(
        target=heartbeat, args=(args.dsn, attempt, token, args.lease_ms, done), daemon=True
    )
    beat.start()
    env = dict(os.environ, QLSCHED_RUN_ID=str(run_id), QLSCHED_TRIGGER_ID=trigger_id,
               QLSCHED_SCHEDULED_FOR_MS=str(scheduled_for_ms),
               QLSCHED_IDEMPOTENCY_KEY=key, QLSCHED_SPEC=spec or "")
    proc = subprocess.run(["sh", "-c", args.command], env=env, capture_output=True)
    done.set()
    beat.join()
    tail = (proc.stdout + proc.stderr).decode(errors="replace")[-2048:]
    outcome = "succeeded" if proc.returncode == 0 else "failed"
    error = None if proc.returncode == 0 else f"exit status {proc.returncode}"
    recorded = conn.execute(
        "SELECT qlsched.dispatch_finish(%s, %s, %s, %s, %s, %s, NULL)",
        (attempt, token, outcome, proc.returncode, tail, error),
    ).fetchone()[0]
    if not recorded:
        print(f"dispatcher.py: run {run_id} lost its lease: outcome not recorded", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", default=os.environ.get("QLSCHED_DISPATCHER_DSN"), required=False)
    p.add_argument("--command", default="true")
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--lease-ms", type=int, default=30000)
    p.add_argument("--idle-ms", type=int, default=200)
    p.add_argument("--worker-id", default=f"dispatcher-py-{os.getpid()}")
    args = p.parse_args()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        print("dispatcher.py: started", flush=True)
        while not stop.is_set():
            conn.execute("SELECT lost, retried FROM qlsched.dispatch_expire(1000)")
            batch = conn.execute(
                "SELECT run_id, attempt_id, lease_token, trigger_id, scheduled_for_ms,"
                "       idempotency_key, spec"
                "  FROM qlsched.dispatch_take(%s, NULL, %s, %s)",
                (args.worker_id, args.batch, args.lease_ms),
            ).fetchall()
            if not batch:
                stop.wait(args.idle_ms / 1000)
                continue
            for run in batch:
                if stop.is_set():
                    conn.execute("SELECT qlsched.dispatch_release(%s, %s)", (run[1], run[2]))
                else:
                    run_one(conn, args, run)
    print("dispatcher.py: stopped", flush=True)


if __name__ == "__main__":
    main()
