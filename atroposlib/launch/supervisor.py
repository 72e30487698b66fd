"""Run a resolved `Plan`: start in dependency order, supervise, stop, report.

Order: API (wait for /health) -> standalone engine if any (wait) -> trainer
(wait for the /health of the engine it starts) -> environments. While the run
goes, an environment that crashes is restarted with back-off up to its
`max_restarts`; the trainer, the API or a standalone engine exiting is the end
of the run (success only when the trainer exits 0). Stopping goes in reverse
order; the trainer gets SIGINT first so it writes its final checkpoint. The
children run in their own sessions, so a Ctrl-C at the terminal reaches only
the launcher, which then stops them in this order.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from dataclasses import dataclass, field

import httpx
from rich.console import Console
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from atroposlib.launch.children import Child
from atroposlib.launch.plan import Plan
from atroposlib.launch.report import run_numbers, write_report
from atroposlib.launch.status import StatusReader

COLORS = ["cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan"]
STATUS_EVERY_S = 1.0
PLAIN_STATUS_EVERY_S = 15.0


class RunFailed(Exception):
    def __init__(self, child: Child, why: str) -> None:
        super().__init__(why)
        self.child, self.why = child, why


@dataclass
class Outcome:
    code: int
    message: str
    failed: Child | None = None
    notes: list[str] = field(default_factory=list)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


class Launcher:
    def __init__(self, plan: Plan, config_text: str, console: Console | None = None) -> None:
        self.plan = plan
        self.config_text = config_text
        self.console = console or Console(highlight=False)
        self.live: Live | None = None
        colors = itertools.cycle(COLORS)
        logs = plan.run_dir / "logs"
        make = lambda p: Child(p, logs, next(colors), self._print_line)  # noqa: E731
        self.api = make(plan.api)
        self.engine = make(plan.engine) if plan.engine else None
        self.trainer = make(plan.trainer)
        self.environments = [make(p) for p in plan.environments]
        self.width = max(len(c.name) for c in self.children)
        self.status = StatusReader(
            plan.api_url, plan.metrics_path, plan.events_path, plan.training_steps
        )

    @property
    def children(self) -> list[Child]:
        return [c for c in (self.api, self.engine, self.trainer, *self.environments) if c]

    # ----------------------------------------------------------------- output
    def _print_line(self, child: Child, line: str) -> None:
        prefix = Text(f"{child.name:<{self.width}} | ", style=child.color)
        self.console.print(prefix + Text(line), soft_wrap=True)

    def say(self, message: str, style: str = "bold") -> None:
        self.console.print(Text(f"[launch] {message}", style=style), soft_wrap=True)

    # ------------------------------------------------------------------- run
    def run(self) -> int:
        self.plan.run_dir.mkdir(parents=True, exist_ok=True)
        (self.plan.run_dir / "config.yaml").write_text(self.config_text)
        commands = {c.name: c.plan.command for c in self.children}
        (self.plan.run_dir / "commands.json").write_text(json.dumps(commands, indent=2))
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        started = time.monotonic()
        self.say(f"run directory: {self.plan.run_dir}")
        try:
            self._start_all()
            outcome = self._supervise()
        except RunFailed as failure:
            outcome = Outcome(1, f"{failure.child.name} {failure.why}", failure.child)
        except KeyboardInterrupt:
            outcome = Outcome(130, "interrupted; stopping every process")
        finally:
            if self.live is not None:
                self.live.stop()
        try:
            self.say(outcome.message, "bold green" if outcome.code == 0 else "bold red")
            self._stop_all()
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.status.close()
        self._finish(outcome, time.monotonic() - started)
        return outcome.code

    def _start_all(self) -> None:
        self._start(self.api)
        self._wait_healthy("api", self.api.plan.health_url, self.api)
        if self.engine is not None:
            self._start(self.engine)
            self._wait_healthy("engine", self.engine.plan.health_url, self.engine)
        self._start(self.trainer)
        if self.trainer.plan.health_url:
            self.say("waiting for the trainer's inference engine")
            self._wait_healthy("the trainer's engine", self.trainer.plan.health_url, self.trainer)
        for env in self.environments:
            self._start(env)

    def _start(self, child: Child) -> None:
        self.say(f"starting {child.name}")
        child.start()

    def _wait_healthy(self, label: str, url: str, watched: Child) -> None:
        deadline = time.monotonic() + self.plan.config.health_timeout_s
        while time.monotonic() < deadline:
            if not watched.alive():
                raise RunFailed(watched, f"exited with code {watched.returncode} while starting")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    self.say(f"{label} is healthy ({url})")
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RunFailed(watched, f"not healthy at {url} after {self.plan.config.health_timeout_s}s")

    def _supervise(self) -> Outcome:
        if self.console.is_terminal:
            self.live = Live(Text(""), console=self.console, refresh_per_second=4, transient=True)
            self.live.start()
        next_status, next_plain = 0.0, time.monotonic() + PLAIN_STATUS_EVERY_S
        while True:
            code = self.trainer.returncode
            if code is not None:
                if code == 0:
                    return Outcome(0, "the trainer finished; stopping the run")
                raise RunFailed(self.trainer, f"exited with code {code}")
            for critical in (self.api, self.engine):
                if critical is not None and not critical.alive():
                    raise RunFailed(critical, f"exited with code {critical.returncode}")
            for env in self.environments:
                self._supervise_env(env)
            now = time.monotonic()
            if now >= next_status:
                next_status = now + STATUS_EVERY_S
                line = self._status_line()
                if self.live is not None:
                    self.live.update(Text(line, style="bold"))
                elif now >= next_plain:
                    next_plain = now + PLAIN_STATUS_EVERY_S
                    self.say(line, "dim")
            time.sleep(0.2)

    def _supervise_env(self, env: Child) -> None:
        if env.alive():
            return
        if env.restart_due():
            self.say(f"restarting {env.name} (restart {env.restarts + 1}/{env.plan.max_restarts})")
            env.restart()
            return
        if env.next_restart_at is not None or env.returncode == 0:
            return  # waiting out the back-off, or finished on its own
        if env.restarts >= env.plan.max_restarts:
            raise RunFailed(
                env, f"crashed {env.restarts + 1} times (exit code {env.returncode}); giving up"
            )
        delay = env.schedule_restart()
        self.say(
            f"{env.name} crashed with exit code {env.returncode}; restarting in {delay:.0f}s",
            "bold yellow",
        )

    def _status_line(self) -> str:
        snap = self.status.read(sum(e.restarts for e in self.environments))
        return snap.line()

    # ------------------------------------------------------------------ stop
    def _stop_all(self) -> None:
        grace = self.plan.config.stop_grace_s
        for env in self.environments:
            env.stop(10, signal.SIGINT)
        self.trainer.stop(grace, signal.SIGINT)
        if self.engine is not None:
            self.engine.stop(15)
        self.api.stop(15)

    def _finish(self, outcome: Outcome, elapsed: float) -> None:
        report = None
        try:
            report = write_report(self.plan, self.config_text)
        except Exception as exc:  # noqa: BLE001 - a report problem must not hide the outcome
            self.say(f"could not write the report: {exc}", "bold red")
        lines = [f"{outcome.message} after {elapsed:.0f}s"]
        for child in self.children:
            restarts = f", {child.restarts} restarts" if child.restarts else ""
            how = " (stopped by the launcher)" if child.stopped else ""
            lines.append(f"  {child.name}: exit code {child.returncode}{how}{restarts}")
        numbers = run_numbers(self.plan)
        if numbers["steps"]:
            lines.append(f"  steps trained: {numbers['steps']}; {numbers['verdict']}")
        lines.append(
            f"  engine restarts: {numbers['engine_restarts']}; "
            f"checkpoints saved: {numbers['checkpoints_saved']}"
        )
        style = "green" if outcome.code == 0 and numbers.get("learned") is not False else "red"
        self.console.print(Panel("\n".join(lines), title="atropos-launch", border_style=style))
        if outcome.failed is not None:
            self.say(f"last lines of {outcome.failed.log_path}:", "bold red")
            self.console.print(Text(outcome.failed.tail()), soft_wrap=True)
        self.say(f"logs: {self.plan.run_dir / 'logs'}")
        if report is not None:
            self.say(f"report: {report}")
