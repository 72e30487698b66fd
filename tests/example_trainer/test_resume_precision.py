"""A resume goes on from the fp32 weights the optimizer left, not from the bf16 ones the
engine serves (CK-2 of the trainer review: every resume rounded the masters to bf16, so
updates below a bf16 ulp, most of them at small learning rates, were lost at each one).

Each case trains one step of the tiny model at a learning rate whose updates are mostly
below a bf16 ulp, checkpoints it and resumes it, in this process: without FSDP (fp32
masters beside bf16 weights) and under FSDP as a group of one (fp32 shards that are
their own masters). And an FSDP checkpoint resumes in a bf16 run without FSDP (CK-1).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.support.trainer_batches import batch, make_trainer  # noqa: E402

pytestmark = pytest.mark.integration


def masters(trainer) -> dict[str, torch.Tensor]:
    """What the optimizer steps, whole, by the model's parameter names."""
    named = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
    return {
        name: (m.full_tensor() if hasattr(m, "full_tensor") else m).detach().float().clone()
        for name, (_, m) in zip(named, trainer.master.pairs, strict=True)
    }


def ended_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_a_resume_goes_on_from_the_fp32_masters(tiny_model_path, tmp_path, parallelism):
    settings = {"dtype": "bfloat16", "lr": 1e-6, "parallelism": parallelism}
    try:
        trainer = make_trainer(tiny_model_path, tmp_path, **settings)
        trainer.train_step(batch())
        trainer.step = 1
        checkpoint = trainer.save()
        before = masters(trainer)
    finally:
        ended_group()
    rounded = [n for n, w in before.items() if not torch.equal(w, w.bfloat16().float())]
    assert rounded, "the step's updates fit bf16: the case cannot tell"
    try:
        resumed = make_trainer(
            tiny_model_path, tmp_path / "again", resume=str(checkpoint), **settings
        )
        after = masters(resumed)
    finally:
        ended_group()
    assert resumed.step == 1 and after.keys() == before.keys()
    for name, weight in before.items():
        assert torch.equal(after[name], weight), name


def test_an_fsdp_checkpoint_resumes_in_a_bf16_run_without_fsdp(tiny_model_path, tmp_path):
    """CK-1 of the trainer review: the optimizer state is named through the model, whose
    bf16 parameters are not what the optimizer steps (its fp32 masters), so the resume
    raised KeyError. The masters now stand in under the model's names."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
    try:
        sharded = make_trainer(tiny_model_path, tmp_path, parallelism="fsdp", lr=1e-4)
        sharded.train_step(batch())
        sharded.step = 1
        checkpoint = sharded.save()
        saved = get_optimizer_state_dict(sharded.model, sharded.optimizer, options=whole)
    finally:
        ended_group()
    resumed = make_trainer(
        tiny_model_path, tmp_path / "bf16", resume=str(checkpoint), dtype="bfloat16"
    )
    module = resumed.master.stepped_module(resumed.model)
    loaded = get_optimizer_state_dict(module, resumed.optimizer)
    assert resumed.step == 1 and module is not resumed.model
    assert loaded["state"].keys() == saved["state"].keys()
    for name, state in saved["state"].items():
        for key, value in state.items():
            got = torch.as_tensor(loaded["state"][name][key])
            assert torch.equal(got, torch.as_tensor(value)), f"{name}.{key}"
