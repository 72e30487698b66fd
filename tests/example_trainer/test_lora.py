"""LoRA (`--weight-bridge-mode lora_restart`): adapters train, the engine gets merged weights."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from example_trainer.checkpoint import save_checkpoint  # noqa: E402
from example_trainer.config import TrainingConfig  # noqa: E402
from example_trainer.grpo import Trainer  # noqa: E402
from tests.support.trainer_batches import batch  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def peft_installed() -> None:
    """Skips without peft, importing it only where these tests run: its import (with
    bitsandbytes) costs 4 s of CPU, at collection in every pytest process."""
    pytest.importorskip("peft")


def test_lora_trains_adapters_only_and_saves_merged_weights(tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    config = TrainingConfig(
        model_name=str(tiny_model_path),
        weight_bridge_mode="lora_restart",
        lora_r=4,
        lora_target_modules="q_proj,v_proj",
        lr=1e-2,
        save_path=str(tmp_path),
        device="cpu",
        inference_engine="none",
    )
    trainer = Trainer(config)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    for _ in range(3):
        trainer.train_step(batch())
    trainer.step = 3
    path = save_checkpoint(
        str(tmp_path), 3, trainer.model, trainer.tokenizer, trainer.optimizer, trainer.scheduler
    )
    merged = AutoModelForCausalLM.from_pretrained(path).state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    assert not any("lora" in key for key in merged)
    changed = [k for k in base if not torch.equal(base[k], merged[k])]
    assert changed and all("q_proj" in k or "v_proj" in k for k in changed)
    assert any("lora_" in n for n, _ in trainer.model.named_parameters()), "adapters survive saving"
    trainer.train_step(batch())  # still trainable after the checkpoint


def test_lora_resume_restores_the_adapter_and_its_optimizer_state(tiny_model_path, tmp_path):
    """§1.8: resume built fresh adapters on the merged weights and gave them the old moments."""
    settings = {
        "model_name": str(tiny_model_path),
        "weight_bridge_mode": "lora_restart",
        "lora_r": 4,
        "lr": 1e-2,
        "save_path": str(tmp_path),
        "device": "cpu",
        "inference_engine": "none",
    }
    trainer = Trainer(TrainingConfig(**settings))
    for _ in range(2):
        trainer.train_step(batch())
    trainer.step = 2
    path = trainer.save()
    resumed = Trainer(TrainingConfig(**settings, resume=str(path)))
    assert resumed.step == 2

    def adapters(t: Trainer) -> dict:
        return {n: p.detach() for n, p in t.model.named_parameters() if p.requires_grad}

    before, after = adapters(trainer), adapters(resumed)
    assert before.keys() == after.keys() and before
    for name in before:
        assert torch.equal(before[name], after[name]), name
    moments = [trainer.optimizer.state[p] for p in trainer.optimizer.param_groups[0]["params"]]
    restored = [resumed.optimizer.state[p] for p in resumed.optimizer.param_groups[0]["params"]]
    for old, new in zip(moments, restored, strict=True):
        assert torch.equal(old["exp_avg"], new["exp_avg"])
    ids = torch.tensor([batch()[0]["tokens"][0]])
    trainer.model.eval(), resumed.model.eval()  # no LoRA dropout
    with torch.no_grad():
        expected = trainer.model(input_ids=ids).logits
        got = resumed.model(input_ids=ids).logits
    torch.testing.assert_close(got, expected)  # the base under the adapter, not merged twice
    resumed.model.train()
    assert resumed.train_step(batch())["grad_norm"] > 0  # the adapters still train


@pytest.mark.parametrize("disable_dropout", [True, False])
def test_the_training_forward_is_one_function_unless_dropout_is_kept(
    tiny_model_path, tmp_path, disable_dropout
):
    """DROP-1 of the trainer review: LoRA's dropout (0.05 by default) stayed on in the
    training forward, so the ratio and the importance weights clipped its noise."""
    from tests.support.trainer_batches import make_trainer

    trainer = make_trainer(
        tiny_model_path,
        tmp_path,
        weight_bridge_mode="lora_restart",
        disable_dropout=disable_dropout,
    )
    assert trainer.model.training
    with torch.no_grad():  # adapters as after some training: B no longer zero
        torch.manual_seed(0)
        for name, parameter in trainer.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.02)
        ids = torch.arange(3, 40).reshape(1, -1)
        first, second = (trainer.model(input_ids=ids).logits for _ in range(2))
    assert torch.equal(first, second) == disable_dropout
