"""FSDP2: each rank holds 1/N of the parameters, gradients and optimizer state.

torch's own `fully_shard`, nothing written here: one FSDP unit per decoder layer (the
classes a transformers model names in `_no_split_modules`, as Accelerate wraps them)
and one for the root, which holds the embeddings, the final norm and the head.

Precision: the sharded parameters stay float32, so they are the master weights and
the optimizer steps them directly; `MixedPrecisionPolicy` gathers each unit's
parameters in bfloat16 for the forward and backward (a bf16 run) and reduce-scatters
gradients in float32, so small updates and gradient sums keep their bits. Load the
model in float32 (`model.load_policy(..., sharded=True)`) and let the policy cast.

Gradients: FSDP averages across ranks, as DDP does, and the trainer already scales
its loss by the world size to turn that average into the whole batch's sum
(`distributed.py`). Every rank must run the same number of forward passes, since
each one gathers parameters collectively: `padded_micro_batch_count` says how many.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from example_trainer.vision import vision_tower


def decoder_layers(model: Any) -> list[nn.Module]:
    """The modules that become one FSDP unit each: the model's repeated blocks, less a
    vision-language model's picture encoder, which stays in the root unit. A unit gathers
    its shards only when it runs, and a rank whose micro-batch holds no picture (an idle
    pass, a text-only group) would skip the encoder's gathers that another rank makes."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    tower = vision_tower(model)
    encoder = set() if tower is None else {id(m) for m in tower[1].modules()}
    layers = [m for m in model.modules() if type(m).__name__ in names and id(m) not in encoder]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} names no repeated layer (_no_split_modules) to shard by"
        )
    return layers


def shard(
    root: nn.Module,
    model: Any,
    compute_dtype: torch.dtype,
    cpu_offload: bool = False,
) -> nn.Module:
    """`fully_shard` each decoder layer of `model`, then `root` (the module the loss
    calls, which holds `model`); returns `root`, now sharded."""
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    precision = MixedPrecisionPolicy(
        param_dtype=None if compute_dtype == torch.float32 else compute_dtype,
        reduce_dtype=torch.float32,
    )
    # pinned host memory speeds copies to a GPU; a machine without one cannot pin
    offload = (
        CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload else OffloadPolicy()
    )
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=precision, offload_policy=offload)
    fully_shard(root, mp_policy=precision, offload_policy=offload)
    return root


def padded_micro_batch_count(local_count: int, enabled: bool, device: torch.device) -> int:
    """The most micro-batches any rank has this step: the count every rank runs (the
    collective on the training device, `device`)."""
    if not enabled:
        return local_count
    count = torch.tensor([local_count], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def local_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes this rank stores for `tensors` (a sharded tensor counts its own shard)."""
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += local.numel() * local.element_size()
    return total


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
