"""The operator's settings from its environment: a combination no server can run is refused by name."""
import pytest

from taskherd import contract
from taskherd.operator.config import OperatorConfig


def test_the_metrics_and_health_servers_cannot_share_a_port():
    with pytest.raises(contract.ContractError, match=r"TASKHERD_OPERATOR_METRICS_PORT and TASKHERD_OPERATOR_HEALTH_PORT "
                                                     r"are both 9894: .* \(valid: two different ports, or 0"):
        OperatorConfig.from_env({"TASKHERD_OPERATOR_METRICS_PORT": "9894"})
    assert OperatorConfig.from_env({"TASKHERD_OPERATOR_METRICS_PORT": "0", "TASKHERD_OPERATOR_HEALTH_PORT": "0"})


def test_an_abbreviated_option_is_refused_not_taken_for_the_option_it_begins():
    """`--no-leader` was --no-leader-election: the chart's extraArgs check reads the whole spelling."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "taskherd.operator", "--no-leader"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "unrecognized arguments: --no-leader" in result.stderr, result.stderr
