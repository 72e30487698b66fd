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
  second list to drift. The sections run side by side. The files the plan writes into
  the run directory (the engines' list that environments read as `--config`) are there
  for the check and removed after it, so a refused launch leaves no run directory.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from atroposlib.launch.config import ConfigError
from atroposlib.utils.tiny_model import TINY_MODEL_NAMES
from atroposlib.utils.tokenizers import CHECK_CONFIG_ENVIRONMENT

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


def preflight(plan: Plan, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Run each environment section's command in check mode; ConfigError on the first
    that refuses, with its one line. Copies of a section share one check."""
    with _plan_files(plan):
        _check_environments(plan, timeout_s)


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


def _check_environments(plan: Plan, timeout_s: float) -> None:
    checks: dict[str, subprocess.Popen] = {}
    seen: set[int | None] = set()
    for process in plan.environments:
        if process.section in seen:
            continue
        seen.add(process.section)
        checks[process.name] = subprocess.Popen(
            process.command,
            env={**os.environ, **process.env, CHECK_CONFIG_ENVIRONMENT: "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    problems = []
    for name, proc in checks.items():
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            problems.append(f"environment {name}: its config check took over {timeout_s:.0f}s")
            continue
        if proc.returncode != 0:
            lines = [line for line in err.strip().splitlines() if line.strip()]
            said = lines[-1] if lines else f"exit code {proc.returncode}"
            problems.append(f"environment {name}: {said}")
    if problems:
        raise ConfigError("; ".join(problems))
