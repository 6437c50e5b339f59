"""The shipped Prometheus alert rules: valid for Prometheus's own tool, the main alerts fire when they
should (their unit tests), and they name only metrics the daemon exports."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.test_metrics_catalogue import exported

MONITORING = Path(__file__).resolve().parent.parent / "monitoring"
RULES = MONITORING / "msgbus-alerts.yml"
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
    assert "SUCCESS: 6 rules found" in checked.stdout


def test_the_main_alerts_fire_when_they_should_and_only_then() -> None:
    tested = promtool("test", "rules", "msgbus-alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_rules_name_only_metrics_the_daemon_exports() -> None:
    named = set(re.findall(r"\bmsgbus_[a-z_]+", RULES.read_text()))
    series = set()
    for name in named:
        for suffix in HISTOGRAM_SUFFIXES:
            name = name.removesuffix(suffix)
        series.add(name)
    assert series and series <= set(exported())
