"""One supervised child of `atropos-launch`: its process, its log, its restarts.

Restarts back off 1, 2, 4, ... seconds (at most 30) while a child keeps
crashing; a child that ran for `STABLE_AFTER_S`, or made progress (the run trained a
step since it started), before crashing starts the back-off over, so a long run with a rare
crash never waits long. The restart budget (`max_restarts`) counts the same way:
crashes in a row, so a run of days is not ended by its fourth crash ever.

Output is read line by line by a thread that appends it to the child's own
log file in the run directory (kept whole) and hands it to a sink that prints
it with the child's coloured prefix as its `console` (a `ChildConsole`, which knows
which record a traceback's lines belong to) shows it. The process itself comes from
`atroposlib.utils.processes.spawn`, so it cannot outlive the launcher. Its
`WANDB_DIR` is the run directory (unless the launcher's own environment sets one),
so an environment's or a trainer's wandb files stay with the run instead of landing
in the working directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from atroposlib.launch.console import ChildConsole
from atroposlib.launch.plan import ProcessPlan
from atroposlib.utils.processes import log_tail, spawn, stop_group

Sink = Callable[["Child", str], None]
STABLE_AFTER_S = 60.0
MAX_BACKOFF_S = 30.0


def child_environment(run_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    """A child's environment: the launcher's, with unbuffered output, wandb's files in
    the run dir unless WANDB_DIR is set already, and the plan's own variables."""
    return {"WANDB_DIR": str(run_dir), **os.environ, "PYTHONUNBUFFERED": "1", **extra}


class Child:
    def __init__(self, plan: ProcessPlan, log_dir: Path, color: str, sink: Sink) -> None:
        self.plan = plan
        self.name = plan.name
        self.color = color
        self.sink = sink
        self.log_path = log_dir / f"{plan.name}.log"
        self.run_dir = log_dir.parent  # the launcher keeps the logs in <run_dir>/logs
        self.proc: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None
        self.restarts = 0
        self.crash_streak = 0  # crashes in a row without a stable run between them
        self.started_at = 0.0
        self.started_wall = 0.0
        self.stopped = False  # stopped by the launcher (its exit code says nothing)
        self.next_restart_at: float | None = None
        self.console = ChildConsole()

    def start(self, command: list[str] | None = None) -> None:
        command = command or self.plan.command
        if self.plan.fresh_seed:
            from atroposlib.inference.launcher import with_fresh_seed

            command = with_fresh_seed(command)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write(f"--- start: {' '.join(command)}\n")
        self.started_at = time.monotonic()
        self.started_wall = time.time()  # to compare with the files it writes
        self.console = ChildConsole()  # a new process: no record of the last one goes on
        self.proc = spawn(
            command,
            subprocess.PIPE,
            env=child_environment(self.run_dir, self.plan.env),
        )
        self.reader = threading.Thread(target=self._pump, daemon=True, name=f"log-{self.name}")
        self.reader.start()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path, "ab") as log:
            for raw in self.proc.stdout:
                log.write(raw)
                log.flush()
                self.sink(self, raw.decode(errors="replace").rstrip("\n"))

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def stop(self, grace_s: float, first: int = signal.SIGTERM) -> int | None:
        if self.proc is None:
            return None
        self.stopped = self.proc.poll() is None
        code = stop_group(self.proc, grace_s, first)
        if self.reader is not None:
            self.reader.join(timeout=5)
        return code

    def crashes_in_a_row(self, made_progress: bool = False) -> int:
        """Crashes before this one without a stable run or progress between them."""
        stable = made_progress or time.monotonic() - self.started_at >= STABLE_AFTER_S
        return 0 if stable else self.crash_streak

    def schedule_restart(self, made_progress: bool = False) -> float:
        """Back-off before the next restart (see the module docstring); its seconds."""
        self.crash_streak = self.crashes_in_a_row(made_progress)
        delay = min(MAX_BACKOFF_S, 2.0**self.crash_streak)
        self.crash_streak += 1
        self.next_restart_at = time.monotonic() + delay
        return delay

    def restart_due(self) -> bool:
        return self.next_restart_at is not None and time.monotonic() >= self.next_restart_at

    def restart(self, command: list[str] | None = None) -> None:
        self.restarts += 1
        self.next_restart_at = None
        self.start(command)

    def tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)
