"""`atropos-launch` in tests: configs for the arith env on the tiny model, and a watched run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from atroposlib.utils.processes import descendant_matching
from tests.support.process_tree import alive, descendants
from tests.support.processes import ARITH_ENV
from tests.support.source import REPO
from tests.support.waiting import wait_until

# how long the launcher's children may take to exit after it returned
LEFTOVER_GRACE_S = 10.0


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
            # as a terminal's Ctrl-C reaches it, even when the suite itself runs in a
            # shell's background job, which starts with SIGINT ignored
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.seen: set[int] = set()

    def watch(self) -> None:
        self.seen |= descendants(self.proc.pid)

    def wait(self, timeout: float = 300, until=None) -> int | None:
        """Wait for exit (or for `until()` to be true); records the tree meanwhile."""

        def outcome() -> tuple[int | None] | None:
            self.watch()
            if self.proc.poll() is not None:
                return (self.proc.returncode,)
            if until is not None and until():
                return (None,)
            return None

        try:
            (code,) = wait_until(outcome, timeout, "launch did not finish", poll_s=0.3)
        except AssertionError as failure:
            self.proc.kill()
            raise AssertionError(f"{failure}:\n{self.output()[-3000:]}") from None
        return code

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def child_pid(self, pattern: str) -> int:
        pid = descendant_matching(self.proc.pid, pattern)
        if pid is None:
            raise AssertionError(f"no child matches {pattern!r}")
        return pid

    def leftovers(self, grace_s: float = LEFTOVER_GRACE_S) -> list[int]:
        """Processes of this run still alive once they all exited or `grace_s` passed."""
        try:
            wait_until(lambda: not any(alive(pid) for pid in self.seen), grace_s, "leftovers")
        except AssertionError:
            pass
        return sorted(pid for pid in self.seen if alive(pid))
