"""What an environment reports: wandb metrics, rollout tables, perf stats, eval results.

These are upstream's overridable hooks, with upstream's names, keys and call
points, each a function of the env that `BaseEnv` binds as a method of the same
name (their state is upstream's attributes of the env, which its envs read and
override): `handle_send_to_api` calls `add_rollouts_for_wandb` for every group it
keeps, and `wandb_log` calls `create_rollout_table` and then `perf_stats` before
logging, so an env that overrides any of them (many upstream envs do) sees them
called as it expects. Differences, on purpose:

- wandb is optional (the `envs` extra). Without it, or with `use_wandb` off,
  the scalar metrics go to the log instead; the hooks still run.
- wandb runs offline when no API key is configured (never an interactive
  prompt); `WANDB_MODE` set by the user wins.
- `setup_wandb` waits, as upstream, for the trainer to say its project and
  group on the API's `/wandb_info`; a trainer that registered without one gives
  `WANDB_PROJECT` or "atropos-environments" instead of a wait for ever.
- The console gets one short line per step (`step_line`); the whole metrics dict,
  as JSON, is logged at DEBUG on `METRICS_LOGGER`, which `keep_full_metrics` turns
  on where the log is a file or a pipe (a launcher's log file), not a terminal.
"""

from __future__ import annotations

import json
import logging
import os
import random
import string
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from atroposlib.utils.logging import MESSAGE_WIDTH, keep_debug_in_files
from atroposlib.utils.metrics import get_std_min_max_avg, plain_numbers

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv

logger = logging.getLogger("atroposlib.envs")
METRICS_LOGGER = "atroposlib.envs.metrics"
metrics_logger = logging.getLogger(METRICS_LOGGER)

DEFAULT_WANDB_PROJECT = "atropos-environments"
# the share of right answers, under the names environments log it
SCORE_KEYS = ("train/accuracy", "train/percent_correct")
SCORE_WORDS = ("accuracy", "correct", "score", "reward")
FAILURE_STATS = ("env/rollout_errors", "env/worker_timeouts")
GROUPS_RATE_WINDOW_S = 60.0
GROUPS_RATE_MIN_SPAN_S = 10.0
"""`env/groups_per_minute` is the rate of the last minute of sends and logs: a rate
since the start would keep the wait for the trainer in it for the whole run. It is
left out until the sends span 10 s (the first groups come in a burst)."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float | np.number) and not isinstance(value, bool)


def step_line(step: int, metrics: dict[str, Any]) -> str:
    """One console line for a step: its score, groups/min and rollouts failed so far.

    The score is `train/accuracy` or `train/percent_correct`, else the first `train/`
    number named like a score; a step without one leaves it out.
    """
    numbers = {key: float(value) for key, value in metrics.items() if _number(value)}
    scores = [key for key in SCORE_KEYS if key in numbers] + [
        key for key in numbers if key.startswith("train/") and any(w in key for w in SCORE_WORDS)
    ]
    parts = [f"step {step}:"]
    if scores:
        parts.append(f"{scores[0].removeprefix('train/')} {numbers[scores[0]]:.3f},")
    if "env/groups_per_minute" in numbers:
        parts.append(f"{numbers['env/groups_per_minute']:.1f} groups/min,")
    failed = sum(numbers.get(key, 0) for key in FAILURE_STATS)
    parts.append(f"{failed:.0f} failed")
    dropped = {k.removeprefix("env/dropped_"): v for k, v in numbers.items() if "/dropped_" in k}
    if any(dropped.values()):  # counted since the start; why, as sending.DROP_REASONS names
        why = ", ".join(f"{n:.0f} {reason}" for reason, n in dropped.items() if n)
        parts[-1] += f", {sum(dropped.values()):.0f} dropped ({why})"
    return " ".join(parts)


def eval_line(task: str, step: int, metrics: dict[str, Any]) -> str:
    """A served evaluation in one console line: its numbers, as many as fit."""
    line = f"eval {task} at step {step}:"
    for key, value in metrics.items():
        if not _number(value):
            continue
        part = f" {key.removeprefix('eval/')} {float(value):.3f}"
        if len(line) + len(part) + 1 > MESSAGE_WIDTH:
            break
        line += part + ","
    return line.rstrip(",")


def keep_full_metrics(stream: Any = None) -> None:
    """Log each step's whole metrics dict where the log is not a terminal: a file or a
    pipe (the launcher's log file) keeps everything; a person reads `step_line`."""
    keep_debug_in_files(METRICS_LOGGER, stream)


def _wandb():
    try:
        import wandb
    except ImportError:
        return None
    return wandb


def run_name(base: str | None) -> str | None:
    """Upstream's run name: `<name>-<date>-<6 random letters>`, so reruns never collide."""
    if not base:
        return None
    suffix = "".join(random.choices(string.ascii_lowercase, k=6))
    return f"{base}-{datetime.now().strftime('%Y-%m-%d')}-{suffix}"


async def setup_wandb(env: BaseEnv) -> None:
    """Start the env's wandb run, grouped with the trainer's via the API's /wandb_info."""
    if not env.config.use_wandb or getattr(env, "_wandb_run", None) is not None:
        return
    wandb = _wandb()
    if wandb is None:
        logger.warning("use_wandb is set but wandb is not installed; logging to the console")
        env.config.use_wandb = False
        return
    if env.client is not None and env.wandb_project is None:
        info = await env.client.wandb_info()
        env.wandb_project, env.wandb_group = info.get("project"), info.get("group")
    project = env.wandb_project or os.environ.get("WANDB_PROJECT") or DEFAULT_WANDB_PROJECT
    mode = os.environ.get("WANDB_MODE") or (
        "online" if os.environ.get("WANDB_API_KEY") else "offline"
    )
    env._wandb_run = wandb.init(
        name=run_name(env.config.wandb_name or env.name),
        project=project,
        group=env.wandb_group,
        config=env.config.model_dump(mode="json"),
        mode=mode,
        reinit=True,
    )


async def add_rollouts_for_wandb(env: BaseEnv, scored_data: Any, item: Any = None) -> None:
    """Keep (text, score) of the first few sequences of a kept group for the rollout table."""
    keep = env.config.num_rollouts_per_group_for_logging
    count = len(scored_data["tokens"])
    if keep != -1:
        count = min(keep, count)
    env.rollouts_for_wandb.append(
        [
            (env.tokenizer.decode(scored_data["tokens"][i]), scored_data["scores"][i])
            for i in range(count)
        ]
    )
    if len(env.rollouts_for_wandb) > env.config.num_rollouts_to_keep:
        env.rollouts_for_wandb.pop(0)


async def create_rollout_table(env: BaseEnv, wandb_metrics: dict[str, Any]) -> dict[str, Any]:
    """Add `train/rollouts`, a wandb table of the kept (text, score) rows, when logging to
    wandb (importing it costs an env without wandb half a second of CPU)."""
    if not (env.rollouts_for_wandb and env.config.use_wandb):
        return wandb_metrics
    wandb = _wandb()
    if wandb is not None:
        table = wandb.Table(columns=["text", "score"])
        for group in env.rollouts_for_wandb:
            for row in group:
                table.add_data(row[0], row[1])
        wandb_metrics["train/rollouts"] = table
    return wandb_metrics


def perf_stats(env: BaseEnv, metrics_dict: dict[str, Any]) -> dict[str, Any]:
    """Timing spreads of rollouts and of the serve loop since the last log (`train_perf/*`)."""
    timings = (
        ("task_duration", "train_perf/task_duration", None),
        (
            "succeeded_task_duration",
            "train_perf/succeeded_task_duration",
            "train/items_sent_to_api",
        ),
        ("failed_task_duration", "train_perf/failed_task_duration", "train/items_rejected"),
        ("mainloop_timings", "train_perf/mainloop_timings", None),
        ("workers_added_list", "train_perf/workers_added_per_attempt", None),
    )
    for attribute, key, count_key in timings:
        values = getattr(env, attribute)
        if len(values) > 1:
            get_std_min_max_avg(key, values, metrics_dict)
            if count_key:
                metrics_dict[count_key] = len(values)
            setattr(env, attribute, [])
    return metrics_dict


async def wandb_log(env: BaseEnv, wandb_metrics: dict[str, Any] | None = None) -> None:
    """Log metrics; subclasses add their keys and call super()."""
    metrics = dict(wandb_metrics or {})
    server_metrics = await env.server.wandb_metrics({})
    lengths = env.completion_lengths
    if lengths:
        metrics["train/completion_lengths"] = float(np.mean(lengths))
        metrics["train/completion_lengths_std"] = float(np.std(lengths))
        metrics["train/completion_lengths_max"] = int(np.max(lengths))
        metrics["train/completion_lengths_min"] = int(np.min(lengths))
        if env.max_token_len > 0:
            metrics["train/completion_lengths_p95"] = float(
                (np.array(lengths) > 0.95 * env.max_token_len).mean()
            )
    for key, value in env.stats.items():
        metrics[f"env/{key}"] = value
    rate = env.groups_rate.add(time.monotonic(), env.stats["groups_sent"])
    if rate is not None:
        metrics["env/groups_per_minute"] = 60 * rate
    metrics = await env.create_rollout_table(metrics)
    metrics = env.perf_stats(metrics)
    env.rollouts_for_wandb = []
    env.completion_lengths = []
    logger.info("%s", step_line(env.curr_step, metrics))
    if metrics_logger.isEnabledFor(logging.DEBUG):
        shown = {
            k: round(v, 4) if isinstance(v, float) else v
            for k, v in plain_numbers({**metrics, **server_metrics}).items()
            if isinstance(v, int | float | str | None)
        }
        metrics_logger.debug("step %d metrics: %s", env.curr_step, json.dumps(shown))
    run = getattr(env, "_wandb_run", None)
    if env.config.use_wandb and run is not None:
        if env.wandb_prepend is not None:
            metrics = {f"{env.wandb_prepend}_{k}": v for k, v in metrics.items()}
        metrics.update(server_metrics)
        run.log(metrics, step=env.curr_step)


async def evaluate_log(
    env: BaseEnv,
    metrics: dict[str, Any],
    task_name: str | None = None,
    model_name: str | None = None,
    start_time: float | None = None,
    end_time: float | None = None,
    generation_parameters: dict[str, Any] | None = None,
    samples: list[dict[str, Any]] | None = None,
    verbose: bool = True,
) -> None:
    """metrics.json (lighteval's shape, as nous-evals reads it) and samples.jsonl.

    Written under `data_dir_to_save_evals`; without it, only the log line. A served
    env also appends it, with the trainer's step, to that folder's history.jsonl
    (atropos-launch gives each env `<run_dir>/evals/<name>`, and plots it).
    """
    from atroposlib.envs.eval import append_eval_history, evaluate_log

    task = task_name or f"{env.name or type(env).__name__}_eval"
    serving = getattr(env, "env_id", None) is not None
    if serving:  # one line on the launcher's console; the table is for `evaluate`
        logger.info("%s", eval_line(task, env.curr_step, metrics))
        verbose = False
    else:
        logger.info("eval %s: %s", task, plain_numbers(metrics))
    metrics_logger.debug("eval %s metrics: %s", task, json.dumps(plain_numbers(metrics)))
    if not env.config.data_dir_to_save_evals:
        logger.warning(
            "evaluation results not saved: set --env.data_dir_to_save_evals DIR to keep them"
        )
        return
    step = env.curr_step if serving else getattr(env.config, "eval_step", None)
    if step is not None:  # a run's step: a served env's, or the one `evaluate` was given
        append_eval_history(env.config.data_dir_to_save_evals, step, task, metrics)
    if model_name is None:
        model_name = getattr(env.config, "model_name", None)
    if model_name is None and env.server.servers:
        model_name = getattr(env.server.servers[0].config, "model_name", None)
    evaluate_log(
        metrics,
        eval_dir=env.config.data_dir_to_save_evals,
        task_name=task,
        model_name=model_name,
        start_time=start_time,
        end_time=end_time,
        generation_parameters={
            "max_new_tokens": env.config.max_token_length,
            **(generation_parameters or {}),
        },
        samples=samples,
        verbose=verbose,
    )
