"""The contract between the Helm chart and the programs it runs: one definition of each shared fact.

- **Environment variables**: every ``TASKHERD_*`` variable the chart sets (or a user may set), with
  its parser, unit, valid range, default and the program that reads it (:data:`VARIABLES`).
  Programs read them only through :func:`read`; ``tests/chart`` renders the chart and checks that
  the variables it sets are exactly the ones declared here for each container, and that every
  rendered value parses; the table in docs/chart.md is generated from :data:`VARIABLES`.
- **Dead-letter queue naming** (:func:`dead_letter_queues`), **ports** and the **broker kind** of a
  URL (:func:`broker_kind`).

Import-light on purpose (standard library only, no dataclasses or typing): `taskherd probe` runs in
every pod every few seconds and reads its settings here.
"""
import os

# -- ports -----------------------------------------------------------------------------------------
# The Prometheus exporter range (9100-9999) is fully allocated; these avoid the defaults of what
# shares a Celery deployment: celery-exporter (9808), Flower (5555), node-exporter (9100),
# statsd-exporter (9102), kube-state-metrics (8080/8081 in its own pod).
#: the worker's /metrics (and its HTTP probe endpoints)
WORKER_METRICS_PORT = 9891
#: `taskherd exporter`'s /metrics
EXPORTER_PORT = 9892
#: the operator's /metrics
OPERATOR_METRICS_PORT = 9893
#: the operator's liveness endpoint (kopf's /healthz)
OPERATOR_HEALTH_PORT = 9894

# -- brokers ---------------------------------------------------------------------------------------
#: URL schemes kombu maps to its Redis transport (``redis+socket://`` is a Unix socket).
REDIS_SCHEMES = ("redis", "rediss", "redis+socket", "sentinel")
#: URL schemes kombu maps to an AMQP transport.
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp", "librabbitmq")
#: Of the Redis ones, those redis-py's Redis.from_url opens itself (kombu's sentinel:// and
#: redis+socket:// it refuses with a ValueError): all that the operator, the exporter and the
#: commands reading Redis without Celery can use.
REDIS_PY_SCHEMES = ("redis", "rediss")
#: Of the AMQP ones, those kombu opens with py-amqp (librabbitmq is no dependency of taskherd).
PY_AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")


def failover_urls(url):
    """The URLs of a ';'-joined failover list, as kombu reads it (a tuple of one most often)."""
    return tuple(one.strip() for one in (url or "").split(";"))


def broker_kind(url):
    """'redis', 'amqp' or 'other', from a broker URL (its first URL when several are ``;``-joined)."""
    first = (url or "").split(";")[0].strip()
    scheme = first.partition("://")[0].lower() if "://" in first else ""
    if scheme in REDIS_SCHEMES:
        return "redis"
    if scheme in AMQP_SCHEMES:
        return "amqp"
    return "other"


# -- dead-letter queues ----------------------------------------------------------------------------
#: The DLQ of work queue ``q`` when nothing else is said: ``q.dlq``.
DEFAULT_DEAD_LETTER_PATTERN = "{queue}.dlq"


class ContractError(ValueError):
    """Settings that break the contract. ``problems`` lists every one, each naming the setting."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def dead_letter_queues(queues, explicit=None, pattern=DEFAULT_DEAD_LETTER_PATTERN, *, source="dead_letter_queues"):
    """{work queue: its DLQ}. ``explicit`` names one DLQ per queue, in the same order; empty means
    ``pattern`` (which must contain ``{queue}``). Raises :class:`ContractError` naming ``source``
    when the lengths differ, a DLQ is also a work queue, or two queues share a DLQ."""
    queues = list(queues)
    problems = []
    if explicit:
        explicit = list(explicit)
        if len(explicit) != len(queues):
            raise ContractError([f"{source}={','.join(explicit)!r} names {len(explicit)} dead-letter queue(s) for "
                                 f"{len(queues)} queue(s) {','.join(queues)!r}: give one per queue, in the same "
                                 f"order, or none for '{pattern}'"])
        mapping = dict(zip(queues, explicit))
    else:
        if "{queue}" not in pattern:
            raise ContractError([f"{source}={pattern!r} must contain '{{queue}}' (e.g. "
                                 f"'{DEFAULT_DEAD_LETTER_PATTERN}') so that each work queue gets its own DLQ"])
        try:
            mapping = {queue: pattern.format(queue=queue) for queue in queues}
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            # '{queue}.{dlq}', '{queue}{0}', '{queue!x}': str.format's own error would be a traceback
            raise ContractError([f"{source}={pattern!r} is not a valid pattern ({type(exc).__name__}: {exc}); "
                                 f"valid: text with '{{queue}}' where the queue name goes and no other placeholder, "
                                 f"literal braces doubled ('{{{{', '}}}}')"]) from None
    for queue, dlq in mapping.items():
        if not dlq:
            problems.append(f"{source}: the dead-letter queue of {queue!r} is empty")
        elif dlq in mapping:
            problems.append(f"{source}: {dlq!r} is a work queue and the dead-letter queue of {queue!r}: a DLQ "
                            f"must not be consumed as work (valid: a name that is not one of {','.join(queues)!r})")
    seen = {}
    for queue, dlq in mapping.items():
        if dlq in seen:
            problems.append(f"{source}: {seen[dlq]!r} and {queue!r} share the dead-letter queue {dlq!r}")
        seen[dlq] = queue
    if problems:
        raise ContractError(problems)
    return mapping


# -- parsers: each takes the raw text and returns the value or raises ValueError ---------------------
#: The longest duration a seconds variable takes (a week), as the commands' options
#: (taskherd.commands.options.MAX_SECONDS) and the components' keyword arguments: larger values are
#: typos (a unit slip: 1e300 made liveness never fail) and threading's waits overflow on them
#: (Event.wait(1e10): OverflowError in FastRecovery's lease thread).
MAX_SECONDS = 7 * 24 * 3600
#: The variables the chart derives past a week: the Redis visibility timeout (values.schema.json:
#: broker.visibilityTimeoutSeconds <= 30 days), RabbitMQ's consumer_timeout (above the hard time
#: limit, itself up to a week) and the drain deadline (hard limit + drain margin, within
#: terminationGracePeriodSeconds <= two weeks).
MAX_TIMEOUT_SECONDS = 30 * 24 * 3600
MAX_DRAIN_SECONDS = 14 * 24 * 3600


def seconds_valid(maximum=MAX_SECONDS):
    """The valid range of a seconds variable in words, for its Variable.valid and the commands' flags."""
    days = maximum / 86400
    said = {7: "a week", 14: "two weeks"}.get(days, f"{days:g} days")
    return f"a number of seconds > 0 and <= {maximum} ({said})"


def seconds(raw, maximum=MAX_SECONDS):
    value = float(raw)
    if not 0 < value <= maximum:  # nan compares false: refused too
        raise ValueError
    return value


def timeout_seconds(raw):
    return seconds(raw, MAX_TIMEOUT_SECONDS)


def drain_seconds(raw):
    return seconds(raw, MAX_DRAIN_SECONDS)


def seconds_or_zero(raw):
    value = float(raw)
    if not 0 <= value <= MAX_SECONDS:
        raise ValueError
    return value


def count_or_off(raw):
    """A whole number >= 0, where 0 means 'no limit' (None)."""
    value = int(raw)
    if value < 0:
        raise ValueError
    return value or None


def port(raw):
    value = int(raw)
    if not 0 <= value <= 65535:
        raise ValueError
    return value


def port_not_zero(raw):
    """A port something must connect to or listen on: 0 ("off", "any") is not one."""
    value = port(raw)
    if value == 0:
        raise ValueError
    return value


def names(raw):
    values = tuple(name.strip() for name in raw.split(","))
    if not values or any(not name for name in values):
        raise ValueError
    return values


def text(raw):
    return raw


def flag(raw):
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError


def broker_type(raw):
    if raw not in ("redis", "rabbitmq"):
        raise ValueError
    return raw


def redact(text):
    """``text`` with the password of every URL in it replaced by ``***`` (``amqp://shop:***@rabbit/shop``):
    errors, logs, a WorkerPool's status and Events must not print credentials. The user name stays
    (it tells which account was refused); a user-info without ':' is hidden whole, as it may be a token
    (``redis://***@cache``). The one redaction of a URL, for the worker, the commands and the operator."""
    if "@" not in text:  # most texts (the operator redacts every condition message, every poll)
        return text
    import re  # here, not at the top: `taskherd probe` imports this module and never needs re

    # to the last '@' of the URL: a password is often written unescaped ('/', '+' and '@' of a
    # base64 secret), and a password shown in part is shown
    return re.sub(r"(://)([^:@/\s;]*:)?[^\s;]*@", r"\1\2***@", text)


def shown(value, limit=200, *, redacted=False):
    """``repr(value)`` for an error message: one line of about ``limit`` characters at most, whatever
    the value. The one way a message shows a value, for the worker, the commands and the operator.

    Never raises: repr() of an int of more than 4300 digits raises ValueError (Python's
    int_max_str_digits) and of a list nested 100,000 deep RecursionError, and an error about a value
    must not itself fail; such an int is shown by its size, which is all a 400-digit number says.
    ``redacted``: a URL's password replaced (:func:`redact`) before the cut, so no cut hides its '@'.
    Cut in the middle, keeping both ends and saying how much went: two long queue names often differ
    only at their end, and a status keeps 1000 characters, so the valid range after it must fit."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        sign = "-" if value < 0 else ""
        return f"<an int of {value.bit_length()} bits, about {sign}10**{int(value.bit_length() * 0.30103)}>"
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - nested deeper than repr goes, or a repr() of the user's that fails
        return f"<a {type(value).__name__} that cannot be shown: {type(exc).__name__} in repr()>"
    if redacted:
        text = redact(text)
    if len(text) <= limit:
        return text
    keep = max((limit - 30) // 2, 1)
    return f"{text[:keep]}…({len(text) - 2 * keep} more characters)…{text[-keep:]}"


def url_problem(url):
    """Why a URL cannot be used (a port out of range or not a number, a Redis database that is not a
    number), found before anything connects; None when it looks usable. kombu and redis-py parse
    URLs the same way (urllib) and would raise the same ValueError later, inside a worker or command."""
    from urllib.parse import urlsplit  # here, not at the top: `taskherd probe` never needs it

    problem = whitespace_problem(url)
    if problem:  # kombu would take it into the vhost, the password or the next URL's scheme
        return problem
    items = url.split(";") if url else []  # no URL at all is not this check's: Celery has a default
    for one in items:
        if not one:  # kombu skips it: 'amqp://h//;' alone became amqp://guest@localhost//
            return ("an empty URL between ';' (a ';' at the start or the end, or ';;'; valid: URLs "
                    "joined by ';' with none empty, or one URL)")
        try:
            parts = urlsplit(one)
            port = parts.port  # raises ValueError for ':99999' or ':abc'
        except ValueError as exc:
            if _unescaped_in_userinfo(one):  # the "port" urllib read is part of the password: not shown
                return UNESCAPED_USERINFO
            return f"{exc} (valid: a port in 1..65535)"
        if port == 0:
            return "port 0 cannot be connected to (valid: a port in 1..65535)"
        if broker_kind(one) == "redis" and parts.scheme != "redis+socket":
            database = parts.path.strip("/")
            if database and not database.isdigit():
                return f"the Redis database {database!r} is not a number (valid: /0, /1, …)"
    kinds = {broker_kind(one) for one in items} - {"other"}  # another scheme: broker_url names it
    if len(kinds) > 1:  # a failover list is one broker's nodes: kombu takes the first's transport for all
        schemes = ", ".join(dict.fromkeys(one.partition("://")[0] + "://" for one in items))
        return (f"it mixes broker kinds ({schemes}): a ';'-joined list is the failover nodes of one "
                f"broker (valid: every URL redis://… or every URL amqp://…)")
    return None


UNESCAPED_USERINFO = ("a '/', '?' or '#' in the user or password is written unescaped, so the URL ends "
                      "before its '@' (valid: each as %2F, %3F, %23: urllib.parse.quote(password, safe=''))")


def _unescaped_in_userinfo(one):
    """Whether an '@' comes after the first '/', '?' or '#' of what follows '://': a password holding
    one unescaped (a base64 secret's '/'), as urllib (and kombu) read it."""
    rest = one.partition("://")[2]
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    return bool(ends) and rest.rfind("@") > min(ends)


def whitespace_problem(raw):
    """What a URL's whitespace most likely is, None without any: a Secret made from a file (or with
    `echo`) keeps the file's last newline, which kombu would take into the vhost or the password."""
    if not any(c.isspace() for c in raw):
        return None
    if raw.endswith(("\n", "\r")) and not any(c.isspace() for c in raw.rstrip("\r\n")):
        return ("it ends with a newline (a Secret made from a file keeps the file's last newline: "
                "kubectl create secret generic … --from-literal=url=…, or echo -n)")
    return "whitespace in it (valid: a URL without spaces; a space in a password as %20)"


def url(raw):
    problem = url_problem(raw)
    if problem:
        raise ValueError(problem)
    if "://" not in raw:
        raise ValueError
    return raw


def broker_url(raw):
    """A URL of a broker taskherd runs on: Redis or RabbitMQ (each URL, when ';'-joined for failover)."""
    url(raw)
    schemes = {part.strip().partition("://")[0].lower() for part in raw.split(";") if part.strip()}
    unknown = sorted(schemes - set(REDIS_SCHEMES) - set(AMQP_SCHEMES))
    if unknown:
        raise ValueError(f"scheme {unknown[0]!r} is not a broker taskherd runs on "
                         f"(valid: {', '.join(REDIS_SCHEMES + AMQP_SCHEMES)})")
    return raw


#: An http(s) URL of a server (the RabbitMQ management API, Alertmanager, a webhook), in the words of
#: the CRD's rules, which the operator's parse_spec and the chart's schema follow: what it must not
#: hold (whitespace, Unicode's too, and control characters: ^[^\s\p{Z}\p{Cc}]+$ and Go's URL
#: parser), a '%' not starting %XX (the API server's url(), Go's url.ParseRequestURI, refuses it
#: before the ?query), the port as written, and the length.
URL_REFUSES = r"[\s\x00-\x1f\x7f-\x9f]"
BAD_ESCAPE = r"%(?![0-9A-Fa-f]{2})"
PORT = r"^([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$"
MAX_URL_LENGTH = 2048
HTTP_URL_VALID = "an http:// or https:// URL with a host, no spaces, and a port from 1 to 65535 if any"
BASE_URL_VALID = "a base URL without ?query or #fragment (the client adds its API's paths)"
HTTP_BASE_URL_VALID = f"{HTTP_URL_VALID}, {BASE_URL_VALID}"


def http_url_problem(raw: str, *, base: bool) -> str | None:
    """Why ``raw`` is not an http(s) URL of a server (None when it is). ``base``: an API's root,
    which a client appends paths to (no ?query or #fragment), as Alertmanager's and RabbitMQ's."""
    import re
    from urllib.parse import urlsplit

    if len(raw) > MAX_URL_LENGTH:
        return f"at most {MAX_URL_LENGTH} characters"
    if re.search(URL_REFUSES, raw):
        return whitespace_problem(raw) or "a control character in it"
    try:
        parts = urlsplit(raw)
        hostname = parts.hostname
    except ValueError as exc:  # 'http://[::1' (an unclosed IPv6 host)
        return str(exc)
    if parts.scheme not in ("http", "https") or not hostname:
        return "not an http:// or https:// URL with a host"
    if re.search(BAD_ESCAPE, raw.partition("?")[0]):
        return "'%' only as %XX before any ?query"
    # as written (urllib's .port takes ':0' and ':+1')
    port = _written_port(parts.netloc)
    if port is not None and not re.fullmatch(PORT, port):  # fullmatch: '$' would take '9093\n'
        if _unescaped_in_userinfo(raw):  # that "port" is part of the password: not shown
            return UNESCAPED_USERINFO
        return _port_problem(port)
    if base and ("?" in raw or "#" in raw):
        return "a base URL has no ?query or #fragment"
    return None


def _port_problem(port: str) -> str:
    """What is wrong with a port as written that PORT refuses. Go's URL parser (the API server's
    url()) reads 'am:' as no port and '09093' as 9093: the CRD refuses both, and so does this."""
    valid = "valid: a port from 1 to 65535 written without leading zeros, e.g. :9093, or no ':' at all"
    if port == "":
        return f"a ':' after the host without a port ({valid})"
    if port.isascii() and port.isdigit() and len(port) > 1 and port.startswith("0"):
        return f"the port {port!r} has a leading zero ({valid})"
    return f"the port {port!r} is not a number in range (valid: a port from 1 to 65535)"


def _written_port(netloc: str) -> str | None:
    """The port of ``user@host:port`` or ``[v6]:port`` as written, None without one."""
    host = netloc.rpartition("@")[2]
    if host.startswith("["):
        rest = host.partition("]")[2]
        return rest[1:] if rest.startswith(":") else None
    return host.partition(":")[2] if ":" in host else None


def said_with_valid(problem: str, valid: str) -> str:
    """": <problem> (valid: <valid>)" to follow a value as written, saying what is valid once (a
    problem may say it already; an empty one is only the range)."""
    said = f": {problem}" if problem else ""
    return said if "valid:" in problem else f"{said} (valid: {valid})"


def http_url(raw):
    """An http(s) base URL (an API's root: no ?query or #fragment, which a client appends paths to)."""
    problem = http_url_problem(raw, base=True)
    if problem:
        raise ValueError(problem)
    return raw


#: A host name (RFC 1123) or an IPv4/IPv6 address, as a server binds to.
_HOST = r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"


#: What :func:`listen_address` takes, in words (TASKHERD_METRICS_ADDR, `taskherd exporter --address`).
LISTEN_ADDRESS_VALID = ("an IP address or host name to listen on (0.0.0.0: all; :: for IPv6; an IPv4 "
                        "address is four numbers 0-255)")


def listen_address(raw):
    import ipaddress

    try:
        return str(ipaddress.ip_address(raw.strip("[]")))
    except ValueError:
        pass
    import re

    # A last label all digits is no host name (RFC 1123 2.1): '999.1.1.1' is a mistyped IPv4 and
    # getaddrinfo reads '1.2.3' or '1234' as inet_aton's short forms of another address.
    if not re.fullmatch(_HOST, raw) or raw.rpartition(".")[2].isdigit():  # fullmatch: '$' takes 'host\n'
        raise ValueError
    return raw


#: A Kubernetes object name (an RFC 1123 subdomain: the operator's parse_spec checks the names in a
#: WorkerPool with it too) and a namespace (an RFC 1123 label). Match them with re.fullmatch: with
#: re.match, '$' also matches before a final newline ('workers\n').
#: (Patterns, not compiled here: `taskherd probe` imports this module and never needs them.)
SUBDOMAIN = r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


def format_character(name):
    """The first invisible format character (Unicode category Cf: U+200B, U+FEFF, U+00AD…) of queue
    name ``name`` as 'U+XXXX (ITS NAME)', None without one: such a name looks like another queue's.
    Refused by configure(), the operator's spec parser, the chart and the WorkerPool CRD."""
    import unicodedata  # here: `taskherd probe` imports this module and never needs it

    for c in name:
        if unicodedata.category(c) == "Cf":
            return f"U+{ord(c):04X} ({unicodedata.name(c, 'unnamed')})"
    return None


def object_name(raw):
    import re

    if not re.fullmatch(SUBDOMAIN, raw):  # whole: with re.match, '$' also matches before a final '\n'
        raise ValueError
    return raw


def namespaces(raw):
    import re

    values = names(raw)
    if any(not re.fullmatch(_LABEL, name) for name in values):
        raise ValueError
    return values


#: Parsers of values that may carry a password: shown redacted in errors.
_URL_PARSERS = (url, broker_url, http_url)


class Variable:
    """One environment variable of the contract."""

    __slots__ = ("name", "parse", "valid", "default", "readers", "chart", "doc")

    def __init__(self, name, parse, valid, *, default=None, readers, chart=(), doc):
        self.name = name
        #: raw text -> value; raises ValueError on bad input
        self.parse = parse
        #: the valid range in words, for error messages and docs/chart.md
        self.valid = valid
        #: the value when the variable is unset or empty
        self.default = default
        #: the programs that read it (taskherd.worker.configure, taskherd probe, …)
        self.readers = readers
        #: the chart's containers that set it ("worker", "exporter", "operator", "beat", "test"); () = users may set it
        self.chart = chart
        self.doc = doc


_WORKER, _EXPORTER, _OPERATOR = "worker", "exporter", "operator"
#: Celery beat and the `helm test` pod publish as the pool's producers: they get its profile variables.
_BEAT, _TEST = "beat", "test"
_CONFIGURE = "taskherd.worker.configure"

VARIABLES = (
    # The broker, for every program that talks to it.
    Variable("TASKHERD_BROKER_URL", broker_url, "a broker URL (redis://…, amqp://…)",
             readers=(_CONFIGURE, "taskherd exporter", "taskherd dlq", "taskherd outbox relay", "taskherd recover",
                      "taskherd ping"),
             chart=(_WORKER, _EXPORTER, _BEAT, _TEST),
             doc="broker URL from the broker Secret; replaces the app's broker_url"),
    Variable("TASKHERD_BROKER_TYPE", broker_type, "redis or rabbitmq", readers=(_CONFIGURE,),
             chart=(_WORKER, _BEAT, _TEST),
             doc="the chart's broker.type; configure() refuses a broker URL of another kind (the chart "
                 "derived ports and Redis-only checks from it)"),
    Variable("TASKHERD_MANAGEMENT_URL", http_url, "an http(s) base URL of the RabbitMQ management API",
             readers=("taskherd exporter",), chart=(_EXPORTER,),
             doc="RabbitMQ management API (default: the AMQP host, port 15672); set from "
                 "broker.existingSecret.managementUrlKey"),
    Variable("TASKHERD_QUEUES", names, "a comma-separated list of queue names",
             readers=(_CONFIGURE, "taskherd exporter", "taskherd ping"), chart=(_WORKER, _EXPORTER, _BEAT, _TEST),
             doc="work queues (worker: the ones it consumes; exporter: the ones it watches; beat and the "
                 "helm test pod: the pool's, where they publish)"),
    Variable("TASKHERD_DEAD_LETTER_QUEUES", names,
             "a comma-separated list, one dead-letter queue per TASKHERD_QUEUES entry, in the same order",
             readers=(_CONFIGURE, "taskherd exporter"), chart=(_WORKER, _EXPORTER, _BEAT, _TEST),
             doc=f"the DLQ of each queue; unset: {DEFAULT_DEAD_LETTER_PATTERN}"),
    Variable("TASKHERD_DELIVERY_COUNTER_URL", url, "a redis:// URL", readers=(_CONFIGURE,), chart=(),
             doc="optional: a Redis counting redeliveries (RabbitMQ classic queues: instead of a copy of the "
                 "message carrying its count; Redis: used only without FastRecovery)"),
    # Time limits: the chart derives terminationGracePeriodSeconds from the same values.
    Variable("TASKHERD_SOFT_TIME_LIMIT", seconds, seconds_valid(), readers=(_CONFIGURE,),
             chart=(_WORKER, _BEAT, _TEST), doc="soft time limit (SoftTimeLimitExceeded in the task)"),
    Variable("TASKHERD_TIME_LIMIT", seconds, seconds_valid(), readers=(_CONFIGURE,),
             chart=(_WORKER, _BEAT, _TEST), doc="hard time limit (the pool child is killed)"),
    Variable("TASKHERD_VISIBILITY_TIMEOUT", timeout_seconds, seconds_valid(MAX_TIMEOUT_SECONDS),
             readers=(_CONFIGURE, "taskherd exporter"), chart=(_WORKER, _EXPORTER, _BEAT, _TEST),
             doc="Redis visibility_timeout (ignored on RabbitMQ)"),
    Variable("TASKHERD_RABBITMQ_CONSUMER_TIMEOUT", timeout_seconds, seconds_valid(MAX_TIMEOUT_SECONDS),
             readers=(_CONFIGURE,), chart=(),
             doc="RabbitMQ's consumer_timeout of the broker (default 1800): the hard time limit and "
                 "retry countdowns must stay below it"),
    Variable("TASKHERD_MAX_TASKS_PER_CHILD", count_or_off, "a whole number >= 0 (0: no limit)",
             readers=(_CONFIGURE,), chart=(_WORKER, _BEAT, _TEST), doc="Celery worker_max_tasks_per_child"),
    Variable("TASKHERD_MAX_MEMORY_PER_CHILD_KB", count_or_off, "a whole number of KiB >= 0 (0: no limit)",
             readers=(_CONFIGURE,), chart=(_WORKER, _BEAT, _TEST), doc="Celery worker_max_memory_per_child"),
    # Pod-side files and endpoints.
    Variable("TASKHERD_HEARTBEAT_DIR", text, "a directory path", default="/tmp/taskherd",
             readers=("Heartbeat component", "BeatHeartbeat component", "taskherd probe", "taskherd drain"),
             chart=(_WORKER, _BEAT),
             doc="where the worker (or beat) writes heartbeat.json and reads drain requests (an emptyDir)"),
    Variable("TASKHERD_HEARTBEAT_INTERVAL", seconds, seconds_valid(), default=5.0,
             readers=("Heartbeat component",), chart=(_WORKER,),
             doc="seconds between heartbeat writes; liveness fails after 6 missed"),
    Variable("TASKHERD_DRAIN_DEADLINE", drain_seconds, seconds_valid(MAX_DRAIN_SECONDS),
             readers=("taskherd drain",), chart=(_WORKER,),
             doc="the preStop drain returns after this long even if tasks still run (hard limit + drain margin)"),
    Variable("TASKHERD_METRICS_PORT", port, "a port number 0-65535 (0: no HTTP server)",
             default=WORKER_METRICS_PORT, readers=("Metrics component",), chart=(_WORKER,),
             doc="port of the worker's /metrics and of its HTTP probes (/livez, /readyz, /startupz)"),
    Variable("TASKHERD_METRICS_ADDR", listen_address, LISTEN_ADDRESS_VALID,
             default="0.0.0.0",
             readers=("Metrics component",), chart=(), doc="address of the worker's /metrics"),
    Variable("TASKHERD_METRICS_DIR", text, "a directory path", readers=("Metrics component",),
             chart=(_WORKER,), doc="parent of the prometheus_client multiprocess directories "
                                   "(default: <heartbeat dir>/prometheus)"),
    Variable("TASKHERD_RECOVERY_TIMEOUT", seconds, seconds_valid(), default=4.0,
             readers=("FastRecovery component",), chart=(),
             doc="Redis: a worker whose lease is this old is dead and its deliveries go back"),
    Variable("TASKHERD_RECOVERY_HEARTBEAT_INTERVAL", seconds, seconds_valid(), default=1.0,
             readers=("FastRecovery component",), chart=(), doc="Redis: seconds between lease refreshes"),
    # The queue exporter.
    Variable("TASKHERD_EXPORTER_PORT", port_not_zero, "a port number 1-65535", default=EXPORTER_PORT,
             readers=("taskherd exporter",), chart=(_EXPORTER,), doc="port of the exporter's /metrics"),
    Variable("TASKHERD_EXPORTER_INTERVAL", seconds, seconds_valid(), default=15.0,
             readers=("taskherd exporter",), chart=(_EXPORTER,), doc="seconds between broker polls"),
    Variable("TASKHERD_GLOBAL_KEYPREFIX", text, "kombu's global_keyprefix", default="",
             readers=("taskherd exporter", "taskherd dlq", "taskherd recover"), chart=(),
             doc="Redis: kombu's global_keyprefix transport option, if the app sets one"),
    # The transactional outbox.
    # text, not url: libpq takes 'host=… dbname=…' and multi-host URIs (h1:5432,h2:5432) that
    # urllib cannot parse; `taskherd outbox` has psycopg check it, naming the variable.
    Variable("TASKHERD_OUTBOX_DSN", text, "a PostgreSQL DSN (postgresql://… or 'host=… dbname=…')",
             readers=("taskherd outbox",),
             chart=(), doc="the database of the outbox table (then DATABASE_URL)"),
    # The operator.
    Variable("TASKHERD_WATCH_NAMESPACES", namespaces, "a comma-separated list of namespaces (lowercase RFC 1123 "
             "labels: a-z, 0-9, '-', at most 63 characters)",
             readers=("taskherd.operator",), chart=(),
             doc="namespaces whose WorkerPools the operator serves (default: its own)"),
    Variable("TASKHERD_LEASE_NAME", object_name, "a Lease name (a lowercase RFC 1123 subdomain: a-z, 0-9, '-', '.')",
             default="taskherd-operator",
             readers=("taskherd.operator",), chart=(_OPERATOR,), doc="the leader-election Lease"),
    Variable("TASKHERD_LEADER_ELECTION", flag, "true or false", default=True,
             readers=("taskherd.operator",), chart=(), doc="false: a single replica, no Lease"),
    Variable("TASKHERD_OPERATOR_METRICS_PORT", port, "a port number 0-65535 (0: off)", default=OPERATOR_METRICS_PORT,
             readers=("taskherd.operator",), chart=(_OPERATOR,), doc="port of the operator's /metrics"),
    Variable("TASKHERD_OPERATOR_HEALTH_PORT", port, "a port number 0-65535 (0: off)", default=OPERATOR_HEALTH_PORT,
             readers=("taskherd.operator",), chart=(_OPERATOR,), doc="port of the operator's /healthz"),
    Variable("TASKHERD_WORKER_METRICS_PORT", port_not_zero, "a port number 1-65535", default=WORKER_METRICS_PORT,
             readers=("taskherd.operator",), chart=(_OPERATOR,),
             doc="where the operator reads each worker's busyness (taskherd_tasks_in_flight)"),
    Variable("TASKHERD_ALERTMANAGER_URL", http_url, "an http(s) base URL (no ?query or #fragment)", readers=("taskherd.operator",), chart=(_OPERATOR,),
             doc="Alertmanager used when a WorkerPool names no alert target (operator.defaultAlertmanagerUrl)"),
)

BY_NAME = {variable.name: variable for variable in VARIABLES}


def read(names, environ=None):
    """({name: value}, problems) for the variables ``names``; unset or empty ones get their default.

    Every problem names the variable, its value as written and the valid range; none is raised here
    so that a caller can report them together with its own.
    """
    environ = os.environ if environ is None else environ
    values, problems = {}, []
    for name in names:
        variable = BY_NAME[name]
        raw = (environ.get(name) or "").strip()
        if not raw:
            values[name] = variable.default
            continue
        try:
            values[name] = variable.parse(raw)
        except (ValueError, OverflowError) as exc:
            shown, why = raw, ""
            if variable.parse in _URL_PARSERS:  # a URL's password stays out of the logs; its problem is said
                shown, why = redact(raw), f": {exc}" if str(exc) else ""
            problems.append(f"{name}={shown!r} is invalid{why}: expected {variable.valid}")
    return values, problems


def misspelled(environ=None):
    """A warning for each TASKHERD_* variable set in ``environ`` that is not one of the contract's but
    nearly is (``TASKHERD_SOFT_TIMELIMIT``): read by nothing, it would change nothing, silently."""
    import difflib

    environ = os.environ if environ is None else environ
    warnings = []
    for name in sorted(environ):
        if name.startswith("TASKHERD_") and name not in BY_NAME:
            close = difflib.get_close_matches(name, BY_NAME, n=1, cutoff=0.9)
            if close:
                warnings.append(f"{name} is not a taskherd variable and is ignored: did you mean {close[0]}? "
                                "(the variables: docs/chart.md, section \"The chart <-> program contract\")")
    return warnings


def read_one(name, environ=None):
    """The value of one variable (its default when unset); raises :class:`ContractError` when invalid."""
    values, problems = read((name,), environ)
    if problems:
        raise ContractError(problems)
    return values[name]


def is_set(name, environ=None):
    environ = os.environ if environ is None else environ
    return bool((environ.get(name) or "").strip())


def set_by_chart(container):
    """The names of the variables the chart sets on ``container`` ("worker", "exporter", "operator", "beat",
    "test": the `helm test` pod)."""
    return {variable.name for variable in VARIABLES if container in variable.chart}
