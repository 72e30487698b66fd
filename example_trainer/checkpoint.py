"""Checkpoints that an engine can serve and a trainer can resume from.

`<save_path>/step-<N>/` holds the model and tokenizer (save_pretrained, so vLLM
or the CPU engine loads it directly) and `trainer_state.pt` with the optimizer,
scheduler, RNG states and step, for `--resume`. A LoRA run also writes its
adapter to `adapter/`: the served weights are merged, and resuming from merged
weights with fresh adapters would pair the saved optimizer moments with
parameters they were never computed for. The directory is written under a
temporary name, fsynced and renamed, so neither a crash nor a power loss leaves a
half checkpoint, and the API deletes the batches it holds only once it is on disk.

`--keep-checkpoints N` prunes after each save (`prune_checkpoints`).
"""

from __future__ import annotations

import copy
import random
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from atroposlib.utils.durable import fsync_dir, fsync_tree

STATE_FILE = "trainer_state.pt"
ADAPTER_DIR = "adapter"


def save_checkpoint(save_path: str, step: int, model, tokenizer, optimizer, scheduler) -> Path:
    target = Path(save_path) / f"step-{step}"
    staging = Path(save_path) / f".step-{step}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if hasattr(model, "merge_and_unload"):
        # LoRA: the engine gets merged weights; merge a copy so training keeps its adapters
        copy.deepcopy(model).merge_and_unload().save_pretrained(staging)
        model.save_pretrained(staging / ADAPTER_DIR)
    else:
        model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    torch.save(
        {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
        },
        staging / STATE_FILE,
    )
    fsync_tree(staging)  # on disk before `committed` lets the API delete its batches
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    fsync_dir(target.parent)
    return target


def load_trainer_state(
    checkpoint: str, optimizer, scheduler, restore_optimizer: bool = True
) -> int:
    """Restore what `save_checkpoint` kept beside the weights; the checkpoint's step."""
    state: dict[str, Any] = torch.load(Path(checkpoint) / STATE_FILE, weights_only=False)
    if restore_optimizer:
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return int(state["step"])


def checkpoints(save_path: str | Path) -> list[Path]:
    """The checkpoints under `save_path` with a trainer state (resumable), oldest first."""
    found = []
    for path in Path(save_path).glob("step-*"):
        step = path.name.removeprefix("step-")
        if step.isdigit() and (path / STATE_FILE).is_file():
            found.append((int(step), path))
    return [path for _, path in sorted(found)]


def prune_checkpoints(
    save_path: str | Path, keep: int, protect: Iterable[str | Path | None] = ()
) -> list[Path]:
    """Delete all but the `keep` newest complete checkpoints (0 keeps all); the removed ones.

    The newest is always among those kept, so a run can resume from where it stopped;
    `protect` names checkpoints that must stay whatever their age (the one the engine
    serves, which is where a failed engine restart falls back to). Anything else under
    `save_path` (partial writes, other files) is left alone.
    """
    if keep <= 0:
        return []
    kept = {Path(p).resolve() for p in protect if p is not None}
    removed = []
    for path in checkpoints(save_path)[:-keep]:
        if path.resolve() not in kept:
            shutil.rmtree(path)
            removed.append(path)
    return removed
