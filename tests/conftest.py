"""Shared fixtures: real `run-api` processes on free 127.0.0.1 ports."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ApiProcess:
    """A `run-api` subprocess that tests can kill -9 and restart on the same state."""

    def __init__(self, state_dir: Path, *extra: str, port: int | None = None) -> None:
        self.state_dir = state_dir
        self.extra = list(extra)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log_path = state_dir.parent / f"run-api-{self.port}.log"

    def start(self, timeout: float = 20.0) -> ApiProcess:
        cmd = [
            sys.executable,
            "-m",
            "atroposlib.cli.run_api",
            "--port",
            str(self.port),
            "--state-dir",
            str(self.state_dir),
            *self.extra,
        ]
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"run-api exited early:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise TimeoutError(f"run-api did not become healthy:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


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
def client(api: ApiProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=30) as c:
        yield c


os.environ.pop("ATROPOS_API_KEY", None)  # a developer's key must not leak into tests


# The tiny model is built from an empty cache in every test session, so a machine on which
# the build fails turns the suite red instead of reusing a model built elsewhere. Set
# ATROPOS_TEST_CACHE_DIR to keep one between local runs. Subprocesses inherit the variable.
SESSION_CACHE = (
    None
    if os.environ.get("ATROPOS_TEST_CACHE_DIR")
    else tempfile.mkdtemp(prefix="atropos-test-cache-")
)
os.environ["ATROPOS_CACHE_DIR"] = os.environ.get("ATROPOS_TEST_CACHE_DIR") or SESSION_CACHE


def pytest_sessionfinish(session, exitstatus) -> None:
    if SESSION_CACHE:
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model_path():
    """The tiny model kit's default model, built once per test session (see above)."""
    pytest.importorskip("torch")
    from atroposlib.utils.tiny_model import ensure_tiny_model

    return ensure_tiny_model()


class InferenceProcess:
    """An `atropos-inference-server` subprocess serving a local model."""

    def __init__(
        self, model_path, log_dir: Path, name: str = "tiny", *extra: str, port: int | None = None
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = name
        self.log_path = log_dir / f"inference-{self.port}.log"
        cmd = [
            sys.executable,
            "-m",
            "atroposlib.cli.inference_server",
            "--model",
            str(model_path),
            "--port",
            str(self.port),
            "--served-model-name",
            name,
            "--num-threads",
            "1",
            *extra,
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"inference server exited:\n{self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"inference server not healthy:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="session")
def inference_server(tiny_model_path, tmp_path_factory) -> Iterator[InferenceProcess]:
    server = InferenceProcess(tiny_model_path, tmp_path_factory.mktemp("inference"))
    yield server
    server.stop()
