"""Bad WorkerPool input that the API server and the operator's parse_spec once judged differently,
or judged alike but explained badly: each runs without a cluster. The CRD's side is read from the
file (its rules run on a real API server in test_workerpool_corpus.py, whose corpus has a case for
each). Standard: a clear error naming the key as the user wrote it (spec.x.y) and the valid range,
and never a silent misread."""
from __future__ import annotations

import copy
import re
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

from taskherd import contract
from taskherd.operator import policy
from taskherd.operator.policy import InvalidSpec, parse_spec

CRD_FILE = Path(__file__).resolve().parents[2] / "charts" / "taskherd" / "crds" / "workerpools.taskherd.io.yaml"
SPEC = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
#: a condition keeps this much of a message (taskherd.operator.status.MESSAGE_LIMIT)
CONDITION_LIMIT = 1000

GOOD = {"scaleTargetRef": {"name": "workers"},
        "broker": {"type": "redis", "secretRef": {"name": "broker"}, "queues": ["emails", "reports"]},
        "minReplicas": 0, "maxReplicas": 10}


def spec_with(**changes) -> dict:
    """GOOD with dotted keys set: spec_with(**{"broker.queues": [...]})."""
    spec = copy.deepcopy(GOOD)
    for dotted, value in changes.items():
        node = spec
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return spec


def refusal(spec: dict) -> str:
    with pytest.raises(InvalidSpec) as info:
        parse_spec(spec)
    return str(info.value)


def rules(path: str) -> list[str]:
    node = SPEC
    for part in path.split("."):
        node = node["properties"][part]
    return [r["rule"] for r in node.get("x-kubernetes-validations", [])]


# -- 1. URL ports the API server's url() reads differently ------------------------------------------

@pytest.mark.parametrize("field", ["webhookUrl", "alertmanagerUrl"])
@pytest.mark.parametrize("url,says", [
    ("http://am:09093/", "the port '09093' has a leading zero"),
    ("http://am:00080", "the port '00080' has a leading zero"),
    ("http://am:/", "a ':' after the host without a port"),
    ("http://am:", "a ':' after the host without a port"),
    ("http://[fd00::1]:/", "a ':' after the host without a port"),
])
def test_a_port_with_a_leading_zero_or_an_empty_port_is_refused_saying_which(field, url, says):
    message = refusal(spec_with(**{f"deadLetter.{field}": url}))
    assert message.startswith(f"spec.deadLetter.{field}={url!r} is invalid: must be an http://"), message
    assert says in message and "valid: a port from 1 to 65535 written without leading zeros" in message


@pytest.mark.parametrize("url", ["http://am:9093/", "http://am:1", "http://am:65535/x", "http://[fd00::1]:9093/",
                                 "http://user@am:80/", "https://hooks.shop/x?a=b:"])
def test_ports_as_usually_written_stay_valid(url):
    parse_spec(spec_with(**{"deadLetter.webhookUrl": url}))


def test_the_other_port_messages_are_unchanged():
    assert contract.http_url_problem("http://am:0", base=True) == \
        "the port '0' is not a number in range (valid: a port from 1 to 65535)"


#: the CRD's new port rule, in Python: no ':' closing the host (a regex over the whole URL, which
#: maxLength bounds), and getPort() 1 to 5 digits, no leading zero, 1..65535.
BARE_COLON = re.compile(r"^[A-Za-z][-+.A-Za-z0-9]*://[^/?#]*:([/?#]|$)")


@pytest.mark.parametrize("field", ["webhookUrl", "alertmanagerUrl"])
def test_the_crd_refuses_the_same_ports(field):
    (port_rule,) = [r for r in rules(f"deadLetter.{field}") if "getPort()" in r]
    assert f"!self.matches('{BARE_COLON.pattern}')" in port_rule
    assert "!url(self).getPort().startsWith('0')" in port_rule
    assert "size(url(self).getPort()) <= 5" in port_rule
    assert "int(url(self).getPort()) >= 1 && int(url(self).getPort()) <= 65535" in port_rule
    for url in ("http://am:/", "http://am:", "http://am:9093:/", "http://[::1]:/x", "http://u:p@am:?x", "http://am:#f"):
        assert BARE_COLON.match(url), url
    for url in ("http://am/", "http://am:9093/", "http://[::1]/x", "http://u:p@am/", "http://am/x:", "http://am/?a=:",
                "http://u:@am/"):
        assert not BARE_COLON.match(url), url


# -- 2. queue names are bounded in UTF-8 bytes, as RabbitMQ bounds them ------------------------------

def test_a_queue_name_over_255_bytes_is_refused_though_it_is_200_characters():
    name = "\u00e9" * 200  # 400 bytes: RabbitMQ refuses it, its management API answers 404
    message = refusal(spec_with(**{"broker.queues": [name], "broker.deadLetterQueues": ["failed"]}))
    assert message.startswith("spec.broker.queues[0]='éééé"), message
    assert "at most 255 bytes in UTF-8" in message and "here: 400 bytes (200 characters)" in message


def test_a_dead_letter_queue_name_over_255_bytes_is_refused():
    message = refusal(spec_with(**{"broker.deadLetterQueues": ["\u00e9" * 128, "failed"]}))
    assert message.startswith("spec.broker.deadLetterQueues[0]=") and "here: 256 bytes" in message, message


def test_a_queue_whose_default_dead_letter_queue_would_pass_255_bytes_is_refused():
    message = refusal(spec_with(**{"broker.queues": ["\u00e9" * 126]}))  # 252 bytes, .dlq: 256
    assert message.startswith("spec.broker.queues[0]=") and "at most 251 bytes in UTF-8" in message, message
    assert "here: 252 bytes" in message


def test_names_of_exactly_255_and_251_bytes_are_valid():
    parse_spec(spec_with(**{"broker.queues": ["\u00e9" * 127 + "a"], "broker.deadLetterQueues": ["d" * 255]}))
    spec = parse_spec(spec_with(**{"broker.queues": ["\u00e9" * 125 + "a"]}))
    assert len(spec.broker.dead_letter_queues[0].encode()) == 255


def test_the_crd_counts_bytes_too():
    for field in ("queues", "deadLetterQueues"):
        assert "self.all(q, size(bytes(q)) <= 255)" in rules(f"broker.{field}")
    assert any("self.queues.all(q, size(bytes(q)) <= 251)" in r for r in rules("broker"))
    assert not any("size(q) <= 251" in r for r in rules("broker"))


# -- 3. a final newline is not matched away ----------------------------------------------------------

@pytest.mark.parametrize("key,value", [
    ("broker.queues", ["emails\n"]),
    ("broker.deadLetterQueues", ["emails.dlq\n", "reports.dlq"]),
    ("scaleTargetRef.name", "workers\n"),
    ("scaleTargetRef.kind", "Deployment\n"),
    ("scaleTargetRef.apiVersion", "apps/v1\n"),
    ("broker.secretRef.name", "broker\n"),
    ("broker.secretRef.key", "url\n"),
])
def test_a_value_with_a_final_newline_is_refused(key, value):
    message = refusal(spec_with(**{key: value}))
    shown = repr(value[0] if isinstance(value, list) else value)
    assert message.startswith(f"spec.{key}") and f"={shown} is invalid" in message, message


def test_a_management_url_key_with_a_final_newline_is_refused():
    spec = spec_with(**{"broker.type": "rabbitmq", "broker.secretRef.managementUrlKey": "management-url\n"})
    assert refusal(spec).startswith("spec.broker.secretRef.managementUrlKey='management-url\\n' is invalid")


def test_the_contracts_name_parsers_refuse_a_final_newline():
    for parse, good in ((contract.object_name, "workers"), (contract.listen_address, "metrics.local")):
        assert parse(good) == good
        with pytest.raises(ValueError):
            parse(good + "\n")


def test_policy_matches_its_formats_whole():
    source = Path(policy.__file__).read_text()
    assert not re.search(r"\.match\(", source), "use fullmatch: '$' also matches before a final newline"


# -- 4. invisible format characters (Unicode Cf) -----------------------------------------------------

@pytest.mark.parametrize("name,code_point", [
    ("emails\u200b", "U+200B (ZERO WIDTH SPACE)"),
    ("\ufeffemails", "U+FEFF (ZERO WIDTH NO-BREAK SPACE)"),
    ("e\u00admails", "U+00AD (SOFT HYPHEN)"),
    ("emails\u2060", "U+2060 (WORD JOINER)"),
    ("emails\u202e", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ("emails\U000e0001", "U+E0001 (LANGUAGE TAG)"),
])
def test_a_queue_name_with_an_invisible_format_character_is_refused_naming_it(name, code_point):
    message = refusal(spec_with(**{"broker.queues": [name]}))
    assert message.startswith(f"spec.broker.queues[0]={name!r} is invalid") and f"here: {code_point}" in message
    assert "no invisible format characters (Unicode category Cf" in message
    message = refusal(spec_with(**{"broker.deadLetterQueues": ["failed", name]}))
    assert message.startswith("spec.broker.deadLetterQueues[1]=") and code_point in message


def test_every_format_character_is_refused_and_nothing_else_is_newly():
    cf = [chr(cp) for cp in range(sys.maxunicode + 1) if unicodedata.category(chr(cp)) == "Cf"]
    assert len(cf) > 100
    assert all(contract.format_character(f"q{c}") for c in cf)
    assert contract.format_character("caf\u00e9-\u65e5\u672c") is None


def test_the_crd_refuses_format_characters_in_both_lists():
    for field in ("queues", "deadLetterQueues"):
        assert "self.all(q, !q.matches('\\\\p{Cf}'))" in rules(f"broker.{field}")


# -- 5. what is valid survives a condition's 1000 characters -------------------------------------------

def test_a_very_long_queue_name_does_not_push_the_valid_range_out_of_the_condition():
    message = refusal(spec_with(**{"broker.queues": ["q" * 1200]}))
    assert len(message) < CONDITION_LIMIT and message.startswith("spec.broker.queues[0]='qqq")
    assert "more characters" in message and "at most 255 bytes in UTF-8; here: 1200 bytes" in message


def test_a_repeated_queue_is_named_by_index_with_the_one_it_repeats():
    queues = [f"queue-number-{i:02d}-" + "x" * 40 for i in range(30)] + ["queue-number-05-" + "x" * 40]
    message = refusal(spec_with(**{"broker.queues": queues}))
    assert message.startswith(f"spec.broker.queues[30]='queue-number-05-{'x' * 40}' is invalid: must be"), message
    assert message.endswith("; it repeats spec.broker.queues[5]") and len(message) < CONDITION_LIMIT


def test_a_long_list_of_queues_and_a_long_typo_are_cut_too():
    too_many = [f"q{i}-" + "x" * 250 for i in range(65)]
    message = refusal(spec_with(**{"broker.queues": too_many}))
    assert len(message) < CONDITION_LIMIT and "a list of 1 to 64 distinct names" in message
    message = refusal({**GOOD, "x" * 2000: 1})
    assert len(message) < CONDITION_LIMIT and "one of the fields of spec: scaleTargetRef" in message


def test_a_dead_letter_queue_count_that_differs_is_said_before_any_name():
    queues = [f"q{i}-" + "x" * 240 for i in range(64)]
    message = refusal(spec_with(**{"broker.queues": queues, "broker.deadLetterQueues": ["failed"]}))
    assert len(message) < CONDITION_LIMIT, message
    assert "one dead-letter queue per queue of spec.broker.queues, in the same order (here 1 for 64 queues)" in message


def test_a_dead_letter_queue_that_is_a_work_queue_is_named_by_index():
    message = refusal(spec_with(**{"broker.deadLetterQueues": ["emails.dlq", "emails"]}))
    assert message.startswith("spec.broker.deadLetterQueues[1]='emails' is invalid"), message
    assert message.endswith("here: it is spec.broker.queues[0]")
    message = refusal(spec_with(**{"broker.queues": ["emails", "emails.dlq"]}))
    assert message.startswith("spec.broker.queues[1]='emails.dlq' is invalid: must be not the default "
                              "dead-letter queue <queue>.dlq of spec.broker.queues[0]='emails'"), message


def test_a_cut_value_never_shows_a_password():
    for value in ("redis://:" + "p" * 300 + "@redis:6379/0", "redis://:hunter2@redis/" + "x" * 500):
        message = refusal(spec_with(**{"broker.secretRef.name": value}))
        assert "ppppp" not in message and "hunter2" not in message and "***@" in message, message
        assert len(message) < CONDITION_LIMIT


# -- 6. every key a message names is spelled in full -----------------------------------------------

def test_min_above_max_names_spec_max_replicas():
    assert refusal(spec_with(minReplicas=5, maxReplicas=2)) == \
        "spec.minReplicas=5 is invalid: must be <= spec.maxReplicas (2)"


def test_two_page_targets_name_spec_dead_letter_alertmanager_url():
    message = refusal(spec_with(**{"deadLetter.alertmanagerUrl": "http://am:9093",
                                   "deadLetter.webhookUrl": "https://hooks.shop/x"}))
    assert message == ("spec.deadLetter.webhookUrl='https://hooks.shop/x' is invalid: must be unset when "
                       "spec.deadLetter.alertmanagerUrl is set (one page target per pool)")


def test_no_message_of_the_corpus_names_a_nested_key_without_spec():
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from test_workerpool_corpus import CORPUS, good_spec, merged
    finally:
        sys.path.pop(0)
    nested = "|".join(re.escape(f"{at}.") for at in policy.FIELDS if at)
    top = "|".join(re.escape(key) for key in policy.RANGES)
    bare = re.compile(rf"(?<![.\w])(?:{nested})\w+|(?<![.\w])(?:{top})\b")
    wrong = {}
    for bad in CORPUS:
        try:
            parse_spec(merged(good_spec(), bad.change))
        except InvalidSpec as exc:
            # the list after "the fields of spec…:" names fields of that object, not paths
            said = str(exc).split("spelled as one of the fields of")[0]
            if bare.search(said):
                wrong[bad.id] = said
    assert wrong == {}
