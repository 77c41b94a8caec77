"""`taskherd recover`: restore the unacknowledged messages of dead taskherd workers (Redis).

What every live worker's FastRecovery component does on its own, as a standalone pass — for a
pool scaled to zero, or run as a CronJob beside workers that do not install the component.
"""
from __future__ import annotations

import argparse
import json
import logging
import time

from . import options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="taskherd recover", description=__doc__.split("\n\n")[0])
    options.add_broker(parser)
    options.add_keyprefix(parser)
    parser.add_argument("--watch", type=float, metavar="SECONDS", help="repeat every SECONDS instead of once")
    args = parser.parse_args(argv)
    broker_url = options.broker(parser, args, kinds=("redis",))
    if args.watch is not None and not args.watch > 0:
        parser.error(f"--watch={args.watch!r} must be a positive number of seconds")
    import redis

    from taskherd.worker.components.recovery import restore_dead_workers

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    client = redis.Redis.from_url(broker_url, socket_timeout=10)
    while True:
        restored = restore_dead_workers(client, prefix=args.global_keyprefix)
        print(json.dumps({"restored": restored, "at": time.time()}), flush=True)
        if not args.watch:
            return 0
        time.sleep(args.watch)
