"""The chart knows the operator's whole command line (the operator is its appVersion): the options it
sets from its values (`taskherd.reservedOperatorArgs`) and the ones it leaves to `operator.extraArgs`
(`taskherd.operatorExtraOptions`) are exactly the operator's own, so an option added to the operator
cannot be refused by the chart, nor a removed one let through into a restart loop."""
from __future__ import annotations

import re

import yaml

from chart_support import CHART
from taskherd.operator.__main__ import parser
from taskherd.operator.config import OperatorConfig


def _chart_list(name: str) -> set[str]:
    text = (CHART / "templates" / "_validate.tpl").read_text()
    body = re.search(r'\{\{- define "' + re.escape(name) + r'" -\}\}\n(.*?)\{\{- end \}\}', text, re.S)
    assert body, f"no define {name!r} in _validate.tpl"
    return set(yaml.safe_load(body.group(1)))


def test_the_charts_operator_options_are_the_operators_own():
    operator_options = {option for action in parser(OperatorConfig())._actions  # argparse keeps no public list
                        for option in action.option_strings} - {"-h", "--help"}
    chart_options = _chart_list("taskherd.reservedOperatorArgs") | _chart_list("taskherd.operatorExtraOptions")
    assert chart_options == operator_options
