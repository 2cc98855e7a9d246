"""The dashboards: generated from dashboards/generate.py, with units, variables, rate windows."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from .conftest import DASHBOARDS, ROOT

pytestmark = pytest.mark.timeout(60)


def _boards() -> dict[str, dict[str, Any]]:
    boards = {p.name: json.loads(p.read_text(encoding="utf-8"))
              for p in sorted(DASHBOARDS.glob("*.json"))}
    assert set(boards) == {"envlink-overview.json", "envlink-drilldown.json"}
    return boards


def test_committed_dashboards_are_the_generated_ones() -> None:
    """dashboards/*.json and the k8s copies are exactly what generate.py writes."""
    result = subprocess.run([sys.executable, str(DASHBOARDS / "generate.py"), "--check"],
                            capture_output=True, text=True, timeout=50, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_every_panel_has_a_unit_a_datasource_and_queries() -> None:
    """Each panel (rows aside) sets a unit, uses the datasource variable and has queries."""
    for name, board in _boards().items():
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), name
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["fieldConfig"]["defaults"].get("unit"), (name, panel["title"])
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], (name, panel["title"])
            assert panel["description"], (name, panel["title"])


def test_rates_use_the_rate_interval_and_the_variables() -> None:
    """Every rate() window is $__rate_interval; raw series are filtered by $job and $instance."""
    for name, board in _boards().items():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                windows = re.findall(r"\[([^\]]+)\]", expr)
                assert all(w == "$__rate_interval" for w in windows), (name, expr)
                assert 'job=~"$job"' in expr, (name, expr)
                if ":" not in expr.split("{")[0]:  # not a recording rule (per job)
                    assert 'instance=~"$instance"' in expr, (name, expr)


def test_template_variables() -> None:
    """Both dashboards have datasource, job (service) and instance; the drill-down method."""
    for name, board in _boards().items():
        names = [v["name"] for v in board["templating"]["list"]]
        expected = ["datasource", "job", "instance"]
        if name == "envlink-drilldown.json":
            expected.append("method")
        assert names == expected, name
