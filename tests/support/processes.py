"""The real servers tests run as subprocesses: run-api, the inference server, the arith env."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from atroposlib.utils.ports import free_port
from atroposlib.utils.waiting import answers_200
from tests.support.waiting import wait_until

ARITH_ENV = Path(__file__).resolve().parent / "arith_env.py"


def answers_health(url: str, proc: subprocess.Popen, log, what: str) -> bool:
    """True once GET url/health answers 200; raises RuntimeError if the process has exited."""
    if proc.poll() is not None:
        raise RuntimeError(f"{what} exited early:\n{log()}")
    return answers_200(f"{url}/health", timeout_s=1)


def answers_as_run_api(url: str, proc: subprocess.Popen, log) -> bool:
    """`answers_health`, and the answer is run-api's own (its store named): another
    test's server that took the port first would answer 200 too, while this run-api
    was still importing, before it found the port taken."""
    if proc.poll() is not None:
        raise RuntimeError(f"run-api exited early:\n{log()}")
    try:
        answer = httpx.get(f"{url}/health", timeout=1)
        return answer.status_code == 200 and "store" in answer.json()
    except (httpx.HTTPError, ValueError):
        return False


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
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(
                lambda: answers_as_run_api(self.url, self.proc, self.log),
                timeout,
                "run-api did not become healthy",
            )
        except AssertionError as failure:
            raise AssertionError(f"{failure}:\n{self.log()}") from None
        return self

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


class ServerProcess:
    """A server subprocess logging to `log_path`, up once its /health answers."""

    url: str
    log_path: Path
    proc: subprocess.Popen

    def start(
        self, command: list[str], what: str, timeout_s: float, env: dict | None = None
    ) -> None:
        self.proc = subprocess.Popen(
            command, stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT, env=env
        )
        try:
            wait_until(
                lambda: answers_health(self.url, self.proc, self.log, what),
                timeout_s,
                f"{what} not healthy",
            )
        except (AssertionError, RuntimeError) as failure:
            self.stop()
            raise AssertionError(f"{failure}:\n{self.log()}") from None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class InferenceProcess(ServerProcess):
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
        self.start(cmd, "inference server", 120)


class EnvProcess:
    """`python tests/support/arith_env.py COMMAND ARGS...`, with its env state under tmp_path."""

    def __init__(self, tmp_path: Path, command: str, *args: str) -> None:
        self.log_path = tmp_path / f"env-{command}-{time.monotonic_ns()}.log"
        env = {**os.environ, "ATROPOS_ENV_STATE_DIR": str(tmp_path / "env-state")}
        self.proc = subprocess.Popen(
            [sys.executable, str(ARITH_ENV), command, *args],
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
            env=env,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def serve_args(api_url: str, inference_url: str, *extra: str) -> list[str]:
    """Flags for `arith_env.py serve` against a run-api and an OpenAI-compatible engine."""
    return [
        "--env.rollout_server_url",
        api_url,
        "--openai.base_url",
        f"{inference_url}/v1",
        "--env.ensure_scores_are_not_same",
        "false",
        *extra,
    ]
