"""Fixtures for `atropos-launch` tests; the helpers live in `tests/support/launch.py`."""

from __future__ import annotations

import pytest

from tests.support.launch import Launches


@pytest.fixture
def launch(tmp_path):
    """Starts launches for one test: `launch(config)`, or `launch(None, "--resume", dir)`."""
    launches = Launches(tmp_path)
    yield launches
    launches.stop()


@pytest.fixture(scope="module")
def module_launch(request, tmp_path_factory):
    """`launch` for a run several tests of one module read (a module-scoped fixture of
    that module starts it): its files under a directory of the module's name."""
    launches = Launches(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]))
    yield launches
    launches.stop()
