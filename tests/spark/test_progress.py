from __future__ import annotations

import io

import pytest

from spark.progress import Progress


def test_stage_lines_have_elapsed_time_counts_and_duration() -> None:
    ticks = iter([0.0, 1.0, 3.5, 4.0, 4.0])
    out = io.StringIO()
    progress = Progress(out, clock=lambda: next(ticks))
    with progress.stage("read events") as stage:
        stage.detail = "1,000 lines"
    with pytest.raises(RuntimeError), progress.stage("requests"):
        raise RuntimeError("boom")
    assert out.getvalue().splitlines() == [
        "[    3.5s] read events: 1,000 lines (2.5s)",
        "[    4.0s] requests: failed after 0.0s",
    ]
