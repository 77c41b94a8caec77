"""The fault files: every one in e2e/chaos/faults reads and checks, and a bad one is refused with
every problem named by its key."""
import pytest
import yaml

from e2e.chaos import spec
from e2e.chaos.actions import ACTIONS


def test_every_fault_file_loads_and_uses_known_actions():
    specs = spec.load_all()
    assert len(specs) >= 19
    for s in specs:
        assert s.path.stem == s.name
        assert s.fault.action in ACTIONS
        assert s.summary and s.fault_class


def test_the_subset_covers_every_fault_class_on_this_machine_except_multi_node_ones():
    specs = spec.load_all()
    classes = {s.fault_class for s in specs}
    subset = {s.fault_class for s in specs if s.subset}
    assert subset == classes
    assert not any(s.subset and {"kind", "nodes>1", "rabbitmq-cluster"} & set(s.requires) for s in specs)


def test_the_issues_fault_matrix_is_all_there():
    actions = {(s.fault.action, s.fault.target, s.fault.params.get("signal")) for s in spec.load_all()}
    for wanted in [("kill-process", "busiest-worker", "KILL"), ("delete-pod", "busiest-worker", None),
                   ("send-poison", "pool", None), ("operator-scale-down", "pool", None),
                   ("helm-upgrade", "release", None), ("kill-process", "busiest-worker", "STOP"),
                   ("restart-service", "broker", None), ("partition", "half-workers", None),
                   ("restart-service", "broker-node", None), ("restart-service", "postgres", None),
                   ("partition", "all-workers", None), ("dlq-unwritable", "dead-letter-queue", None),
                   ("kill-process", "operator-leader", "KILL"), ("restart-kubelet", "worker-node", None),
                   ("drain-node", "worker-node", None), ("lose-node", "worker-node", None)]:
        assert wanted in actions, wanted
    durations = sorted(s.duration for s in spec.load_all() if s.fault.action == "partition"
                       and s.fault.params.get("from") == "broker")
    assert durations[0] >= 30 and durations[-1] <= 120 and durations[-1] > 60


def test_a_bad_file_is_refused_with_every_problem_named():
    raw = {"name": "Bad_Name", "class": "x", "summary": "s", "colour": "red",
           "fault": {"action": "kill-process", "target": "broker", "signal": "HUP", "count": 9},
           "brokers": ["kafka"], "trigger": {"inFlight": -1}, "load": {"tasks": "many", "durations": [99]},
           "steadyState": {"before": ["calm"]}, "expect": ["magic"]}
    with pytest.raises(spec.SpecError) as error:
        spec.parse(raw)
    message = str(error.value)
    for part in ["colour: unknown key", "name: 'Bad_Name'", "brokers[0]: 'kafka' is not one of redis, rabbitmq",
                 "fault.target: 'broker' is not one kill-process can hit (valid: busiest-worker, operator-leader)",
                 "fault.signal: 'HUP' is not valid for kill-process (valid: KILL, STOP)",
                 "fault.count: 9 is not valid for kill-process (valid: a whole number from 1 to 5)",
                 "trigger.inFlight: -1 must be a number from 0 to 600", "load.tasks: 'many' must be a number",
                 "load.durations: [99] must be a non-empty list of seconds from 0 to 15",
                 "steadyState.before[0]: 'calm' is not one of", "expect[0]: 'magic' is not one of"]:
        assert part in message, (part, message)


def test_the_name_must_match_the_file(tmp_path):
    path = tmp_path / "other-name.yaml"
    path.write_text(yaml.safe_dump({"name": "worker-sigkill", "class": "c", "summary": "s",
                                    "fault": {"action": "delete-pod", "target": "busiest-worker"}}))
    with pytest.raises(spec.SpecError, match="must match the file name other-name.yaml"):
        spec.load_file(path)


def test_select_names_the_unknown_fault():
    with pytest.raises(spec.SpecError, match=r"unknown fault\(s\) \['no-such'\]"):
        spec.select(spec.load_all(), ["no-such"])


def test_a_scale_up_trigger_needs_the_pool_at_its_minimum_first():
    # CI once ran this scenario right after one that left the pool at maxReplicas: there was no
    # scale-up left to make and the trigger waited 150 s in vain.
    raw = {"name": "up", "class": "c", "summary": "s", "trigger": {"scalingUp": True},
           "fault": {"action": "kill-process", "target": "operator-leader", "signal": "KILL"}}
    with pytest.raises(spec.SpecError, match="a scalingUp trigger needs pool-at-minimum"):
        spec.parse(raw)
    raw["steadyState"] = {"before": ["workers-ready", "pool-at-minimum"]}
    assert spec.parse(raw).before == ("workers-ready", "pool-at-minimum")
