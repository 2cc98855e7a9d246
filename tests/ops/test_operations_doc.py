"""docs/operations.md documents every dashboard panel and every alert it links to."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from .conftest import DASHBOARDS, ROOT, RULES

pytestmark = pytest.mark.timeout(30)

DOC = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")


def _anchors() -> set[str]:
    """GitHub-style anchors of the doc's headings."""
    out = set()
    for line in DOC.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def test_every_alert_has_a_runbook_section_its_annotation_links_to() -> None:
    """Each alert has a '### <alert>' section, and its description links to that anchor."""
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) == 7
    anchors = _anchors()
    for alert in alerts:
        name = alert["alert"]
        assert f"\n### {name}\n" in DOC, name
        (link,) = re.findall(r"docs/operations\.md#([\w-]+)", alert["annotations"]["description"])
        assert link == name.lower() and link in anchors, (name, link)


def test_every_panel_is_described() -> None:
    """Each panel title of both dashboards appears in the doc's panel tables."""
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text(encoding="utf-8"))
        for panel in board["panels"]:
            if panel["type"] != "row":
                assert f"| {panel['title']} |" in DOC, (path.name, panel["title"])


def _section(name: str) -> str:
    start = DOC.index(f"\n### {name}\n")
    ends = [i for i in (DOC.find("\n### ", start + 1), DOC.find("\n## ", start + 1)) if i != -1]
    return DOC[start:min(ends)]


def test_every_runbook_names_the_scenarios_that_produce_its_alert() -> None:
    """Each alert's runbook names exactly the scenarios of the live alert suite in which
    the suite expects it to fire, and those scenarios exist."""
    from .alert_scenarios import SCENARIOS
    from .test_alerts_live import EXPECTED

    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    for alert in alerts:
        section = _section(alert)
        (produced,) = re.findall(r"\nProduced by the suite's scenarios? (.+?)(?:\n\n|\Z)",
                                 section, re.S)
        named = {n for n in re.findall(r"`([a-z-]+)`", produced) if n in SCENARIOS}
        expected = {scenario for scenario, fired in EXPECTED.items() if alert in fired}
        assert expected and named == expected, (alert, named, expected)
