"""An FSDP trainer that checkpoints, and one that resumes, on any number of ranks.

Usage: python fsdp_worker.py MODEL_DIR SAVE_PATH OUT.pt train|resume  (rank 0 writes OUT.pt)

train:  one step on dp_worker's batch, then a checkpoint (SAVE_PATH/step-1); OUT holds
        the weights and optimizer state it saved.
resume: resumes from SAVE_PATH/step-1; OUT holds the weights and optimizer state as
        loaded, then the weights after one more step on the same batch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from example_trainer.config import TrainingConfig
from example_trainer.grpo import Trainer
from tests.example_trainer.dp_worker import fixed_batch

WHOLE = StateDictOptions(full_state_dict=True, cpu_offload=True)


def copied(value):
    """A snapshot: on one rank (and on a CPU), a gathered tensor can be the live one."""
    if torch.is_tensor(value):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copied(item) for item in value]
    return value


def gathered(trainer: Trainer) -> dict:
    """Every weight and every optimizer state entry, whole, on rank 0 (collective)."""
    return copied(
        {
            "weights": get_model_state_dict(trainer.model, options=WHOLE),
            "optimizer": get_optimizer_state_dict(trainer.model, trainer.optimizer, options=WHOLE),
        }
    )


def main(model_dir: str, save_path: str, out: str, phase: str) -> None:
    resume = str(Path(save_path) / "step-1") if phase == "resume" else None
    config = TrainingConfig(
        model_name=model_dir,
        device="cpu",
        inference_engine="none",
        seq_len=64,
        lr=1e-4,
        parallelism="fsdp",
        save_path=save_path if phase == "train" else save_path + "-resumed",
        resume=resume,
    )
    trainer = Trainer(config)
    vocab = trainer.model.config.vocab_size
    result: dict = {}
    if phase == "train":
        trainer.train_step(fixed_batch(vocab))
        trainer.step = 1
        trainer.save()
        result["saved"] = gathered(trainer)
    else:
        result["loaded"] = gathered(trainer)
        result["step"] = trainer.step
        trainer.train_step(fixed_batch(vocab))
        result["next"] = gathered(trainer)["weights"]
    if trainer.parallel.is_main:
        torch.save(result, out)
    trainer.parallel.close()


if __name__ == "__main__":
    main(*sys.argv[1:5])
