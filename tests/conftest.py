"""Shared fixtures: real `run-api` and inference server processes on free 127.0.0.1 ports.

The classes behind them live in `tests/support/processes.py`; this file holds fixtures only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.inprocess_api import inprocess_api
from tests.support.processes import ApiProcess, InferenceProcess

pytest_plugins = [
    "tests.support.tiers",  # each test's tier, and the unit tier's guard
    "tests.support.tier_report",  # per-tier totals and --tier-durations
    "tests.support.scheduling",  # which module an xdist worker takes next
]


@pytest.fixture
def api_factory(tmp_path: Path) -> Iterator:
    started: list[ApiProcess] = []

    def make(*extra: str, state_dir: Path | None = None, start: bool = True) -> ApiProcess:
        api = ApiProcess(state_dir or tmp_path / f"state{len(started)}", *extra)
        started.append(api)
        return api.start() if start else api

    yield make
    for api in started:
        api.stop()


@pytest.fixture
def api(api_factory) -> ApiProcess:
    return api_factory()


@pytest.fixture
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[httpx.Client]:
    """The API in-process on a fresh store (unit tier); `wire_client` for a real run-api."""
    if {"api", "api_factory"} & set(request.fixturenames):
        pytest.fail("`client` is an in-process API, not the `api` process: use `wire_client`")
    with inprocess_api(tmp_path / "state") as c:
        yield c


@pytest.fixture
def wire_client(api: ApiProcess) -> Iterator[httpx.Client]:
    """A client of the `api` fixture's real `run-api` process, over loopback."""
    with httpx.Client(base_url=api.url, timeout=30) as c:
        yield c


@pytest.fixture
def fresh_wandb(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """wandb in offline mode (no key), its process-wide service and settings torn down
    before and after: a run started by another test in this process (an xdist worker runs
    many) would otherwise keep its directory and service for the next one. Its console
    capture is off: it wraps the stream's `write`, and a wrapper left on pytest's stderr
    after teardown turned a later test's log lines into 'error in stderr callback' records."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    wandb.teardown()
    yield wandb
    wandb.teardown()


os.environ.pop("ATROPOS_API_KEY", None)  # a developer's key must not leak into tests


# The tiny model is built from an empty cache in every test session, so a machine on which
# the build fails turns the suite red instead of reusing a model built elsewhere. Set
# ATROPOS_TEST_CACHE_DIR to keep one between local runs. Subprocesses inherit the variable,
# and so do pytest-xdist's workers: the controller (or a plain pytest) makes the directory
# and removes it at the end, and the workers share it, so one of them builds the model
# under the kit's file lock while the other waits for it.
SESSION_CACHE = None
if not os.environ.get("ATROPOS_TEST_CACHE_DIR") and "PYTEST_XDIST_WORKER" not in os.environ:
    SESSION_CACHE = tempfile.mkdtemp(prefix="atropos-test-cache-")
    os.environ["ATROPOS_TEST_CACHE_DIR"] = SESSION_CACHE
os.environ["ATROPOS_CACHE_DIR"] = os.environ["ATROPOS_TEST_CACHE_DIR"]


def pytest_sessionfinish(session, exitstatus) -> None:
    if SESSION_CACHE:
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model_path():
    """The tiny model kit's default model, built once per test session (see above)."""
    pytest.importorskip("torch")
    from atroposlib.utils.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="session")
def quick_vlm_path():
    """A tiny VLM from a few build steps (tests/support/vision.py), once per session."""
    pytest.importorskip("torch")
    from atroposlib.utils.tiny_model import ensure_built
    from atroposlib.utils.tiny_vlm import build_tiny_vlm
    from tests.support.vision import QUICK_VLM

    def build(out):
        return build_tiny_vlm(out, QUICK_VLM, verify=False)

    return ensure_built(f"quick-{QUICK_VLM.cache_key()}", build)


@pytest.fixture(scope="session")
def inference_server(tiny_model_path, tmp_path_factory) -> Iterator[InferenceProcess]:
    server = InferenceProcess(tiny_model_path, tmp_path_factory.mktemp("inference"))
    yield server
    server.stop()
