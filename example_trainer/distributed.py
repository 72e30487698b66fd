"""Data parallelism across `torchrun` processes.

Design: rank 0 alone talks to the API and the inference engine; it broadcasts
each batch to every rank. Each rank trains on a length-balanced shard (the
sequences sorted by length and dealt round-robin) and normalises its loss by
the counts of the *whole* batch, so the sum of the ranks' gradients is the
single-process gradient. DDP averages gradients across ranks, so each rank
scales its loss by the world size to turn that average back into the sum.
Backends: on GPUs the group serves both devices (`cpu:gloo,cuda:nccl`): nccl alone maps
only CUDA tensors, and a CPU one (FSDP's offloaded gradients' norm, a metric) then has no
backend at all (DP-1 of the trainer review: every multi-GPU run died at its first step).
The per-step collectives run on the training device besides. On CPU, gloo. Without
torchrun this is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

# rank 0 may wait a long time for data or an engine restart while the others block
COLLECTIVE_TIMEOUT = timedelta(hours=4)
# ranks meet before tearing down; a peer that already died must not hold up the exit
CLOSE_BARRIER_TIMEOUT = timedelta(seconds=30)


def process_group_backend(device: torch.device) -> str:
    """The backend spec for a group training on `device`: one for every device type a
    collective may hold (the training device's, and the CPU's)."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


@dataclass(frozen=True)
class DataParallel:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    """The training device: the per-step collectives' tensors live there."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def broadcast(self, value: Any) -> Any:
        """rank 0's `value` on every rank."""
        if not self.enabled:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: dict[str, float]) -> dict[str, float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: dict[str, float], op: Any) -> dict[str, float]:
        """Every rank's `values` (the same keys on each) joined by `op`."""
        if not self.enabled or not values:
            return values
        keys = sorted(values)
        tensor = torch.tensor(
            [float(values[k]) for k in keys], dtype=torch.float64, device=self.device
        )
        dist.all_reduce(tensor, op=op)
        return dict(zip(keys, tensor.tolist(), strict=True))

    def shard(self, items: list[T], length) -> list[T]:
        """This rank's share: sorted by length, dealt round-robin (balanced compute). A
        share may be empty (fewer sequences than ranks, as after --max-staleness drops
        them): that rank then runs an idle pass, so every collective still meets (DP-2)."""
        if not self.enabled:
            return items
        return sorted(items, key=length)[self.rank :: self.world_size]

    def close(self) -> None:
        if dist.is_initialized():
            if self.enabled and dist.get_backend() == "gloo":
                # all ranks arrive before any tears down: a rank that destroys its group
                # while a peer's gloo connection is open can abort that peer ("terminate
                # called without an active exception", seen in CI); bounded, so a rank
                # whose peer already died still exits
                try:
                    dist.monitored_barrier(timeout=CLOSE_BARRIER_TIMEOUT)
                except RuntimeError:
                    pass
            dist.destroy_process_group()


def init_data_parallel(
    device: torch.device, group_of_one: bool = False
) -> tuple[DataParallel, torch.device]:
    """Join the torchrun group when launched by torchrun; pick this rank's device.

    `group_of_one`: without torchrun, still start a process group of one (FSDP shards
    within a group, so a single process trains and checkpoints as one rank of many)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        if group_of_one and not dist.is_initialized():
            backend = process_group_backend(device)
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return DataParallel(device=device), device
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(process_group_backend(device), timeout=COLLECTIVE_TIMEOUT)
    return DataParallel(dist.get_rank(), dist.get_world_size(), local_rank, device), device
