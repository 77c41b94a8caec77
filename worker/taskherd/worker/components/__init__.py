"""The parts ``configure(app)`` installs in a Celery app, composed the way dramatiq composes middleware.

Each component is one concern in one module, a frozen dataclass with keyword-only settings whose
defaults are documented where they are defined, and ``from_env()``: the pod's environment (the
chart's contract, taskherd.contract) overrides what the code says, as a command-line flag overrides
a config file, so the pod's grace period, ports and probes agree with the worker.

    from taskherd.worker import configure
    from taskherd.worker.components import Metrics, default_components, without

    configure(app, components=[*without(default_components(), Metrics), Metrics(port=9100)])

:func:`default_components` is the list ``configure()`` uses when given none. The task class and the
bad-message consumer carry the at-least-once promise: leave them out only for an app that does not
run workers (a producer), or replace them with subclasses.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Iterable, Mapping

from taskherd import contract

#: Attribute of a Celery app: {component class name: the installed component}.
INSTALLED_ATTRIBUTE = "taskherd_components"


#: The longest duration a seconds setting takes, unless it says otherwise: a week, the bound the
#: contract puts on the same settings' TASKHERD_* variables and the commands on their options, so a
#: keyword argument and its variable accept the same range. Unbounded, a duration breaks where it is
#: used: threading.Event.wait(1e10) raises OverflowError in FastRecovery's lease thread, a retry's
#: countdown past timedelta's range fails the retry, and a heartbeat every 1e300 s means liveness
#: never fails.
MAX_SECONDS = contract.MAX_SECONDS


def is_seconds(value: Any) -> bool:
    """A duration setting: an int or float, finite. ``'5'`` would raise TypeError in a comparison, nan
    and inf (or 1e309) are no duration, and bool is an int in Python but ``interval=True`` is a mistake.
    An int is finite as it is, never converted: math.isfinite(10**400) raises OverflowError ("int too
    large to convert to float") where a refusal was due. (The upper bound is :func:`too_long`'s.)"""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def too_long(label: str, value: Any, *, minimum: str = "0 <", maximum: int = MAX_SECONDS,
             said: str = "a week") -> list[str]:
    """The problem of a duration ``label`` (``Heartbeat(interval``, as the user wrote it) longer than
    ``maximum``, checked after :func:`is_seconds` (so ``value`` is a number); [] when it fits."""
    if value <= maximum:
        return []
    name = label.rpartition("(")[2] or label
    return [f"{label}={contract.shown(value)}{')' if '(' in label else ''} is longer than {maximum} seconds ({said}) "
            f"(valid: {minimum} {name} <= {maximum})"]


def is_whole(value: Any) -> bool:
    """A count or a port: an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Component:
    """Base class: override :meth:`install`, and :attr:`environment` for settings the chart passes."""

    #: contract variable -> the field it sets (read by :meth:`with_environment`)
    environment: ClassVar[Mapping[str, str]] = {}
    #: components this one needs installed before it (their classes)
    requires: ClassVar[tuple[type, ...]] = ()

    def install(self, app: Any, profile: Any) -> None:
        raise NotImplementedError

    def problems(self) -> list[str]:
        """Every invalid setting, each naming the field, its value and the valid range."""
        return []

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Component":
        """The component with its defaults, overridden by the pod's environment."""
        return cls().with_environment(environ)

    def with_environment(self, environ: Mapping[str, str] | None = None) -> "Component":
        """This component with every contract variable that is set applied; raises
        :class:`taskherd.contract.ContractError` naming each invalid one."""
        values, problems = contract.read(self.environment, environ)
        if problems:
            raise contract.ContractError(problems)
        changes = {field: values[name] for name, field in self.environment.items() if contract.is_set(name, environ)}
        return dataclasses.replace(self, **changes) if changes else self


@dataclasses.dataclass(frozen=True, kw_only=True)
class AtWorkerStart(Component):
    """A component that changes the worker's process once, as the worker starts: its
    :meth:`at_worker_start` runs on Celery's ``worker_init``, in the main process before the pool
    forks (the children inherit the change). Used to swap a library's per-task code for taskherd's
    equivalent, which a producer importing the same app should not get."""

    def install(self, app: Any, profile: Any = None) -> None:
        from celery.signals import worker_init

        kind = type(self)
        worker_init.connect(kind.at_worker_start, weak=False, dispatch_uid=f"{kind.__module__}.{kind.__qualname__}")

    @staticmethod
    def at_worker_start(**_: Any) -> None:
        raise NotImplementedError


def installed(app: Any, kind: type[Component]) -> Component | None:
    """The component of class ``kind`` (or a subclass) installed in ``app``, if any."""
    for component in getattr(app, INSTALLED_ATTRIBUTE, {}).values():
        if isinstance(component, kind):
            return component
    return None


def mark_installed(app: Any, component: Component) -> bool:
    """Records ``component`` as installed; False when one of its class already was (configure()
    may run twice on one app: a module imported by both a producer and the worker)."""
    registry = getattr(app, INSTALLED_ATTRIBUTE, None)
    if registry is None:
        registry = {}
        setattr(app, INSTALLED_ATTRIBUTE, registry)
    name = type(component).__qualname__
    if name in registry:
        return False
    registry[name] = component
    return True


def install(app: Any, components: Iterable[Component], profile: Any = None) -> None:
    """Installs ``components`` in ``app`` (each class once). configure() calls it; an app that wants
    only some runtime parts without the reliability profile (a test harness) may call it directly."""
    for component in components:
        if mark_installed(app, component):
            component.install(app, profile)


def default_components() -> list[Component]:
    """The components configure() installs when given none, in order, with their defaults
    (configure() then applies the pod's environment to each, as to any component it is given)."""
    from .amqp_headers import AmqpHeaders
    from .bad_messages import BadMessages
    from .beat import BeatHeartbeat
    from .broker_check import BrokerCheck
    from .delayed import DelayedMessages
    from .drain import Drain
    from .gc_freeze import GcFreeze
    from .heartbeat import Heartbeat
    from .json_bodies import JsonBodies
    from .metrics import Metrics
    from .ping import Ping
    from .publish_stamps import PublishStamps
    from .recovery import FastRecovery
    from .request_context import RequestContext
    from .result_repr import ResultRepr
    from .task_class import TaskClass
    from .timer_heap import TimerHeap

    return [kind() for kind in (TaskClass, BadMessages, BrokerCheck, PublishStamps, Heartbeat, Drain,
                                 Metrics, FastRecovery, DelayedMessages, Ping, BeatHeartbeat, GcFreeze, TimerHeap,
                                 AmqpHeaders, RequestContext, ResultRepr, JsonBodies)]


def without(components: Iterable[Component], *kinds: type[Component]) -> list[Component]:
    """``components`` minus those of the given classes (to leave one out, or to replace it)."""
    return [component for component in components if not isinstance(component, kinds)]


def missing_requirements(components: Iterable[Component]) -> list[str]:
    """A problem for each component whose required components are not listed before it."""
    problems, seen = [], []
    for component in components:
        for needed in component.requires:
            if not any(isinstance(earlier, needed) for earlier in seen):
                problems.append(f"components: {type(component).__name__} needs {needed.__name__} before it in the list")
        seen.append(component)
    return problems
