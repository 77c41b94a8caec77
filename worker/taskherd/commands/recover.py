"""`taskherd recover`: restore the unacknowledged messages of dead taskherd workers (Redis).

What every live worker's FastRecovery component does on its own, as a standalone pass — for a
pool scaled to zero, or run as a CronJob beside workers that do not install the component.
"""
from __future__ import annotations

import json
import logging
import sys
import time

from taskherd import contract

from . import options


#: redis-py's Redis.from_url: not kombu's sentinel:// or redis+socket://, one URL
SCHEMES = contract.REDIS_PY_SCHEMES
#: why recover refuses a RabbitMQ URL
NOT_FOR = {"amqp": "RabbitMQ redelivers a dead worker's unacknowledged messages by itself when its connection "
                   "closes: there is nothing to recover there"}


#: --watch looks for workers registered under another prefix at most this often: with none under
#: its own, the look is a SCAN of the whole keyspace, and a large idle Redis would pay it every pass
PREFIX_RECHECK_SECONDS = 300.0


def registry_prefixes(client) -> set[str]:
    """The global key prefixes ("" for none) under which taskherd workers are registered for fast
    recovery on this Redis (kombu's ``global_keyprefix`` applies to the registry too), in one scan."""
    from taskherd.worker.components.recovery import WORKERS_KEY

    found = set()
    for key in client.scan_iter(match="*" + WORKERS_KEY, count=1000):
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        if name.endswith(WORKERS_KEY):
            found.add(name[:-len(WORKERS_KEY)])
    return found


def prefix_mismatch(client, prefix: str) -> str | None:
    """Why a pass with ``prefix`` finds none of the workers registered on this Redis, or None: no
    worker is registered with it, and some are under another prefix (a --global-keyprefix left out or
    mistyped). A silent ``{"restored": {}}`` would say there was nothing to restore."""
    from taskherd.worker.components.recovery import WORKERS_KEY, Keys

    if client.exists(Keys(prefix)(WORKERS_KEY)):
        return None
    elsewhere = registry_prefixes(client) - {prefix}
    if not elsewhere:
        return None
    given = f"--global-keyprefix={prefix!r}" if prefix else "no --global-keyprefix"
    found = ", ".join(f"--global-keyprefix={other!r}" if other else "no --global-keyprefix"
                      for other in sorted(elsewhere))
    return (f"no taskherd worker is registered on this Redis with {given}; workers are registered with "
            f"{found} (the app's global_keyprefix transport option): nothing of theirs is restored without it")


def main(argv: list[str] | None = None) -> int:
    parser = options.Parser(prog="taskherd recover", description=__doc__.split("\n\n")[0])
    options.add_broker(parser, SCHEMES, note="Redis only: RabbitMQ redelivers by itself")
    options.add_keyprefix(parser)
    parser.add_argument("--watch", type=options.seconds("--watch"), metavar="SECONDS",
                        help="repeat every SECONDS instead of once")
    args = parser.parse_args(argv)
    broker_url = options.broker(parser, args, schemes=SCHEMES, failover=(), not_for=NOT_FOR)
    import redis

    from taskherd.worker.components.recovery import restore_dead_workers

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    client = redis.Redis.from_url(broker_url, socket_timeout=10)
    warned, checked_at = None, None
    while True:
        try:
            if checked_at is None or time.monotonic() - checked_at >= PREFIX_RECHECK_SECONDS:
                mismatch = prefix_mismatch(client, args.global_keyprefix)
                checked_at = time.monotonic()
                if mismatch and mismatch != warned:  # --watch: said again only when it changes
                    print(f"taskherd recover: warning: {mismatch}", file=sys.stderr, flush=True)
                warned = mismatch
            restored = restore_dead_workers(client, prefix=args.global_keyprefix)
        except redis.RedisError as exc:
            # Once: the broker's own error in one line. --watch: a CronJob-like loop rides out an outage.
            print(f"taskherd recover: cannot use the broker at {contract.redact(broker_url)}: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            if not args.watch:
                return 1
            time.sleep(args.watch)
            continue
        print(json.dumps({"restored": restored, "at": time.time()}), flush=True)
        if not args.watch:
            return 0
        time.sleep(args.watch)
