"""`python -m taskherd.operator`: run the WorkerPool operator (kopf) with taskherd's settings.

Equivalent to `kopf run -m taskherd.operator.handlers --standalone --namespace ...` with the
environment of config.py.
"""
from __future__ import annotations

import logging
import sys

from taskherd.commands.options import Parser

from .config import OperatorConfig


def parser(config: OperatorConfig) -> Parser:
    """The operator's command line (the chart's extraArgs check lists the same options)."""
    parser = Parser(prog="python -m taskherd.operator", description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--namespace", action="append", dest="namespaces",
                        help="namespace to watch (repeatable); default $TASKHERD_WATCH_NAMESPACES or $POD_NAMESPACE")
    parser.add_argument("--no-leader-election", action="store_true", help="single replica: no Lease")
    parser.add_argument("--lease-namespace", default=None)
    parser.add_argument("--metrics-port", type=int, default=None, help=f"0 disables (default {config.metrics_port})")
    parser.add_argument("--liveness", default=None, help=f"kopf liveness endpoint (default {config.liveness_endpoint})")
    parser.add_argument("--dry-run", action="store_true",
                        help="log every write as '**DRY-RUN**: would …' instead of making it (no Lease)")
    parser.add_argument("--verbose", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    config = OperatorConfig.from_env()
    args = parser(config).parse_args(argv)
    if args.namespaces:
        config.namespaces = args.namespaces
    if args.no_leader_election:
        config.leader_election = False
    if args.lease_namespace:
        config.lease_namespace = args.lease_namespace
    if args.metrics_port is not None:
        config.metrics_port = args.metrics_port
    if args.dry_run:
        config.dry_run = True
    if args.liveness is not None:
        config.liveness_endpoint = args.liveness or None
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if not args.verbose:  # kopf logs every watch event and every health probe at INFO
        for noisy in ("kopf.objects", "kopf.activities.probe", "aiohttp.access", "httpx"):
            logging.getLogger(noisy).setLevel(logging.WARNING)

    import kopf

    from . import handlers
    handlers.CONFIG = config
    kopf.run(standalone=True, namespaces=config.namespaces, clusterwide=False,
             liveness_endpoint=config.liveness_endpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
