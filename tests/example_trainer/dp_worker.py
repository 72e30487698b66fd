"""One batch's gradients, from a single process or from every rank of `torchrun`.

Usage: python dp_worker.py MODEL_DIR OUT.pt GRAD_ACCUM  (rank 0 writes OUT.pt)
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from example_trainer.config import TrainingConfig
from example_trainer.grpo import Trainer


def fixed_batch(vocab: int) -> list[dict]:
    """Two groups of uneven lengths; one carries inference logprobs (ratio != 1), one not."""
    rng = random.Random(7)
    groups = []
    for g in range(2):
        tokens, masks, logprobs = [], [], []
        for i in range(4):
            length = 6 + 3 * i + g
            seq = [rng.randrange(3, vocab) for _ in range(length)]
            tokens.append(seq)
            masks.append([-100] * 3 + seq[3:])
            logprobs.append([1.0] * 3 + [-rng.uniform(0.5, 6.0) for _ in range(length - 3)])
        group = {"tokens": tokens, "masks": masks, "scores": [1.0, 0.0, 0.5, 0.0]}
        if g == 0:
            group["inference_logprobs"] = logprobs
        groups.append(group)
    return groups


def main(model_dir: str, out: str, grad_accum: int) -> None:
    config = TrainingConfig(
        model_name=model_dir,
        device="cpu",
        inference_engine="none",
        gradient_accumulation_steps=grad_accum,
        seq_len=64,
        clip_eps=0.1,
    )
    trainer = Trainer(config)
    metrics = trainer.accumulate_gradients(fixed_batch(trainer.model.config.vocab_size))
    if trainer.parallel.is_main:
        grads = {
            n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None
        }
        torch.save({"grads": grads, "metrics": metrics}, out)
    trainer.parallel.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
