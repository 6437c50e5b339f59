"""Reading event logs back in tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_events(directory: Path) -> list[dict[str, Any]]:
    """Every event line of every file in ``directory``, file by file in name order."""
    paths = sorted(directory.glob("events-*.jsonl"))
    return [json.loads(line) for path in paths for line in path.read_text().splitlines()]
