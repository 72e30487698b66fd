"""The process group a trainer makes, and where its per-step collectives run (DP-1 of the
trainer review: on GPUs the group was nccl alone, which maps CUDA tensors only, and two
collectives a step held CPU tensors, so every multi-GPU run died at its first step).

No GPU here: the group's device map is torch's own reading of the backend spec the
trainer asks for, and the collectives' device is read by a stand-in for `all_reduce`
on a trainer that says it trains on `meta` (a device no collective of the old code
would have used).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from torch.distributed.distributed_c10d import Backend, BackendConfig  # noqa: E402

from example_trainer.distributed import DataParallel, process_group_backend  # noqa: E402
from example_trainer.sharding import padded_micro_batch_count  # noqa: E402

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("device", "served"),
    [("cuda", {"cpu": "gloo", "cuda": "nccl"}), ("cpu", {"cpu": "gloo", "cuda": "gloo"})],
)
def test_the_group_serves_the_training_device_and_the_cpu(device, served):
    """FSDP's CPU offload reduces CPU gradients' norms, and a metric may be a CPU tensor:
    a GPU run's group needs a CPU backend beside nccl."""
    spec = process_group_backend(torch.device(device))
    assert BackendConfig(Backend(spec)).get_device_backend_map() == served


class Refused(Exception):
    pass


def test_the_step_collectives_hold_their_tensors_on_the_training_device(monkeypatch):
    seen = []

    def all_reduce(tensor, op=None, **kwargs):
        seen.append(tensor.device)
        raise Refused  # a meta tensor holds no values to reduce

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    meta = torch.device("meta")
    with pytest.raises(Refused):
        DataParallel(rank=0, world_size=2, device=meta).sum({"loss": 1.0})
    with pytest.raises(Refused):
        padded_micro_batch_count(3, True, meta)
    assert seen == [meta, meta]


def test_a_share_may_be_empty_and_every_sequence_has_one_rank():
    """DP-2: fewer sequences than ranks left the step (and every resume of it) raising."""
    items = ["a", "bbb", "cc"]
    shares = [DataParallel(rank, 4).shard(items, len) for rank in range(4)]
    assert shares == [["a"], ["cc"], ["bbb"], []]
