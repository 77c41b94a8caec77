"""Counts what happened: `python -m payments.check COUNT [--prefix P]` prints, for payments
P-0000 … P-(COUNT-1), how many were captured once, never (lost) or more than once (duplicated), and
exits 1 unless every one was captured exactly once."""
from __future__ import annotations

import argparse
import sys

from . import db


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m payments.check", description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int)
    parser.add_argument("--prefix", default="pay")
    args = parser.parse_args(argv)
    wanted = {f"{args.prefix}-{i:04d}" for i in range(args.count)}
    with db.connect() as conn:
        rows = conn.execute("SELECT payment_id, count(*) FROM payments_captures WHERE payment_id LIKE %s "
                            "GROUP BY payment_id", (f"{args.prefix}-%",)).fetchall()
    captured = {payment: n for payment, n in rows if payment in wanted}
    lost = sorted(wanted - set(captured))
    duplicated = {payment: n for payment, n in captured.items() if n > 1}
    print(f"captured once {sum(1 for n in captured.values() if n == 1)}/{len(wanted)}, "
          f"lost {len(lost)}, duplicated {len(duplicated)}")
    if lost:
        print("lost: " + " ".join(lost[:20]) + (" …" if len(lost) > 20 else ""))
    if duplicated:
        print("duplicated: " + " ".join(f"{p}×{n}" for p, n in sorted(duplicated.items())[:20]))
    return 0 if not lost and not duplicated else 1


if __name__ == "__main__":
    sys.exit(main())
