"""Launch configs for tests: the arith test environment, the tiny model, CPU engine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ARITH_ENV = REPO / "tests" / "envs" / "arith_env.py"


def launch_config(run_dir: Path, steps: int = 4, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model": "tiny",
        "served_model_name": "tiny",
        "run_dir": str(run_dir),
        "seed": 0,
        "health_timeout_s": 120,
        "api": {"args": {"ephemeral": True}},
        "trainer": {
            "args": {
                "training_steps": steps,
                "batch_size": 8,
                "seq_len": 128,
                "vllm_restart_interval": 2,
                "inference_engine": "transformers",
                "num_threads": 1,
                "lr": 1e-3,
            }
        },
        "environments": [{"script": str(ARITH_ENV), "env": {"group_size": 4}}],
    }
    config.update(overrides)
    return config


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def descendants(root: int) -> set[int]:
    """Every live process below `root`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, stack = set(), [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


class LaunchRun:
    """`atropos-launch CONFIG` as a subprocess, with its whole process tree watched."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "atroposlib.cli.launch", str(config_path)],
            stdout=open(log_path, "wb"),
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        self.seen: set[int] = set()

    def watch(self) -> None:
        self.seen |= descendants(self.proc.pid)

    def wait(self, timeout: float = 300, until=None) -> int | None:
        """Wait for exit (or for `until()` to be true); records the tree meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.watch()
            if self.proc.poll() is not None:
                return self.proc.returncode
            if until is not None and until():
                return None
            time.sleep(0.3)
        self.proc.kill()
        raise AssertionError(f"launch did not finish in {timeout}s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def child_pid(self, pattern: str) -> int:
        for pid in descendants(self.proc.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if pattern in cmdline:
                return pid
        raise AssertionError(f"no child matches {pattern!r}")

    def leftovers(self) -> list[int]:
        time.sleep(0.5)
        return sorted(pid for pid in self.seen if alive(pid))


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
