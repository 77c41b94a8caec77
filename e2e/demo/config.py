"""What the demo creates (names) and what its scenario does (the full and the short plan)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "taskherd"
SHOP = REPO_ROOT / "examples" / "shop"
SHOP_VALUES = SHOP / "values.yaml"
RUNS = REPO_ROOT / "runs"

NAMESPACE = "taskherd-demo"
RELEASE = "shop"
POOL = "shop"  #: the pool's name in examples/shop/values.yaml
QUEUE = "shop"
DEAD_LETTER_QUEUE = "shop.dlq"
DATABASE = "taskherd_demo"
VHOST = "taskherd-demo"
BROKERS = ("redis", "rabbitmq")
DEFAULT_BROKER = "rabbitmq"


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One scenario: how much work, how many faults, how long to wait for each phase."""

    name: str
    charges: int  #: valid charges in the burst
    kills: int  #: worker pods force-deleted mid-task
    seconds_between_kills: float = 8.0
    memory_hog: bool = True  #: a report that outgrows its pod's memory limit (OOM kill)
    hog_megabytes: int = 1024
    poison: bool = True  #: an invalid charge: permanent failure, DLQ, page
    trickle_seconds: float = 16.0  #: charges sent one by one while the pool scales down
    trickle_interval: float = 2.0
    drain_timeout: float = 240.0  #: the burst must be settled by then
    scale_down_timeout: float = 150.0  #: back at minReplicas by then, after the trickle
    alert_timeout: float = 90.0  #: from the first dead letter to the page in Alertmanager


FULL = Plan(name="full", charges=240, kills=3)
SHORT = Plan(name="short", charges=60, kills=1, trickle_seconds=8.0, drain_timeout=180.0)


def state_dir() -> Path:
    """Where the demo keeps what it must find again (the key of the last image build): outside the checkout."""
    home = Path(os.environ.get("TASKHERD_HOME") or Path.home() / ".cache" / "taskherd")
    path = home / "demo"
    path.mkdir(parents=True, exist_ok=True)
    return path
