"""Sends work as the sign-up service would: `python3 -m mailer.send COUNT [--batch B]` queues welcome
mails for user-B-0000 … user-B-(COUNT-1); `--invalid` queues COUNT mails to user ids that do not
exist (each ends in the dead-letter queue after one attempt)."""
from __future__ import annotations

import argparse

from .tasks import send_welcome


def user_id(batch: str, number: int) -> str:
    return f"user-{batch}-{number:04d}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m mailer.send", description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int)
    parser.add_argument("--batch", default="signup", help="names the users (default: signup)")
    parser.add_argument("--invalid", action="store_true", help="user ids that do not exist")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"count={args.count}: must be at least 1")
    for i in range(args.count):
        send_welcome.delay(f"nobody-{i:04d}" if args.invalid else user_id(args.batch, i))
    print(f"queued {args.count} {'invalid ' if args.invalid else ''}welcome mail(s)")


if __name__ == "__main__":
    main()
