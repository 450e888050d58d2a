"""pkobatch's alerts and dashboard (deploy/kustomize/components/monitoring) against the real
``promtool``: the rules load, every alert's unit tests pass (tests/fixtures/monitoring), each
alert has a case that fires and one that does not, every alert's runbook_url names a section
of docs/, and every dashboard query parses.

That the metrics they name are exported by a running controller is checked in
tests/e2e/test_helm_install.py, which scrapes the controller the chart configures.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.promql_names import metric_names

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "kustomize" / "components" / "monitoring"
RULE_TESTS = REPO / "tests" / "fixtures" / "monitoring" / "rules-test.yaml"
DASHBOARD = MONITORING / "pkobatch-dashboard.json"
RUNBOOK_PREFIX = "https://github.com/OWNER/pkobatch/blob/main/"
# Grafana's variables, replaced by what they stand for so promtool can parse the queries.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$job": ".*"}


def rule_groups() -> Any:
    return yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())["spec"]


def alerts() -> list[dict[str, Any]]:
    return [rule for group in rule_groups()["groups"] for rule in group["rules"] if "alert" in rule]


def promtool(promtool_bin: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool_bin), *args], capture_output=True, text=True, timeout=120, check=False
    )


def write_rules(directory: Path, groups: Any) -> Path:
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(groups, sort_keys=False))
    return path


def test_rules_load_without_lint_findings(promtool_bin: Path, tmp_path: Path) -> None:
    done = promtool(
        promtool_bin,
        "check",
        "rules",
        "--lint=all",
        "--lint-fatal",
        str(write_rules(tmp_path, rule_groups())),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def run_rule_tests(
    promtool_bin: Path, directory: Path, groups: Any
) -> subprocess.CompletedProcess[str]:
    write_rules(directory, groups)
    shutil.copy(RULE_TESTS, directory / RULE_TESTS.name)
    return promtool(promtool_bin, "test", "rules", str(directory / RULE_TESTS.name))


def test_every_alert_passes_its_promtool_unit_tests(promtool_bin: Path, tmp_path: Path) -> None:
    done = run_rule_tests(promtool_bin, tmp_path, rule_groups())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_case_that_fires_and_one_that_does_not() -> None:
    cases = [
        case
        for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in group.get("alert_rule_test", [])
    ]
    for alert in alerts():
        name = alert["alert"]
        own = [case for case in cases if case["alertname"] == name]
        assert [c for c in own if c.get("exp_alerts")], f"{name}: no case where it fires"
        assert [c for c in own if not c.get("exp_alerts")], f"{name}: no case where it is quiet"


@pytest.mark.parametrize(
    ("alert", "old", "new"),
    [
        ("PkobatchStackFailing", ">= 2", ">= 3"),
        ("PkobatchStackStalled", '{reason!~"DestroyedOnRequest|Suspended"}', ""),
        ("PkobatchNoLeader", "== 0", "< 2"),
    ],
)
def test_the_unit_tests_catch_a_changed_rule(
    promtool_bin: Path, tmp_path: Path, alert: str, old: str, new: str
) -> None:
    groups = rule_groups()
    for group in groups["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                assert old in rule["expr"]
                rule["expr"] = rule["expr"].replace(old, new)
    done = run_rule_tests(promtool_bin, tmp_path, groups)
    assert done.returncode != 0
    assert f"alertname: {alert}" in done.stdout + done.stderr


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lowercase, punctuation other
    than hyphens dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_alert_has_a_runbook_section_in_docs() -> None:
    for alert in alerts():
        url = alert["annotations"].get("runbook_url", "")
        assert url.startswith(RUNBOOK_PREFIX), f"{alert['alert']}: runbook_url {url!r}"
        path, _, anchor = url.removeprefix(RUNBOOK_PREFIX).partition("#")
        assert path.startswith("docs/"), url
        assert anchor == alert["alert"].lower(), url
        assert anchor in heading_anchors((REPO / path).read_text()), f"{url}: no such heading"


def test_heading_anchors_follow_github() -> None:
    text = "## Runs, Jobs and history\n### PkobatchNoLeader\n## Suspend (pkobatch)\n"
    assert heading_anchors(text) == {
        "runs-jobs-and-history",
        "pkobatchnoleader",
        "suspend-pkobatch",
    }


# --- the dashboard ------------------------------------------------------------------------


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_dashboard_uses_its_datasource_variable_everywhere() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "job"} <= variables
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert 'job=~"$job"' in target["expr"], panel["title"]


def test_every_dashboard_query_parses(promtool_bin: Path, tmp_path: Path) -> None:
    """promtool parses each query as a recording rule (Grafana's variables substituted)."""
    rules = []
    for index, expr in enumerate(dashboard_queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"pkobatch_dashboard:query_{index}", "expr": expr})
    path = write_rules(tmp_path, {"groups": [{"name": "dashboard", "rules": rules}]})
    done = promtool(promtool_bin, "check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_query_names_a_metric() -> None:
    for expr in [*dashboard_queries(), *(alert["expr"] for alert in alerts())]:
        assert metric_names(expr), expr


def test_metric_names_are_read_from_selectors_not_from_labels_or_functions() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, name) (rate(a_seconds_bucket{name="b"}[5m])))'
        ' / ignoring(x) group_left c_total > bool 0 and absent(up{job="d"} == 1)'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "c_total", "up"}
