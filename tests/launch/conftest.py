"""Fixtures for `atropos-launch` tests; the helpers live in `tests/support/launch.py`."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.launch import LaunchRun, write_config


@pytest.fixture
def launch(tmp_path):
    runs: list[LaunchRun] = []

    def start(config: dict[str, Any] | None = None, *arguments: str) -> LaunchRun:
        """A launch of `config` (written to a file), or with `arguments` alone (--resume)."""
        if config is not None:
            path = write_config(tmp_path / f"launch{len(runs)}.yaml", config)
            arguments = (str(path), *arguments)
        run = LaunchRun(list(arguments), tmp_path / f"launch{len(runs)}.out")
        runs.append(run)
        return run

    yield start
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
