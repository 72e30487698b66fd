"""Running the upstream-style env files of tests/compat/envs as real subprocesses.

Each env file is started exactly as an upstream user starts one
(`python env_file.py serve|process|evaluate --env.* --openai.*`), from a scratch
working directory, with the Hugging Face caches and wandb pointed into it so a run
leaves nothing behind and downloads nothing. The trainer stand-in is a plain HTTP
client: it registers like a trainer, then pulls batches from `/batch`.
The serve and process flows the compat tests share are functions here, so each
test file states only its env's flags and what it checks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ENVS = Path(__file__).resolve().parents[1] / "compat" / "envs"


def env_vars(workdir: Path, **extra: str) -> dict[str, str]:
    """The subprocess environment: offline caches and wandb under `workdir`."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(workdir / "hf-datasets"),
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(workdir),
        "WANDB_SILENT": "true",
        "TOKENIZERS_PARALLELISM": "false",
        **extra,
    }


def tiny_flags(tiny_model_path: Path, base_url: str, server_type: str = "openai") -> list[str]:
    """Tokenizer and inference server flags for a run against `base_url` (ending in /v1)."""
    return [
        *("--env.tokenizer_name", str(tiny_model_path)),
        *("--openai.base_url", base_url, "--openai.model_name", "tiny"),
        *("--openai.server_type", server_type, "--openai.api_key", "x"),
        *("--openai.timeout", "60"),
    ]


def run_env(
    script: str, command: str, workdir: Path, *args: str, timeout: float = 180, **extra: str
) -> subprocess.CompletedProcess:
    """`python tests/compat/envs/<script> COMMAND ARGS`, run to completion in `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, str(ENVS / script), command, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=workdir,
        env=env_vars(workdir, **extra),
    )


class ServingEnv:
    """`python tests/compat/envs/<script> serve ...` running in the background."""

    def __init__(self, script: str, workdir: Path, *args: str, **extra: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{Path(script).stem}-serve.log"
        self.proc = subprocess.Popen(
            [sys.executable, str(ENVS / script), "serve", *args],
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=env_vars(workdir, **extra),
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        """The exit code once it ends by itself (it fails the test after `timeout`)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            message = f"serve did not end by itself in {timeout}s:\n{self.log()[-6000:]}"
            raise AssertionError(message) from None

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait(10)
        return self.proc.returncode


def serve_flags(api_url: str, *extra: str) -> list[str]:
    return ["--env.rollout_server_url", api_url, "--slurm", "false", *extra]


def register_trainer(
    client: httpx.Client, batch_size: int, max_token_len: int = 2048, num_steps: int = 10
) -> None:
    """Register as the trainer does, then make the first /batch call that marks it started."""
    response = client.post(
        "/register",
        json={
            "wandb_group": "compat-group",
            "wandb_project": "compat-project",
            "batch_size": batch_size,
            "max_token_len": max_token_len,
            "checkpoint_dir": "",
            "save_checkpoint_interval": -1,
            "starting_step": 0,
            "num_steps": num_steps,
        },
    )
    response.raise_for_status()
    client.get("/batch")


def pull_batches(
    client: httpx.Client, count: int, env: ServingEnv, timeout: float = 150
) -> list[list[dict[str, Any]]]:
    """`count` batches from /batch, as a trainer takes them; fails with the env's log."""
    batches: list[list[dict[str, Any]]] = []
    deadline = time.monotonic() + timeout
    while len(batches) < count:
        batch = client.get("/batch").json()["batch"]
        if batch:
            batches.append(batch)
            continue
        if env.proc.poll() is not None:
            raise AssertionError(
                f"the env exited ({env.proc.returncode}) after {len(batches)}/{count} batches:"
                f"\n{env.log()[-6000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{len(batches)}/{count} batches in {timeout}s; env log:\n{env.log()[-6000:]}"
            )
        time.sleep(0.2)
    return batches


@contextmanager
def serving_to_trainer(
    api_url: str, script: str, workdir: Path, *args: str, batch_size: int, max_token_len: int
) -> Iterator[tuple[httpx.Client, ServingEnv]]:
    """A registered trainer stand-in and `script serve ARGS` feeding it; the env stops after."""
    with httpx.Client(base_url=api_url, timeout=30) as client:
        register_trainer(client, batch_size=batch_size, max_token_len=max_token_len)
        env = ServingEnv(script, workdir, *args)
        try:
            yield client, env
        finally:
            env.stop()


def serve_groups(
    api_url: str,
    script: str,
    workdir: Path,
    *args: str,
    batch_size: int,
    max_token_len: int,
    batches: int = 2,
) -> tuple[list[dict[str, Any]], ServingEnv]:
    """The groups of the first `batches` batches the served env sends, and the (stopped) env."""
    with serving_to_trainer(
        api_url, script, workdir, *args, batch_size=batch_size, max_token_len=max_token_len
    ) as (client, env):
        pulled = pull_batches(client, batches, env)
    return [group for batch in pulled for group in batch], env


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def failure(done: subprocess.CompletedProcess) -> str:
    """What to show when a run failed: the ends of its output."""
    return f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-6000:]}"


def run_env_ok(script: str, command: str, workdir: Path, *args: str) -> None:
    """`run_env`, failing the test with the run's output unless it exits 0."""
    done = run_env(script, command, workdir, *args)
    if done.returncode != 0:
        raise AssertionError(failure(done))


def process_groups(script: str, workdir: Path, *args: str, groups_file: str) -> list[dict]:
    """`script process ARGS` run to success in `workdir`; the groups it wrote to `groups_file`."""
    run_env_ok(script, "process", workdir, *args, "--env.data_path_to_save_groups", groups_file)
    return read_jsonl(workdir / groups_file)
