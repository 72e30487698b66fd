"""One batch's gradients, from a single process or from every rank of `torchrun`.

Usage: python dp_worker.py MODEL_DIR OUT.pt GRAD_ACCUM [PARALLELISM [lora]]
(rank 0 writes OUT.pt)

Besides the gradients, it records one optimizer step's update and the bytes this rank
holds for parameters and optimizer state (rank 0's; under FSDP every rank holds a shard).
With `lora` it trains LoRA adapters, and after the update writes a hot push's two
exports beside OUT.pt: the merged weights (`merged/`) and the adapter (`adapter/`),
and then a checkpoint (`ckpt/step-1`).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from atroposlib.weight_sync.bridge import export_weights
from example_trainer.config import TrainingConfig
from example_trainer.grpo import Trainer
from example_trainer.sharding import local_bytes, optimizer_state_tensors


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


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (an FSDP shard is gathered; collective)."""
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


def main(model_dir: str, out: str, grad_accum: int, parallelism: str = "ddp", *lora: str) -> None:
    adapters = {"weight_bridge_mode": "lora_only", "lora_dropout": 0.0} if lora else {}
    adapters["save_path"] = str(Path(out).with_name("ckpt"))
    config = TrainingConfig(
        model_name=model_dir,
        device="cpu",
        inference_engine="none",
        gradient_accumulation_steps=grad_accum,
        seq_len=64,
        clip_eps=0.1,
        parallelism=parallelism,
        **adapters,
    )
    trainer = Trainer(config)
    metrics = trainer.accumulate_gradients(
        trainer.sequences(fixed_batch(trainer.model.config.vocab_size))
    )
    named = [(n, p) for n, p in trainer.model.named_parameters() if p.grad is not None]
    grads = {n: full(p.grad) for n, p in named}
    before = {n: full(p) for n, p in named}
    trainer.master.take_grads()
    trainer.optimizer.step()
    trainer.master.publish()
    updates = {n: full(p) - before[n] for n, p in named}
    held = {
        "parameters": local_bytes(list(trainer.model.parameters())),
        "optimizer": local_bytes(optimizer_state_tensors(trainer.optimizer)),
    }
    if lora:  # as the trainer's push_weights: every rank gathers, rank 0 exports
        writer = trainer.weight_writer()
        for name, adapter_only in (("merged", False), ("adapter", True)):
            target = Path(out).with_name(name)
            if trainer.parallel.is_main:
                export_weights(trainer.model, trainer.tokenizer, target, adapter_only, writer)
            elif writer is not None:
                writer(target, adapter_only)
        trainer.step = 1
        if trainer.parallel.is_main or trainer.sharded:  # as the run loop: FSDP's every rank
            trainer.save()
    if trainer.parallel.is_main:
        saved = {"grads": grads, "before": before, "updates": updates}
        torch.save({**saved, "metrics": metrics, "bytes": held}, out)
    trainer.parallel.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:6])
