"""`atropos-launch` in tests: configs for the arith env on the tiny model, a watched run,
and its console as a person reads it in an 80-column terminal."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from atroposlib.utils.processes import descendant_matching
from tests.support.pace import Pace
from tests.support.process_tree import alive, descendants
from tests.support.processes import ARITH_ENV
from tests.support.source import REPO
from tests.support.waiting import wait_until

# how long the launcher's children may take to exit after it returned
LEFTOVER_GRACE_S = 10.0
COLUMNS = 80
# a child's step line ("arith_env | step 3: accuracy ...", "trainer | step 3/4 score ...")
# and the launcher's status line ("[launch] step 3/4 | ETA 5s | ...")
STEP_LINE = re.compile(r"^(?P<child>\S+)\s+\| step \d+(?::|/\d+ )")
STATUS_LINE = re.compile(r"^\[launch\] step (?:\d+|-)/\d+ \| ETA ")
# a child's lines for events that name servers or paths: short, the detail in its log file
EVENT_LINE = re.compile(
    r"^\S+\s+\| (?:.*inference server|\d+ unfinished items saved to |still waiting for an)"
)


LAUNCHED_AS_SHIPPED = (
    "quickstart_cpu.yaml",
    "agent_proxy_cpu.yaml",
    "quickstart_fsdp_cpu.yaml",
    "mix_cpu.yaml",
    "distill_cpu.yaml",
    "verifiers_cpu.yaml",
    "multimodal_cpu.yaml",
    "replay_cpu.yaml",
)
"""The configs in configs/ that e2e tests launch from their files, as a user does
(tests/launch/test_learning.py, test_mix_config.py, test_integrations.py,
test_multimodal.py; replay_cpu.yaml on the quickstart's run, in test_learning.py): the
launcher's checks included."""


def shipped(name: str) -> dict[str, Any]:
    """configs/NAME as a dict, its environments' scripts as absolute paths (so that it
    can be changed and written elsewhere)."""
    config = yaml.safe_load((REPO / "configs" / name).read_text())
    for env in config.get("environments", []):
        env["script"] = str((REPO / "configs" / env["script"]).resolve())
    return config


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
    """`atropos-launch ARGS` (a config's path, or --resume RUN_DIR) as a subprocess, with
    its whole process tree watched."""

    def __init__(self, arguments: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "atroposlib.cli.launch", *arguments],
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

    def pace(self, run_dir: Path) -> Pace:
        """The pace of this launch's trainer, measured from the launch (tests/support/pace.py)."""
        return Pace(run_dir / "checkpoints" / "metrics.jsonl", started=self.started)

    def wait(
        self,
        timeout: float = 300,
        until=None,
        *,
        pace: Pace | None = None,
        steps: int = 0,
        restarts: int = 0,
    ) -> int | None:
        """Wait for exit (or for `until()` to be true); records the tree meanwhile. With a
        `pace`, the wait is allowed what `steps` steps and `restarts` restarts cost at the
        run's own pace instead of `timeout`."""

        def outcome() -> tuple[int | None] | None:
            self.watch()
            if self.proc.poll() is not None:
                return (self.proc.returncode,)
            if until is not None and until():
                return (None,)
            return None

        try:
            if pace is None:
                (code,) = wait_until(outcome, timeout, "launch did not finish", poll_s=0.3)
            else:
                what = "launch did not finish"
                (code,) = pace.wait(outcome, what, steps, restarts, poll_s=0.3)
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


class Launches:
    """Starts `atropos-launch` runs with their files under `base`, and kills what is
    still running at `stop()`: the `launch` fixture's (one test) and the
    `module_launch` fixture's (a run that several tests of a module read)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.runs: list[LaunchRun] = []

    def __call__(self, config: dict[str, Any] | None = None, *arguments: str) -> LaunchRun:
        """A launch of `config` (written to a file), or with `arguments` alone (--resume)."""
        index = len(self.runs)
        if config is not None:
            path = write_config(self.base / f"launch{index}.yaml", config)
            arguments = (str(path), *arguments)
        run = LaunchRun(list(arguments), self.base / f"launch{index}.out")
        self.runs.append(run)
        return run

    def stop(self) -> None:
        for run in self.runs:
            if run.proc.poll() is None:
                run.proc.kill()


def console_rows(line: str, columns: int = COLUMNS) -> int:
    """Rows `line` takes in a terminal `columns` wide (the launcher never wraps a line)."""
    return max(1, math.ceil(len(line) / columns))


def check_the_console(output: str, env: str, steps: int) -> float:
    """The console of a finished run reads as one line per event: every environment and
    trainer step line fits one 80-column row, and so do the lines of an engine restart and
    of the items saved at the stop; the trainer printed one line per step; no numpy reprs,
    whole metrics dicts or tracebacks. Returns the share of rows, up to the final panel,
    that step and status lines take."""
    lines = output.splitlines()
    scrolled = lines[: next((i for i, x in enumerate(lines) if x.startswith("╭")), len(lines))]
    found = [(line, STEP_LINE.match(line)) for line in scrolled]
    env_steps = [line for line, m in found if m and m["child"] == env]
    trainer_steps = [line for line, m in found if m and m["child"] == "trainer"]
    assert env_steps, f"no step line of {env}:\n{output[-3000:]}"
    assert all(console_rows(line) == 1 for line in env_steps), env_steps
    assert len(trainer_steps) == steps, trainer_steps
    assert all(console_rows(line) == 1 for line in trainer_steps), trainer_steps
    assert "np.float64" not in output and "metrics: {" not in output, output[-3000:]
    # a run that goes well shows no traceback (a DEBUG record's never shows), and a line
    # for an engine restart or the items saved at the stop fits one row
    assert not [line for line in scrolled if "Traceback" in line], output[-3000:]
    events = [line for line in scrolled if EVENT_LINE.match(line)]
    assert all(console_rows(line) == 1 for line in events), events
    counted = [line for line, m in found if m or STATUS_LINE.match(line)]
    return sum(map(console_rows, counted)) / sum(map(console_rows, scrolled))


@dataclass
class Finished:
    """A launch that ran to its end, and what it left for the tests that read it."""

    run: LaunchRun
    run_dir: Path
    code: int | None
    leftovers: list[int]  # processes alive once the launcher exited (and a grace)

    def output(self) -> str:
        return self.run.output()

    def numbers(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def log(self, name: str) -> str:
        return (self.run_dir / "logs" / f"{name}.log").read_text()


def launched_clean(launches: Any, config: dict, name: str, steps: int) -> Finished:
    """`config` launched from a file under `launches.base` (a `module_launch`), run to its
    end: it must exit 0 and leave no process behind."""
    root = launches.base
    run_dir = root / "run"
    path = write_config(root / f"{name}.yaml", config)
    finished = finish(launches(None, str(path), "--run-dir", str(run_dir)), run_dir, steps)
    assert finished.code == 0, finished.run.output()[-4000:]
    assert finished.leftovers == []
    return finished


def finish(run: LaunchRun, run_dir: Path, steps: int) -> Finished:
    """Wait for `run` to end, allowed what its start, `steps` steps and its report cost
    at its own pace (tests/support/pace.py)."""
    code = run.wait(pace=run.pace(run_dir), steps=steps, restarts=2)
    return Finished(run, run_dir, code, run.leftovers())


def trend(scores: list[float]) -> tuple[float, float]:
    """The least-squares line through the per-step scores: the rise it makes over the
    run, and its slope's t statistic (the slope over its standard error, from the
    scatter of the scores about the line)."""
    n = len(scores)
    slope, intercept = statistics.linear_regression(range(n), scores)
    spread = sum((step - (n - 1) / 2) ** 2 for step in range(n))
    residuals = [s - intercept - slope * step for step, s in enumerate(scores)]
    error = math.sqrt(sum(r * r for r in residuals) / (n - 2) / spread)
    if not error:  # the scores lie on the line
        return slope * (n - 1), math.copysign(math.inf, slope) if slope else 0.0
    return slope * (n - 1), slope / error


def role_key(run_key: str, role: str) -> str:
    """A launched run's key for `role` ("env", "engine"), as docs/security.md defines it:
    HMAC-SHA256 of the role, keyed by the run's key."""
    import hashlib
    import hmac

    return hmac.new(run_key.encode(), role.encode(), hashlib.sha256).hexdigest()
