"""The process group a trainer makes, and where its per-step collectives run (DP-1 of the
trainer review: on GPUs the group was nccl alone, which maps CUDA tensors only, and two
collectives a step held CPU tensors, so every multi-GPU run died at its first step).

No GPU here: the trainer's own `init_data_parallel` is asked for a CUDA group with
torch's `init_process_group` standing in (it records the backend it was given, whose
device map torch's own parser reads), and the collectives' device is read by a
stand-in for `all_reduce` on a trainer that says it trains on `meta` (a device no
collective of the old code would have used).
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch.distributed.distributed_c10d import Backend, BackendConfig  # noqa: E402

from example_trainer.distributed import DataParallel, init_data_parallel  # noqa: E402
from example_trainer.sharding import padded_micro_batch_count  # noqa: E402

pytestmark = pytest.mark.unit


def group_made_for(device: str, monkeypatch) -> tuple[DataParallel, str]:
    """The DataParallel and the backend spec `init_data_parallel` makes for `device`."""
    made = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: made.append(backend))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    parallel, _ = init_data_parallel(torch.device(device), group_of_one=True)
    return parallel, made[0]


@pytest.mark.parametrize(
    ("device", "served"),
    [("cuda", {"cpu": "gloo", "cuda": "nccl"}), ("cpu", {"cpu": "gloo", "cuda": "gloo"})],
    ids=["cuda", "cpu"],
)
def test_the_group_serves_the_training_device_and_the_cpu(device, served, monkeypatch):
    """FSDP's CPU offload reduces CPU gradients' norms, and a metric may be a CPU tensor:
    a GPU run's group needs a CPU backend beside nccl."""
    _, spec = group_made_for(device, monkeypatch)
    assert BackendConfig(Backend(spec)).get_device_backend_map() == served


class Refused(Exception):
    pass


def test_the_step_collectives_hold_their_tensors_on_the_training_device(monkeypatch):
    parallel, _ = group_made_for("meta", monkeypatch)
    two_ranks = dataclasses.replace(parallel, world_size=2)
    seen = []

    def all_reduce(tensor, op=None, **kwargs):
        seen.append(tensor.device)
        raise Refused  # a meta tensor holds no values to reduce

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    meta = torch.device("meta")
    with pytest.raises(Refused):
        two_ranks.sum({"loss": 1.0})
    assert seen == [meta], "the step's metrics are reduced off the training device"
    with pytest.raises(Refused):
        padded_micro_batch_count(3, True, meta)
    assert seen == [meta, meta]


def test_a_share_may_be_empty_and_every_sequence_has_one_rank():
    """DP-2: fewer sequences than ranks left the step (and every resume of it) raising."""
    items = ["a", "bbb", "cc"]
    shares = [DataParallel(rank, 4).shard(items, len) for rank in range(4)]
    assert shares == [["a"], ["cc"], ["bbb"], []]
