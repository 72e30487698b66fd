"""What a step reports beside its loss: the rollouts it was given, its console line,
and where the report goes (`StepLog`).

The rollout figures are those TRL's GRPOTrainer logs, under TRL's names where the
trainer had none, so runs of both compare:

- `score_mean`, `score_std` (TRL's `reward`, `reward_std`): the batch's scores;
- `score_mean/env_<id>`: each environment's mean score in the batch (by the API's
  env_id), so a mixed run's curves part (the launcher's report names them);
- `frac_reward_zero_std`: the share of groups whose scores are all equal. GRPO gives
  such a group zero advantage, so it teaches nothing: a share near 1 says the task is
  too easy or too hard for the policy as it is now;
- `completions/mean_length`, `completions/min_length`, `completions/max_length`: the
  trained tokens of each sequence (its completion; every trained turn of a multi-turn
  rollout), as trained, so at most --seq-len;
- `completions/clipped_ratio`: the share of completions that did not finish: cut at
  --seq-len, or ending without an end token (`end_token_ids`; blank tokens after one,
  a chat template's newline, are allowed). An engine's tokens end with EOS only where
  it stopped, and `tokenize_for_trainer` drops the EOS a chat template adds to a
  completion whose finish reason is "length";
- `completions/mean_terminated_length`: the mean length of those that finished
  (absent when none did).

They cover the groups the step could train, stale sequences included (what the
environments produced), as `score_mean` does.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from atroposlib.trainer_contract import ENV_SCORE_PREFIX, RunRecords
from atroposlib.utils.logging import MESSAGE_WIDTH
from atroposlib.utils.tokenizers import end_token_ids
from example_trainer.data import Sequence
from example_trainer.model import require

logger = logging.getLogger("example_trainer")

ALWAYS = 9
"""A field of the step line that stays whatever the width."""
ZERO_SPREAD = 1e-8
"""Scores closer than this are equal (TRL's isclose of the group's std to 0)."""


def score_numbers(sequences: list[Sequence]) -> dict[str, float]:
    """The batch's scores, stale sequences included: what the environments achieved."""
    if not sequences:
        return {}
    scores = torch.tensor([s.score for s in sequences])
    return {
        "score_mean": float(scores.mean()),
        "score_std": float(scores.std()) if len(scores) > 1 else 0.0,
    }


def environment_scores(sequences: list[Sequence]) -> dict[str, float]:
    """`score_mean/env_<id>`: each environment's mean score in the batch, so a mixed
    run's metrics (and wandb) show which task moves; the launcher's report names them."""
    by_env: dict[int, list[float]] = {}
    for sequence in sequences:
        if sequence.source is not None:
            by_env.setdefault(sequence.source, []).append(sequence.score)
    return {
        f"{ENV_SCORE_PREFIX}{env_id}": sum(scores) / len(scores)
        for env_id, scores in sorted(by_env.items())
    }


def zero_spread_share(sequences: list[Sequence]) -> dict[str, float]:
    """`frac_reward_zero_std`: the share of the sequences' groups whose scores are equal
    (a group of one included: it has no spread either)."""
    groups: dict[int, list[float]] = {}
    for sequence in sequences:
        groups.setdefault(sequence.group, []).append(sequence.score)
    if not groups:
        return {}
    flat = sum(max(scores) - min(scores) <= ZERO_SPREAD for scores in groups.values())
    return {"frac_reward_zero_std": flat / len(groups)}


class CompletionEnds:
    """Tells a completion that finished from one cut off (see the module docstring)."""

    def __init__(self, tokenizer: Any, model: Any = None) -> None:
        self.tokenizer = tokenizer
        self.ids = end_token_ids(model, tokenizer)
        self._blank: dict[int, bool] = {}

    def blank(self, token: int) -> bool:
        if token not in self._blank:
            self._blank[token] = not self.tokenizer.decode([token]).strip()
        return self._blank[token]

    def finished(self, sequence: Sequence) -> bool:
        if sequence.cut:
            return False
        trained = [t for t, m in zip(sequence.tokens, sequence.masks, strict=True) if m != -100]
        for token in reversed(trained):
            if token in self.ids:
                return True
            if not self.blank(token):
                return False
        return False


def completion_numbers(sequences: list[Sequence], ends: CompletionEnds) -> dict[str, float]:
    """TRL's `completions/*` length figures of `sequences` (see the module docstring)."""
    if not sequences:
        return {}
    lengths = [sum(m != -100 for m in s.masks) for s in sequences]
    finished = [n for s, n in zip(sequences, lengths, strict=True) if ends.finished(s)]
    numbers = {
        "completions/mean_length": sum(lengths) / len(lengths),
        "completions/min_length": float(min(lengths)),
        "completions/max_length": float(max(lengths)),
        "completions/clipped_ratio": 1 - len(finished) / len(lengths),
    }
    if finished:
        numbers["completions/mean_terminated_length"] = sum(finished) / len(finished)
    return numbers


def rollout_numbers(sequences: list[Sequence], ends: CompletionEnds) -> dict[str, float]:
    """Every rollout figure of a step's batch (the module docstring lists them)."""
    return {
        **score_numbers(sequences),
        **environment_scores(sequences),
        **zero_spread_share(sequences),
        **completion_numbers(sequences, ends),
    }


def step_line(step: int, total: int, metrics: dict[str, float], width: int = MESSAGE_WIDTH) -> str:
    """The console's line of a step, within `width` (beside the launcher's prefix, an
    80-column console): step, score, loss, grad norm, KL (where the step had a
    reference), the KL to a distillation teacher (where it had one), clip fraction, the
    sequences --max-staleness dropped (if any) and the step's seconds (waiting,
    training, syncing). Where not all fit, clip goes first,
    then the KL to the reference, the dropped count, the grad norm, and the KL to the
    teacher. The metrics file has every figure."""
    seconds = sum(metrics.get(key, 0.0) for key in ("wait_s", "train_s", "sync_s"))
    dropped = metrics.get("stale_sequences_dropped", 0.0)

    def shown(key: str, places: int) -> str:  # 0.0000, never -0.0000
        return f"{round(metrics.get(key, 0.0), places) + 0.0:.{places}f}"

    # (field, how long it stays as the line shrinks: higher stays longer; 0 never shows)
    fields = [
        (f"step {step}/{total}", ALWAYS),
        (f"score {shown('score_mean', 3)}", ALWAYS),
        (f"loss {shown('loss', 4)}", ALWAYS),
        (f"grad {metrics['grad_norm']:.3g}", 4),
        (f"kl {shown('kl', 4)}", 2 if metrics.get("kl") else 0),
        (f"teacher-kl {shown('distill_kl', 3)}", 5 if "distill_kl" in metrics else 0),
        (f"clip {shown('clip_fraction', 3)}", 1),
        (f"dropped {dropped:.0f} stale", 3 if dropped else 0),
        (f"{seconds:.1f}s", ALWAYS),
    ]
    fields = [f for f in fields if f[1]]
    while len(" ".join(text for text, _ in fields)) > width and min(f[1] for f in fields) < ALWAYS:
        fields.remove(min(fields, key=lambda f: f[1]))
    return " ".join(text for text, _ in fields)


class Tracker(NamedTuple):
    """A tracker's run as the step log uses it: wandb's and trackio's differ only in
    how a run is finished."""

    log: Callable[..., Any]
    """`log(dict, step=)`."""
    finish: Callable[[], Any]


class StepLog:
    """Where a step's report goes: `metrics.jsonl` (the launcher's contract), the
    console's one line, and the same numbers under `train/` to each tracker asked for:
    wandb with `--use-wandb` (offline without a WANDB_API_KEY: never a login prompt),
    trackio with `--use-trackio` (local, under $TRACKIO_DIR). Each run starts at the
    first step it logs, so a trainer that fails before one leaves no empty run."""

    def __init__(self, records: RunRecords, config: Any) -> None:
        """`config`: the trainer's (`TrainingConfig`), given whole to each tracker."""
        self.records, self.config = records, config
        self.trackers: dict[str, Tracker] = {}
        """The trackers' runs started so far, by name (wandb, trackio)."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.records.metrics(step, metrics)
        tracked = {f"train/{k}": v for k, v in metrics.items()}
        for tracker in self._started():
            tracker.log(tracked, step=step)
        logger.info("%s", step_line(step, self.config.optim.training_steps, metrics))

    def _started(self) -> list[Tracker]:
        asked = self.config.logging
        starts = {
            "wandb": (asked.use_wandb, self._wandb),
            "trackio": (asked.use_trackio, self._trackio),
        }
        for name, (wanted, start) in starts.items():
            if wanted and name not in self.trackers:
                self.trackers[name] = start()
        return list(self.trackers.values())

    def _wandb(self) -> Tracker:
        wandb = require("wandb", "--use-wandb")
        run = wandb.init(
            project=self.config.logging.wandb_project,
            group=self.config.logging.wandb_group,
            name=self.config.logging.run_name,
            mode="online" if os.environ.get("WANDB_API_KEY") else "offline",
            config=self.config.model_dump(),
            dir=self.config.checkpoint.save_path,
        )
        return Tracker(run.log, run.finish)

    def _trackio(self) -> Tracker:
        """trackio's run; its banner (half a dozen printed lines, with colour codes) is one
        log line here, as the console keeps a line per event. `trackio.finish` also forgets
        the run, which a finish of the run alone leaves for trackio's exit hook to finish
        (and announce) again."""
        trackio = require("trackio", "--use-trackio")
        project = self.config.logging.trackio_project
        with contextlib.redirect_stdout(io.StringIO()):
            run = trackio.init(
                project=project,
                name=self.config.logging.run_name,
                config=self.config.model_dump(mode="json"),
            )
        logger.info(
            "trackio run %s in project %s (trackio show --project %s)", run.name, project, project
        )
        return Tracker(run.log, trackio.finish)

    def close(self) -> None:
        """Finish every tracker's run (trackio writes its last steps now; its line that
        it is "uploading" is not shown: it writes to a local file)."""
        with contextlib.redirect_stdout(io.StringIO()):
            for tracker in self.trackers.values():
                tracker.finish()
        self.trackers.clear()
