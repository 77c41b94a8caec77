"""Sends work, as the payments web service would: `python -m payments.send KIND COUNT [--prefix P]`.

    captures N   N captures (payment ids P-0000 …), 100 to 999 cents each
    refunds N    N refunds of payments that were never captured (each ends in the DLQ)
    batch MB     one settlement batch that builds MB megabytes in memory
"""
from __future__ import annotations

import argparse

from .tasks import capture, refund, settle_batch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m payments.send", description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["captures", "refunds", "batch"])
    parser.add_argument("count", type=int, help="how many (megabytes for batch)")
    parser.add_argument("--prefix", default="pay", help="payment id prefix (default: pay)")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"count={args.count}: must be at least 1")
    if args.kind == "captures":
        for i in range(args.count):
            capture.delay(f"{args.prefix}-{i:04d}", 100 + (i * 37) % 900)
    elif args.kind == "refunds":
        for i in range(args.count):
            refund.delay(f"{args.prefix}-never-captured-{i:04d}")
    else:
        settle_batch.delay(args.count)
    print(f"sent {args.count if args.kind != 'batch' else 1} {args.kind}")


if __name__ == "__main__":
    main()
