"""Checks a launch makes before anything starts, beyond validating the YAML.

Design: a mistake found after the API, the engine and the trainer have started costs
a minute and a screen of tracebacks (a missing model ends in transformers' "Repo id
must be in the form..."; a typo in an environment's keys surfaces only when that
environment starts). So the launcher checks, before it starts anything:

- the model: a local directory, a Hugging Face name, or a named tiny model (`check_model_name`,
  pure, so the plan's unit tests see it);
- each environment's flags and tokenizer: its own command is run once with
  `ATROPOS_CHECK_CONFIG=1` (`preflight`), which makes the env's CLI parse and resolve
  every flag as it would, load the tokenizer it names, and exit, 0 or 2 with one
  line. The check goes through the env's real parser, so it knows every key that env
  accepts (its own config class, YAML `--config`, extra server namespaces) with no
  second list to drift. It prints its resolved lengths, and a `max_tokens` that leaves
  no room for a prompt in the engine's context is refused here, naming the YAML key:
  the run would otherwise wait forever on an engine that refuses every request. Its
  lines name YAML keys, not flags (`as_yaml_keys`);
- what the config needs of the model and of this machine (`launch/needs.py`).

The checks run side by side, and every problem is reported at once. The files the plan
writes into the run directory (the engines' list that environments read as `--config`)
are there for the check and removed after it, so a refused launch leaves no run
directory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from atroposlib.launch.config import ConfigError
from atroposlib.launch.needs import Finding, context_finding, model_is_here, start_probes
from atroposlib.utils.tiny_model import TINY_MODEL_NAMES
from atroposlib.utils.tokenizers import CHECK_CONFIG_ENVIRONMENT, CHECK_REPORT_KEY

if TYPE_CHECKING:
    from atroposlib.launch.plan import Plan

HUB_NAME = re.compile(r"^([\w\-.]+/)?[\w\-.]{1,96}$")
"""A Hugging Face repo id: `name` or `namespace/name` (huggingface_hub's own rule)."""
CHECK_TIMEOUT_S = 300.0
"""An env's import and tokenizer load; a hub tokenizer may be downloaded here."""


def check_model_name(model: str) -> None:
    """ConfigError unless `model` is a named tiny model (`TINY_MODEL_NAMES`), an existing
    directory, or could be a hub name."""
    path = Path(model).expanduser()
    if model in TINY_MODEL_NAMES or path.is_dir():
        return
    if path.exists():
        raise ConfigError(f"model: {model} is a file; give a model directory, a name, or tiny")
    looks_local = model.startswith(("/", ".", "~")) or not HUB_NAME.match(model)
    if looks_local or "--" in model or ".." in model:
        raise ConfigError(
            f"model: no directory {model} (and it is not a Hugging Face name such as "
            "Qwen/Qwen2.5-0.5B-Instruct); give a local model directory, a name, or tiny"
        )


def preflight(
    plan: Plan, timeout_s: float = CHECK_TIMEOUT_S, dry_run: bool = False
) -> list[Finding]:
    """Every check, side by side: each environment section's command in check mode, the
    model's context, and what the config needs of this machine (`launch/needs.py`).
    ConfigError lists every problem at once; a dry run lets this machine's through (it
    may be checking another machine's config) and returns them with the rest."""
    offline = dry_run and not model_is_here(plan.model)
    with _plan_files(plan):
        probes = start_probes(plan)
        findings = [*_check_environments(plan, timeout_s, load=not offline), context_finding(plan)]
        findings += [probe.finding(timeout_s) for probe in probes]
    if offline:
        findings.append(
            Finding(
                "the tokenizers",
                skipped=f"{plan.model} is not on this machine (a launch downloads it)",
            )
        )
    problems = [f.problem for f in findings if f.problem and not (dry_run and f.machine)]
    if problems:
        raise ConfigError("; ".join(problems))
    return findings


@contextmanager
def _plan_files(plan: Plan) -> Iterator[None]:
    """The plan's files in its run directory while the checks read them; what this
    wrote (and the directory, if this made it) is removed afterwards."""
    made_dir = not plan.run_dir.exists()
    written = []
    try:
        for name, text in plan.files.items():
            path = plan.run_dir / name
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                written.append(path)
        yield
    finally:
        for path in written:
            path.unlink(missing_ok=True)
        if made_dir and plan.run_dir.is_dir() and not any(plan.run_dir.iterdir()):
            plan.run_dir.rmdir()


def _check_environments(plan: Plan, timeout_s: float, load: bool) -> list[Finding]:
    checks: dict[str, tuple[int | None, subprocess.Popen]] = {}
    for process in plan.environments:
        if process.section in {section for section, _ in checks.values()}:
            continue
        checks[process.name] = (
            process.section,
            subprocess.Popen(
                process.command,
                env={
                    **os.environ,
                    **process.env,
                    CHECK_CONFIG_ENVIRONMENT: "1" if load else "flags",
                },
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
    return [_environment_finding(plan, name, *check, timeout_s) for name, check in checks.items()]


def _environment_finding(
    plan: Plan, name: str, section: int | None, proc: subprocess.Popen, timeout_s: float
) -> Finding:
    check = f"environment {name}"
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return Finding(check, problem=f"{check}: its config check took over {timeout_s:.0f}s")
    if proc.returncode != 0:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        said = lines[-1] if lines else f"exit code {proc.returncode}"
        return Finding(check, problem=f"{check}: {as_yaml_keys(said, section)}")
    lengths = _reported_lengths(out)
    max_tokens = lengths.get("max_tokens")
    if isinstance(max_tokens, int) and max_tokens >= plan.engine_context:
        key = f"environments.{section}.env.max_tokens"
        return Finding(
            check,
            problem=f"{check}: {key} {max_tokens} leaves no room for a prompt in the engine's "
            f"context of {plan.engine_context} tokens ({plan.engine_context_key}), which a "
            f"prompt and its answer share; lower it well below {plan.engine_context}, or raise "
            f"{plan.engine_context_key}",
        )
    return Finding(check)


def _reported_lengths(out: str) -> dict[str, object]:
    """The lengths a checked environment printed (`CHECK_REPORT_KEY`), or none."""
    for line in reversed(out.splitlines()):
        try:
            reported = json.loads(line)
        except ValueError:
            continue
        if isinstance(reported, dict) and isinstance(reported.get(CHECK_REPORT_KEY), dict):
            return reported[CHECK_REPORT_KEY]
    return {}


def as_yaml_keys(line: str, section: int | None) -> str:
    """An environment's line in the launch YAML's words: `--env.max_tokens` is
    `environments.0.env.max_tokens` (and an unknown flag, an unknown key)."""
    if section is None:
        return line
    keys = re.sub(r"--(env|openai)\.", rf"environments.{section}.\1.", line)
    return keys.replace("unknown flag environments.", "unknown key environments.")


def print_dry_run(resolved: Plan, findings: list[Finding]) -> None:
    """The commands, then what was checked, skipped, and found missing on this machine."""
    for process in resolved.processes:
        when = " (after the trainer finishes)" if process.evaluate_only else ""
        print(f"{process.name}{when}: {' '.join(process.command)}")
    passed = [f.check for f in findings if not f.problem and not f.skipped]
    print(f"checked: {', '.join(passed) or 'nothing'}")
    for finding in findings:
        if finding.skipped:
            print(f"skipped: {finding.check}: {finding.skipped}")
    for finding in findings:
        if finding.problem:  # only this machine's needs get here in a dry run
            print(f"not on this machine (a launch here is refused): {finding.problem}")
