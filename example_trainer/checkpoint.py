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

Under FSDP (`save_sharded_checkpoint`) every rank takes part: the weights are gathered
onto rank 0's CPU alone, which writes them as above (what an engine loads), and each
rank writes its own shard of the optimizer state with `torch.distributed.checkpoint`
into `optimizer/`. That format records global shapes, so `--resume` reshards it onto
any number of ranks, one included (`load_trainer_state`).
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
OPTIMIZER_DIR = "optimizer"  # FSDP checkpoints: the optimizer state, one shard per rank
MASTERS_DIR = "masters"  # FSDP checkpoints: the fp32 trainable weights, one shard per rank


def _paths(save_path: str, step: int) -> tuple[Path, Path]:
    return Path(save_path) / f"step-{step}", Path(save_path) / f".step-{step}.partial"


def _trainer_state(step: int, optimizer_state: Any, scheduler) -> dict[str, Any]:
    state = {
        "step": step,
        "optimizer": optimizer_state,
        "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()  # CK-2: dropout on a GPU
    return state


def fp32_masters(masters: torch.nn.Module, model) -> dict[str, torch.Tensor] | None:
    """What `save_checkpoint` keeps of a bf16 run's fp32 masters (`masters`, the
    module `MasterWeights.stepped_module` gives): the served weights are bf16, and a
    resume from them alone would round every master (CK-2 of the trainer review)."""
    if masters is model:
        return None
    return {name: p.detach().clone() for name, p in masters.named_parameters()}


def _commit(staging: Path, target: Path) -> Path:
    fsync_tree(staging)  # on disk before `committed` lets the API delete its batches
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    fsync_dir(target.parent)
    return target


def save_checkpoint(
    save_path: str, step: int, model, tokenizer, optimizer, scheduler, masters=None
) -> Path:
    """`masters`: the module of what the optimizer steps (`MasterWeights.stepped_module`);
    its fp32 weights are kept when they are not the model's own."""
    target, staging = _paths(save_path, step)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if hasattr(model, "merge_and_unload"):
        # LoRA: the engine gets merged weights; merge a copy so training keeps its adapters
        copy.deepcopy(model).merge_and_unload().save_pretrained(staging)
        model.save_pretrained(staging / ADAPTER_DIR)
    else:
        model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    state = _trainer_state(step, optimizer.state_dict(), scheduler)
    if masters is not None and (kept := fp32_masters(masters, model)) is not None:
        state["masters"] = kept
    torch.save(state, staging / STATE_FILE)
    return _commit(staging, target)


def gathered_weights(model) -> dict[str, torch.Tensor] | None:
    """An FSDP model's whole weights on rank 0's CPU (None on the other ranks). A
    collective: every rank calls it, in the same order as every other collective."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    gathered = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights: dict[str, Any] = get_model_state_dict(model, options=gathered)
    return weights if dist.get_rank() == 0 else None


def merged_lora_weights(model, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A peft model's gathered weights, with each adapter merged into its base layer:
    peft's own `merge_and_unload`, run on a skeleton that borrows the gathered tensors
    (built on the meta device, so it costs no second copy of the model)."""
    from peft import get_peft_model

    base = model.get_base_model()
    with torch.device("meta"):
        skeleton = type(base)(base.config)  # the policy's own class: a VLM's too
        skeleton = get_peft_model(skeleton, model.peft_config["default"])
    # the merge adds into each base layer in place, and a gathered tensor can be the live
    # parameter itself (one rank on a CPU): those the merge writes are copied first
    own = {n: t.clone() if ".base_layer." in n else t for n, t in weights.items()}
    skeleton.load_state_dict(own, assign=True, strict=False)
    skeleton.get_base_model().tie_weights()  # assign= untied them: saved once, as the model's
    return skeleton.merge_and_unload().state_dict()


def write_served(
    model,
    tokenizer,
    staging: Path,
    weights: dict[str, torch.Tensor],
    dtype: torch.dtype,
    with_adapter: bool = True,
) -> None:
    """What an engine loads from gathered `weights`, in `dtype`; a LoRA model's adapter
    also goes to `adapter/` (`with_adapter`), as in `save_checkpoint`."""
    if hasattr(model, "merge_and_unload"):
        if with_adapter:  # peft keeps the adapter's tensors of the whole weights
            model.save_pretrained(staging / ADAPTER_DIR, state_dict=weights)
        served = merged_lora_weights(model, weights)
        target = model.get_base_model()
    else:
        served, target = weights, model
    served = {n: t.to(dtype) for n, t in served.items() if isinstance(t, torch.Tensor)}
    target.save_pretrained(staging, state_dict=served)
    tokenizer.save_pretrained(staging)


def write_sharded_weights(
    model, tokenizer, staging: Path, adapter_only: bool, dtype: torch.dtype
) -> None:
    """A hot push's export from an FSDP model: every rank gathers, rank 0 writes `staging`
    (the adapter alone when `adapter_only`, else the whole weights, LoRA merged)."""
    weights = gathered_weights(model)
    if weights is None:
        return
    if adapter_only:
        model.save_pretrained(staging, state_dict=weights)  # peft keeps the adapter's tensors
        return
    write_served(model, tokenizer, staging, weights, dtype, with_adapter=False)


def save_sharded_checkpoint(
    save_path: str, step: int, model, tokenizer, optimizer, scheduler, dtype: torch.dtype
) -> Path:
    """`save_checkpoint` for an FSDP model; every rank calls it (see the module docstring).
    The weights are written in `dtype`, what the engine serves."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    main = dist.get_rank() == 0
    target, staging = _paths(save_path, step)
    if main:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    weights = gathered_weights(model)
    if weights is not None:
        write_served(model, tokenizer, staging, weights, dtype)
        torch.save(_trainer_state(step, OPTIMIZER_DIR, scheduler), staging / STATE_FILE)
    del weights
    dist.barrier()  # staging exists before any rank writes its shard into it
    dcp.save(
        {"optimizer": get_optimizer_state_dict(model, optimizer)},
        checkpoint_id=str(staging / OPTIMIZER_DIR),
    )
    # the fp32 shards are the masters; the served weights above are in `dtype` (CK-2)
    dcp.save({"masters": trainable_state(model)}, checkpoint_id=str(staging / MASTERS_DIR))
    dist.barrier()  # every shard is written before the checkpoint is committed
    if main:
        _commit(staging, target)
    dist.barrier()  # no rank goes on (and tells the API) before the commit
    return target


def load_trainer_state(
    checkpoint: str, optimizer, scheduler, restore_optimizer: bool = True, model=None
) -> int:
    """Restore what `save_checkpoint` kept beside the weights; the checkpoint's step."""
    state: dict[str, Any] = torch.load(Path(checkpoint) / STATE_FILE, weights_only=False)
    if restore_optimizer and state["optimizer"] == OPTIMIZER_DIR:
        _load_sharded_optimizer(Path(checkpoint) / OPTIMIZER_DIR, model, optimizer)
    elif restore_optimizer:
        optimizer.load_state_dict(state["optimizer"])
    if model is not None and restore_optimizer:  # the weights as the optimizer left them
        _load_masters(Path(checkpoint), state, model)
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    cuda_rng = state.get("cuda_rng")
    if cuda_rng and torch.cuda.is_available() and len(cuda_rng) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda_rng)
    return int(state["step"])


def trainable_state(model) -> dict[str, Any]:
    """`model`'s state dict (DTensor shards under FSDP) restricted to what trains."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return {n: t for n, t in get_model_state_dict(model).items() if n in trainable}


def _load_masters(checkpoint: Path, state: dict[str, Any], model) -> None:
    """The fp32 masters a checkpoint kept (CK-2), into `model`, the module of what the
    optimizer steps: from an FSDP checkpoint's shards (resharded onto any number of
    ranks, one included) or from a bf16 run's trainer state. A checkpoint of an fp32
    run keeps none: its served weights are the masters."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if (checkpoint / MASTERS_DIR).is_dir():
        import torch.distributed.checkpoint as dcp

        masters = {"masters": trainable_state(model)}
        dcp.load(masters, checkpoint_id=str(checkpoint / MASTERS_DIR))
        kept = masters["masters"]
    elif "masters" in state:
        kept = state["masters"]
    else:
        return
    set_model_state_dict(model, kept, options=StateDictOptions(strict=False))


def _load_sharded_optimizer(folder: Path, model, optimizer) -> None:
    """An FSDP checkpoint's optimizer state, resharded onto this run's ranks (any number,
    one included). `model`: the module whose named parameters the optimizer steps (in a
    bf16 run without FSDP, the fp32 masters under the model's names: `MasterWeights`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    if model is None:
        raise ValueError(f"{folder} holds a sharded optimizer state: pass the model it steps")
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=str(folder))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


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
