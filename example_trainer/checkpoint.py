"""Checkpoints that an engine can serve and a trainer can resume from.

`<save_path>/step-<N>/` holds the model and tokenizer (save_pretrained, so vLLM
or the CPU engine loads it directly) and `trainer_state.pt` with the optimizer,
scheduler, RNG states and step, for `--resume`. The directory is written under
a temporary name and renamed, so a crash never leaves a half checkpoint.
"""

from __future__ import annotations

import copy
import random
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"


def save_checkpoint(save_path: str, step: int, model, tokenizer, optimizer, scheduler) -> Path:
    target = Path(save_path) / f"step-{step}"
    staging = Path(save_path) / f".step-{step}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    # LoRA: the engine gets merged weights; merge a copy so training keeps its adapters
    to_save = (
        copy.deepcopy(model).merge_and_unload() if hasattr(model, "merge_and_unload") else model
    )
    to_save.save_pretrained(staging)
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
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def load_trainer_state(checkpoint: str, optimizer, scheduler) -> int:
    state: dict[str, Any] = torch.load(Path(checkpoint) / STATE_FILE, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return int(state["step"])
