"""The data-parallel checks' trainer work, in one process or on every rank of `torchrun`.

Usage: torchrun --nproc_per_node 2 dp_worker.py MODEL_DIR ROOT ONE_RANK_CHECKPOINT
(rank 0 writes ROOT/out.pt)

Each job below builds its own `Trainer`; the test runs the one-process side of each in
its own process (`tests/example_trainer/test_data_parallel.py`), and the ranks run
them all in one launch (`main`), so torch and transformers are imported once per rank
instead of once per question:
- `gradients`: one batch's gradients (`fixed_batch`, or `lonely_batch`: one sequence),
  one optimizer step's update and the bytes this rank holds for parameters and
  optimizer state (rank 0's; under FSDP every rank holds a shard). With `lora` it
  trains LoRA adapters, and after the update writes a hot push's two exports into
  FOLDER: the merged weights (`merged/`) and the adapter (`adapter/`), and then a
  checkpoint (`ckpt/step-1`).
- `checkpoint`: one FSDP step, then a checkpoint (SAVE_PATH/step-1); returns the weights
  and optimizer state it saved.
- `resumed`: an FSDP trainer resumed from SAVE_PATH/step-1; returns the weights and
  optimizer state as loaded, then the weights after one more step on the same batch.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from atroposlib.weight_sync.bridge import export_weights
from example_trainer import grpo
from example_trainer.config import TrainingConfig
from example_trainer.grpo import Trainer
from example_trainer.sharding import local_bytes, optimizer_state_tensors

WHOLE = StateDictOptions(full_state_dict=True, cpu_offload=True)


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


def lonely_batch(vocab: int) -> list[dict]:
    """One sequence for two ranks: what is left of a batch after --max-staleness drops
    all but one (DP-2 of the trainer review: the second rank's empty share raised)."""
    (first, *_) = fixed_batch(vocab)
    one = {key: [value[0]] for key, value in first.items() if key != "scores"}
    return [{**one, "scores": [1.0]}]


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (an FSDP shard is gathered; collective)."""
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


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


def gradients(
    model_dir: str,
    folder: Path,
    grad_accum: int,
    parallelism: str = "ddp",
    lora: bool = False,
    batch=fixed_batch,
) -> dict | None:
    """See the module docstring; None on ranks other than 0."""
    adapters = {"weight_bridge_mode": "lora_only", "lora_dropout": 0.0} if lora else {}
    config = TrainingConfig(
        model_name=model_dir,
        device="cpu",
        inference_engine="none",
        gradient_accumulation_steps=grad_accum,
        seq_len=64,
        clip_eps=0.1,
        parallelism=parallelism,
        num_threads=1,
        save_path=str(folder / "ckpt"),
        **adapters,
    )
    trainer = Trainer(config)
    metrics = trainer.accumulate_gradients(
        trainer.sequences(batch(trainer.model.config.vocab_size))
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
        writer = trainer.serving.weight_writer()
        for name, adapter_only in (("merged", False), ("adapter", True)):
            target = folder / name
            if trainer.parallel.is_main:
                export_weights(trainer.model, trainer.tokenizer, target, adapter_only, writer)
            elif writer is not None:
                writer(target, adapter_only)
        trainer.step = 1
        if trainer.parallel.is_main or trainer.sharded:  # as the run loop: FSDP's every rank
            trainer.save()
    if not trainer.parallel.is_main:
        return None
    saved = {"grads": grads, "before": before, "updates": updates}
    return {**saved, "metrics": metrics, "bytes": held}


def fsdp_trainer(model_dir: str, save_path: Path, resume: Path | None = None) -> Trainer:
    return Trainer(
        TrainingConfig(
            model_name=model_dir,
            device="cpu",
            inference_engine="none",
            seq_len=64,
            lr=1e-4,
            parallelism="fsdp",
            num_threads=1,
            save_path=str(save_path),
            resume=str(resume) if resume else None,
        )
    )


def checkpoint(model_dir: str, save_path: Path) -> dict:
    """See the module docstring (rank 0's result is whole; the others' are empty)."""
    trainer = fsdp_trainer(model_dir, save_path)
    trainer.train_step(fixed_batch(trainer.model.config.vocab_size))
    trainer.step = 1
    trainer.save()
    return gathered(trainer)


def resumed(model_dir: str, save_path: Path, own_path: Path) -> dict:
    """See the module docstring; the resumed trainer's own records go to OWN_PATH."""
    trainer = fsdp_trainer(model_dir, own_path, save_path / "step-1")
    result = {"loaded": gathered(trainer), "step": trainer.step}
    trainer.train_step(fixed_batch(trainer.model.config.vocab_size))
    result["next"] = gathered(trainer)["weights"]
    return result


def main(model_dir: str, root: str, one_rank_checkpoint: str) -> None:
    """Every rank's part of every check, in one launch (see the module docstring)."""
    folder = Path(root)
    # the ranks join torchrun's group once: every trainer below runs in it (a group
    # destroyed and joined again would meet the old group's keys in torchrun's store)
    parallel, device = grpo.init_data_parallel(torch.device("cpu"))
    grpo.init_data_parallel = lambda *args, **kwargs: (parallel, device)
    results = {
        "ddp": gradients(model_dir, folder / "ddp", 2),
        "fsdp": gradients(model_dir, folder / "fsdp", 2, "fsdp"),
        "fsdp_lora": gradients(model_dir, folder / "fsdp-lora", 2, "fsdp", lora=True),
        "ddp_lonely": gradients(model_dir, folder / "ddp-1", 1, batch=lonely_batch),
        "fsdp_lonely": gradients(model_dir, folder / "fsdp-1", 1, "fsdp", batch=lonely_batch),
        "saved": checkpoint(model_dir, folder / "ckpt"),
        "resumed": resumed(model_dir, folder / "ckpt", folder / "resumed"),
        "resumed_from_one": resumed(model_dir, Path(one_rank_checkpoint), folder / "resumed-1"),
    }
    if parallel.is_main:
        torch.save(results, folder / "out.pt")
    parallel.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
