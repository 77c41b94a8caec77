"""A process that delivers one idempotency key, for the duplicate and lease-takeover tests.

    python -m apps.effects_duplicates redis|postgres URL KEY NAME SYNC_DIR [--hold S] [--lease S] [--wait S]

Writes SYNC_DIR/ready-NAME, waits for SYNC_DIR/go, then runs the guard. The effect appends NAME to
a ledger (Redis list `ledger:KEY`, or table `ledger`) and sleeps `--hold` seconds while still
holding the key, so that duplicates really overlap it. Prints one JSON line: what it saw.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from taskherd.worker.idempotency import InProgress, PostgresStore, RedisStore


def wait_for_go(sync_dir: str, name: str) -> None:
    open(os.path.join(sync_dir, f"ready-{name}"), "w").close()
    go = os.path.join(sync_dir, "go")
    while not os.path.exists(go):
        time.sleep(0.001)


def run_redis(args) -> dict:
    import redis

    client = redis.Redis.from_url(args.url)
    store = RedisStore(client=client, lease_seconds=args.lease)
    wait_for_go(args.sync_dir, args.name)
    try:
        with store.guard(args.key, wait_seconds=args.wait) as claim:
            if claim.done:
                return {"name": args.name, "ran": False, "result": claim.result}
            client.rpush(f"ledger:{args.key}", args.name)
            print(json.dumps({"name": args.name, "event": "effect"}), flush=True)
            time.sleep(args.hold)
            claim.set_result(args.name)
            return {"name": args.name, "ran": True, "result": args.name}
    except InProgress as exc:
        return {"name": args.name, "ran": False, "in_progress": True, "retry_after": exc.retry_after}


def run_postgres(args) -> dict:
    import psycopg

    store = PostgresStore()
    with psycopg.connect(args.url, autocommit=True) as conn:
        wait_for_go(args.sync_dir, args.name)
        with store.guard(args.key, conn=conn) as claim:
            if claim.done:
                return {"name": args.name, "ran": False, "result": claim.result}
            conn.execute("INSERT INTO ledger (key, who) VALUES (%s, %s)", (args.key, args.name))
            print(json.dumps({"name": args.name, "event": "effect"}), flush=True)
            time.sleep(args.hold)
            claim.set_result(args.name)
            return {"name": args.name, "ran": True, "result": args.name}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store", choices=["redis", "postgres"])
    parser.add_argument("url")
    parser.add_argument("key")
    parser.add_argument("name")
    parser.add_argument("sync_dir")
    parser.add_argument("--hold", type=float, default=0.3)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--wait", type=float, default=0.0)
    args = parser.parse_args()
    outcome = run_redis(args) if args.store == "redis" else run_postgres(args)
    print(json.dumps(outcome), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
