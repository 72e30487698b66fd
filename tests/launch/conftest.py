"""Fixtures for `atropos-launch` tests; the helpers live in `tests/support/launch.py`."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.launch import LaunchRun, write_config


@pytest.fixture
def launch(tmp_path):
    runs: list[LaunchRun] = []

    def start(config: dict[str, Any]) -> LaunchRun:
        path = write_config(tmp_path / f"launch{len(runs)}.yaml", config)
        run = LaunchRun(path, tmp_path / f"launch{len(runs)}.out")
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
