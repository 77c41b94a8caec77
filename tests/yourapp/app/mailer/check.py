"""What happened to the welcome mails: `python3 -m mailer.check COUNT [--batch B] [--wait SECONDS]`
waits (at most SECONDS) until user-B-0000 … user-B-(COUNT-1) each have a mail, then prints how many
were sent once, never (lost) or more than once (duplicated), and by which pods; exit status 1
unless every one was sent exactly once."""
from __future__ import annotations

import argparse
import collections
import sys
import time

from tabulate import tabulate

from . import store
from .send import user_id


def counts(wanted: set[str]) -> tuple[dict[str, int], dict[str, int]]:
    """(mails per wanted user, mails per pod) as recorded so far."""
    with store.connect() as conn:
        rows = conn.execute("SELECT user_id, pod FROM mailer_sent").fetchall()
    per_user = collections.Counter(user for user, _ in rows if user in wanted)
    per_pod = collections.Counter(pod for user, pod in rows if user in wanted)
    return dict(per_user), dict(per_pod)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m mailer.check", description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int)
    parser.add_argument("--batch", default="signup")
    parser.add_argument("--wait", type=float, default=0, metavar="SECONDS")
    args = parser.parse_args(argv)
    wanted = {user_id(args.batch, i) for i in range(args.count)}
    deadline = time.monotonic() + args.wait
    while True:
        per_user, per_pod = counts(wanted)
        if len(per_user) == len(wanted) or time.monotonic() >= deadline:
            break
        time.sleep(2)
    lost = sorted(wanted - set(per_user))
    duplicated = {user: n for user, n in per_user.items() if n > 1}
    print(tabulate([(pod, n) for pod, n in sorted(per_pod.items())], headers=["pod", "mails"]))
    print(f"sent once {sum(1 for n in per_user.values() if n == 1)}/{len(wanted)}, "
          f"lost {len(lost)}, duplicated {len(duplicated)}")
    if lost:
        print("lost: " + " ".join(lost[:20]))
    if duplicated:
        print("duplicated: " + " ".join(f"{user}×{n}" for user, n in sorted(duplicated.items())[:20]))
    return 0 if not lost and not duplicated else 1


if __name__ == "__main__":
    sys.exit(main())
