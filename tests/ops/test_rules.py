"""Prometheus configuration and rules pass promtool: syntax, and their unit tests."""

from __future__ import annotations

import subprocess

import pytest

from .conftest import PROMETHEUS_DIR, RULES, require_tool

pytestmark = pytest.mark.timeout(60)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool")
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=50,
                          check=False, cwd=PROMETHEUS_DIR)


def test_rules_are_valid() -> None:
    """promtool check rules accepts the recording and alerting rules."""
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rule_unit_tests_pass() -> None:
    """promtool test rules: every alert firing and not firing, the recorded ratios."""
    result = _promtool("test", "rules", "tests/envlink.rules.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rule_unit_tests_cover_every_alert() -> None:
    """Each alert of the rules file has a firing and a not-firing case in the unit tests."""
    import yaml

    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((PROMETHEUS_DIR / "tests" / "envlink.rules.test.yml")
                           .read_text(encoding="utf-8"))
    firing: set[str] = set()
    silent: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    assert alerts == firing == silent


def test_compose_prometheus_config_is_valid() -> None:
    """promtool check config accepts the compose stack's prometheus.yml (and its rules)."""
    result = _promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
