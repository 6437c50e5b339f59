"""What ships in monitoring/: the Prometheus alert rules are valid for Prometheus's own tool, the main
alerts fire when they should (their unit tests), and the rules and the Grafana dashboard name only metrics
the daemon exports, in valid PromQL."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.reports.test_metrics_catalogue import exported

MONITORING = Path(__file__).resolve().parent.parent / "monitoring"
RULES = MONITORING / "msgbus-alerts.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
# Grafana's variables, given values so that promtool can parse the expressions.
GRAFANA_VARIABLES = {"$instance": ".*", "$__rate_interval": "1m"}
# Series Prometheus makes of a histogram, and the one it makes of every scrape.
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def promtool_binary() -> str:
    beside_python = Path(sys.executable).parent / "promtool"
    binary = shutil.which("promtool") or (str(beside_python) if beside_python.exists() else None)
    assert binary, "promtool is missing: `make setup` puts it in the venv (from Debian's prometheus package)"
    return binary


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool_binary(), *args], cwd=MONITORING, capture_output=True, text=True, timeout=60
    )


def test_the_alert_rules_pass_promtool_check() -> None:
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 10 rules found" in checked.stdout


def test_the_main_alerts_fire_when_they_should_and_only_then() -> None:
    tested = promtool("test", "rules", "msgbus-alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def metrics_named(text: str) -> set[str]:
    named = set()
    for name in re.findall(r"\bmsgbus_[a-z_]+", text):
        for suffix in HISTOGRAM_SUFFIXES:
            name = name.removesuffix(suffix)
        named.add(name)
    return named


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_rules_name_only_metrics_the_daemon_exports() -> None:
    named = metrics_named(RULES.read_text())
    assert named and named <= set(exported())


def test_the_dashboard_names_only_metrics_the_daemon_exports() -> None:
    named = metrics_named("\n".join(dashboard_expressions()))
    assert named <= set(exported())
    shown = {"msgbus_messages_total", "msgbus_errors_total", "msgbus_round_trip_seconds"}
    assert shown | {"msgbus_queue_length", "msgbus_peers_down"} <= named


def test_the_dashboards_expressions_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses rules, not bare queries: each expression becomes a recording rule."""
    rules = []
    for index, expression in enumerate(dashboard_expressions()):
        for variable, value in GRAFANA_VARIABLES.items():
            expression = expression.replace(variable, value)
        rules.append({"record": f"dashboard:expression_{index}", "expr": expression})
    (tmp_path / "dashboard.yml").write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run(
        [promtool_binary(), "check", "rules", "dashboard.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dashboard_is_importable_with_any_prometheus() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert [item["name"] for item in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    sources = [panel["datasource"] for panel in panels] + [
        target["datasource"] for panel in panels for target in panel["targets"]
    ]
    assert all(source == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"} for source in sources)
    assert all('instance=~"$instance"' in expression for expression in dashboard_expressions())
