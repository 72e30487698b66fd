"""Run a resolved `Plan`: start in dependency order, supervise, stop, report.

Order: API (wait for /health) -> standalone engine if any (wait) -> trainer
(wait for the /health of the engine it starts) -> environments, and a replay of a
stored run's groups (`replay:`), which is done when it exits 0. While the run
goes, every child that dies is started again after a back-off, up to its
`max_restarts`, and each restart is announced and counted:

- the API on its durable store (an ephemeral API cannot be: its crash ends the run);
- the trainer with `--resume` and its latest checkpoint (the contract's
  `checkpoint_saved` events); the API serves it the batches after that checkpoint
  again, so no group is skipped or trained twice;
- a standalone engine as it was started (the trainer restarts its own engine);
- environments as they were started; their spools keep what they produced.

The others ride through a restart: env clients spool and retry, the trainer
waits on /batch, and both find their registrations in the API's store. The run
ends when the trainer exits 0 (success), when a child's budget is spent, or when
a child exits 2 (`FINAL_EXIT_CODE`: bad flags, a refusal, something a restart
repeats); the message quotes the cause. Stopping goes in reverse order; the
trainer gets SIGINT first so it writes its final checkpoint. The children run in
their own sessions, so a Ctrl-C at the terminal reaches only the launcher, which
then stops them in this order.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from atroposlib.launch.children import Child
from atroposlib.launch.config import effective_text, redacted_text
from atroposlib.launch.console import key_line
from atroposlib.launch.final_eval import final_evaluations
from atroposlib.launch.plan import KEY_FILE, Plan
from atroposlib.launch.report import (
    forked_from_line,
    panel_lines,
    report_command,
    run_numbers,
    write_report,
)
from atroposlib.launch.report_data import final_checkpoint, read_run
from atroposlib.launch.report_html import loading_lines
from atroposlib.launch.resume import LaunchRecord, resume_command, write_record
from atroposlib.launch.status import StatusReader
from atroposlib.trainer_contract import FINAL_EXIT_CODE, EventKind, read_events, read_metrics
from atroposlib.utils.waiting import WaitTimeout, answers_200, poll_until

COLORS = ["cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan"]
STATUS_EVERY_S = 1.0
PLAIN_STATUS_EVERY_S = 15.0
SAID = "[launch] "


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


CLEAN_STOP_CODES = (0, -signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGINT, 128 + signal.SIGTERM)
"""Exit codes of a process that stopped as asked: nothing to report but the stop."""


def ended(child: Child) -> str:
    """How a child ended, for the closing panel."""
    code = child.returncode
    if child.stopped:
        unusual = "" if code in CLEAN_STOP_CODES else f", exit code {code}"
        return f"stopped by the launcher{unusual}"
    return f"exit code {code}"


CAUSE_WIDTH = 200


def last_line(text: str) -> str:
    """The last line a process printed (not the launcher's `--- start:` line), shortened:
    what a refusal said, for the run's cause."""
    said = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in said if not line.startswith("--- start: ")]
    return said[-1][:CAUSE_WIDTH] if said else ""


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


class Launcher:
    """Runs one `Plan`: starts the processes in order, restarts the ones that die, stops
    them all, and writes the report. The console shows one line per event that matters."""

    def __init__(self, plan: Plan, record: LaunchRecord, console: Console | None = None) -> None:
        self.plan = plan
        self.record = record
        # what the run dir and report show: the YAML with its --set overrides, redacted
        self.config_text = redacted_text(effective_text(record.config, record.sets))
        self.console = console or Console(highlight=False)
        self.live: Live | None = None
        colors = itertools.cycle(COLORS)
        logs = plan.run_dir / "logs"
        make = lambda p: Child(p, logs, next(colors), self._print_line)  # noqa: E731
        self.api = make(plan.api)
        self.engine = make(plan.engine) if plan.engine else None
        self.teacher = make(plan.teacher) if plan.teacher else None
        self.trainer = make(plan.trainer)
        # an evaluate-only environment runs after the trainer (final_eval.py), not as a child
        self.environments = [make(p) for p in plan.environments if not p.evaluate_only]
        self.replay = make(plan.replay) if plan.replay else None
        self.width = max(len(c.name) for c in self.children)
        self.status = StatusReader(
            plan.api_url, plan.metrics_path, plan.events_path, plan.training_steps, plan.key
        )

    @property
    def children(self) -> list[Child]:
        every = (self.api, self.engine, self.teacher, self.trainer, *self.environments)
        return [c for c in (*every, self.replay) if c]

    def _write_key(self) -> None:
        """The run's key, readable by its owner only: for view-run and other clients."""
        if self.plan.key is None:
            return
        path = self.plan.run_dir / KEY_FILE
        path.unlink(missing_ok=True)  # a resumed run gets a fresh key, like every launch
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(self.plan.key + "\n")
        self.say(key_line(path))

    # ----------------------------------------------------------------- output
    def _print_line(self, child: Child, line: str) -> None:
        shown = child.console.shown(line)
        if shown is None:
            return
        prefix = Text(f"{child.name:<{self.width}} | ", style=child.color)
        self.console.print(prefix + Text(shown), soft_wrap=True)

    def say(self, message: str, style: str = "bold") -> None:
        self.console.print(Text(f"{SAID}{message}", style=style), soft_wrap=True)

    # ------------------------------------------------------------------- run
    def run(self) -> int:
        """Run to the end; the exit code. What the run writes (groups, logs, weights) is
        its user's alone: the umask that every child inherits is 077 (RUN-A)."""
        previous = os.umask(0o077)
        try:
            return self._run()
        finally:
            os.umask(previous)

    def _run(self) -> int:
        self.plan.run_dir.mkdir(parents=True, exist_ok=True)
        self.plan.run_dir.chmod(0o700)
        (self.plan.run_dir / "config.yaml").write_text(self.config_text)
        if self.plan.resumed:  # the report marks where the run went on
            self.record.resumed_at.append(self._trained_steps())
        write_record(self.plan.run_dir, self.record)
        for name, text in self.plan.files.items():
            (self.plan.run_dir / name).write_text(text)
        self._write_key()
        # the evaluate-only environments' too (their `evaluate` runs after the trainer)
        commands = {p.name: p.command for p in self.plan.processes}
        (self.plan.run_dir / "commands.json").write_text(json.dumps(commands, indent=2))
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        # SIGINT too: a launch started in the background from a script inherits it
        # ignored, and Python then installs no Ctrl-C handler of its own
        previous_int = signal.signal(signal.SIGINT, _raise_interrupt)
        started = time.monotonic()
        resuming = "resuming the run in" if self.plan.resumed else "run directory:"
        self.say(f"{resuming} {self.plan.run_dir}")
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
            signal.signal(signal.SIGINT, previous_int)
            self.status.close()
        if outcome.code == 0:
            self._evaluate_the_final_checkpoint()
        self._finish(outcome, time.monotonic() - started)
        return outcome.code

    def _evaluate_the_final_checkpoint(self) -> None:
        """The eval curves' last point (launch/final_eval.py); a Ctrl-C skips it."""
        final = final_checkpoint(self.plan.checkpoints, read_events(self.plan.events_path))
        try:
            final_evaluations(self.plan, final, self.say)
        except KeyboardInterrupt:
            self.say("the final evaluation was skipped (interrupted)", "bold red")

    def _start_all(self) -> None:
        # the api's and an engine's plans always name a health URL (plan._api_plan, _engine_plan)
        assert self.api.plan.health_url is not None
        self._start(self.api)
        self._wait_healthy("api", self.api.plan.health_url, self.api)
        for engine in (self.engine, self.teacher):  # the launcher's own engines
            if engine is not None:
                assert engine.plan.health_url is not None
                self._start(engine)
                self._wait_healthy(engine.name, engine.plan.health_url, engine)
        if self.plan.resumed:
            command, checkpoint = self._resume_command()
            self.say(f"the trainer resumes from {checkpoint or 'step 0 (no checkpoint yet)'}")
            self._start(self.trainer, command)
        else:
            if self.plan.start_from is not None:
                self.say(f"the trainer starts from {self.plan.start_from} (a fork)")
            self._start(self.trainer)
        # environments start beside the trainer: their start-up (imports, tokenizer) overlaps
        # the trainer's and its engine's, and they sample nothing before the trainer's first
        # /batch, which comes after its engine is up
        for env in self.environments:
            self._start(env)
        if self.replay is not None:  # posts into the API as an environment does
            self._start(self.replay)
        if self.trainer.plan.health_url:
            self.say("waiting for the trainer's inference engine")
            self._wait_healthy("the trainer's engine", self.trainer.plan.health_url, self.trainer)

    def _start(self, child: Child, command: list[str] | None = None) -> None:
        self.say(f"starting {child.name}")
        child.start(command)

    def _wait_healthy(self, label: str, url: str, watched: Child) -> None:
        def up() -> bool:
            if not watched.alive():
                raise RunFailed(watched, f"exited with code {watched.returncode} while starting")
            return answers_200(url)

        timeout = self.plan.config.health_timeout_s
        try:
            poll_until(up, timeout, f"{label} not healthy at {url}", interval_s=0.3)
        except WaitTimeout:
            raise RunFailed(watched, f"not healthy at {url} after {timeout}s") from None
        self.say(f"{label} is healthy ({url})")

    def _supervise(self) -> Outcome:
        if self.console.is_terminal:
            self.live = Live(Text(""), console=self.console, refresh_per_second=4, transient=True)
            self.live.start()
        next_status, next_plain = 0.0, time.monotonic() + PLAIN_STATUS_EVERY_S
        while True:
            if self.trainer.returncode == 0 and self._trainer_finished():
                return Outcome(0, "the trainer finished; stopping the run")
            for child in self.children:
                self._supervise_child(child)
            now = time.monotonic()
            if now >= next_status:
                next_status = now + STATUS_EVERY_S
                line = self._status_line(self.console.width - (0 if self.live else len(SAID)))
                if self.live is not None:
                    self.live.update(Text(line, style="bold"))
                elif now >= next_plain:
                    next_plain = now + PLAIN_STATUS_EVERY_S
                    self.say(line, "dim")
            time.sleep(0.2)

    def _supervise_child(self, child: Child) -> None:
        if child.alive():
            return
        if child.restart_due():
            command, how = None, ""
            if child is self.trainer:
                command, checkpoint = self._resume_command()
                how = f" from {checkpoint}" if checkpoint else " from step 0 (no checkpoint yet)"
            self.say(
                f"restarting {child.name}{how} (restart {child.crash_streak}/"
                f"{child.plan.max_restarts} in a row)",
                "bold yellow",
            )
            child.restart(command)
            return
        if child.next_restart_at is not None:
            return  # waiting out the back-off
        code = child.returncode
        if code == 0 and child.plan.done_at_exit_0:
            return  # finished its share on its own
        if code == FINAL_EXIT_CODE:
            cause = last_line(child.tail(5))
            raise RunFailed(
                child,
                f"exited with code {code}: a restart would fail the same way"
                + (f" ({cause})" if cause else ""),
            )
        if child.plan.not_restartable:
            raise RunFailed(child, f"exited with code {code}; {child.plan.not_restartable}")
        progress = self._trained_since_start(child)
        in_a_row = child.crashes_in_a_row(progress)
        if in_a_row >= child.plan.max_restarts:
            raise RunFailed(
                child,
                f"crashed {in_a_row + 1} time{'s' if in_a_row else ''} in a row (exit code "
                f"{code}); its restart budget ({child.plan.max_restarts}) is spent, giving up",
            )
        delay = child.schedule_restart(made_progress=progress)
        what = f"crashed with exit code {code}"
        if code == 0:  # the trainer, before its last step: a SIGINT or SIGTERM from outside
            what = (
                f"stopped at step {self._trained_steps()} of {self.plan.training_steps} with "
                "exit code 0 (interrupted from outside?)"
            )
        self.say(f"{child.name} {what}; restarting in {delay:.0f}s", "bold yellow")

    def _trained_steps(self) -> int:
        rows = read_metrics(self.plan.metrics_path)
        return max((row.step for row in rows), default=self.plan.start_step)

    def _trainer_finished(self) -> bool:
        """Exit 0 ends the run only after the last step: a trainer stopped by a signal
        from outside also checkpoints and exits 0, and is resumed like a crash."""
        return self._trained_steps() >= self.plan.training_steps

    def _trained_since_start(self, child: Child) -> bool:
        """The run trained a step since `child` last started: it is not in a crash loop
        (a trainer that finished a step; an API or environment the run went on with)."""
        try:
            return self.plan.metrics_path.stat().st_mtime >= child.started_wall
        except OSError:
            return False

    def _resume_command(self) -> tuple[list[str], str | None]:
        """The trainer's command, resuming from its newest checkpoint that still exists,
        and that checkpoint. With none yet, the trainer starts over from step 0: the API
        still keeps every batch it was served (api/runs.py), and serves them again."""
        command = list(self.trainer.plan.command)
        if "--resume" in command:  # a run that itself resumed: the newer checkpoint wins
            at = command.index("--resume")
            del command[at : at + 2]
        saved = [
            event.detail.get("path")
            for event in read_events(self.plan.events_path)
            if event.kind is EventKind.CHECKPOINT_SAVED
        ]
        latest = next((p for p in reversed(saved) if p and Path(p).is_dir()), None)
        if latest is None:  # none of its own yet: as first started, resuming or not
            original = self.trainer.plan.command
            resumed = original[original.index("--resume") + 1] if "--resume" in original else None
            return original, resumed
        return [*command, "--resume", latest], latest

    def restarts(self) -> dict[str, int]:
        """Restarts per child, plus the engine restarts the trainer made after a crash."""
        counts = {child.name: child.restarts for child in self.children}
        recovered = self.status.engine_recoveries
        if recovered:
            counts["engine"] = counts.get("engine", 0) + recovered
        return counts

    def _status_line(self, width: int) -> str:
        snap = self.status.read({child.name: child.restarts for child in self.children})
        for step in snap.new_engine_recoveries:
            self.say(f"the trainer restarted its crashed engine (step {step})", "bold yellow")
        return snap.line(width)

    # ------------------------------------------------------------------ stop
    def _stop_all(self) -> None:
        grace = self.plan.config.stop_grace_s
        for env in [*self.environments, *([self.replay] if self.replay else [])]:
            env.stop(10, signal.SIGINT)
        self.trainer.stop(grace, signal.SIGINT)
        for engine in (self.engine, self.teacher):
            if engine is not None:
                engine.stop(15)
        self.api.stop(15)

    def _finish(self, outcome: Outcome, elapsed: float) -> None:
        reading = read_run(self.plan)  # read once, for the panel and the report
        # with the resume command when the trainer did not finish, the final model if any
        numbers = run_numbers(self.plan, self.restarts(), reading)
        unfinished = "resume_command" in numbers
        report = None
        try:
            report = write_report(self.plan, self.config_text, numbers, reading)
        except KeyboardInterrupt:  # a second Ctrl-C (importing matplotlib, drawing)
            rebuild = report_command(self.plan.run_dir)
            self.say(f"report skipped (interrupted); rebuild it: {rebuild}", "bold red")
        except Exception as exc:
            self.say(f"could not write the report: {exc}", "bold red")
        lines = [f"{outcome.message} after {elapsed:.0f}s"]
        if numbers.get("forked_from"):
            lines.append(f"  {forked_from_line(numbers['forked_from'])}")
        for child in self.children:
            restarted = f", {child.restarts} restarts" if child.restarts else ""
            lines.append(f"  {child.name}: {ended(child)}{restarted}")
        lines += [f"  {line}" for line in panel_lines(numbers, self.plan.run_dir)]
        style = "green" if outcome.code == 0 and numbers.get("learned") is not False else "red"
        self.console.print(Panel("\n".join(lines), title="atropos-launch", border_style=style))
        if outcome.failed is not None:
            self.say(f"last lines of {outcome.failed.log_path}:", "bold red")
            self.console.print(Text(outcome.failed.tail()), soft_wrap=True)
        if unfinished:
            self.say(f"continue this run: {resume_command(self.plan.run_dir)}", "bold")
        final = numbers.get("final_model")
        if final:
            self.say(f"final model: {final}")
            for line in loading_lines(final):
                self.console.print(Text(line), soft_wrap=True)
        self.say(f"logs: {self.plan.run_dir / 'logs'}")
        if report is not None:
            self.say(f"report: {report}")
