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


def main(argv: list[str] | None = None) -> int:
    parser = options.Parser(prog="taskherd recover", description=__doc__.split("\n\n")[0])
    options.add_broker(parser)
    options.add_keyprefix(parser)
    parser.add_argument("--watch", type=options.seconds("--watch"), metavar="SECONDS",
                        help="repeat every SECONDS instead of once")
    args = parser.parse_args(argv)
    # redis-py's Redis.from_url: not kombu's sentinel:// or redis+socket://, one URL
    broker_url = options.broker(parser, args, schemes=contract.REDIS_PY_SCHEMES, failover=())
    import redis

    from taskherd.worker.components.recovery import restore_dead_workers

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    client = redis.Redis.from_url(broker_url, socket_timeout=10)
    while True:
        try:
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
