"""The optional optimizers train when their libraries are present; wandb logs offline."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from example_trainer.config import TrainingConfig  # noqa: E402
from example_trainer.grpo import Trainer  # noqa: E402
from tests.support.trainer_batches import batch  # noqa: E402
from tests.support.wandb_offline import offline_runs  # noqa: E402

LIBRARY = {"adamw": "torch", "adamw_8bit": "bitsandbytes", "adafactor": "transformers"}


def make_trainer(tiny_model_path, tmp_path, **overrides) -> Trainer:
    config = TrainingConfig(
        model_name=str(tiny_model_path),
        lr=1e-2,
        save_path=str(tmp_path),
        device="cpu",
        inference_engine="none",
        **overrides,
    )
    return Trainer(config)


@pytest.mark.parametrize("optimizer", sorted(LIBRARY))
def test_each_optimizer_moves_the_weights(optimizer, tiny_model_path, tmp_path):
    pytest.importorskip(LIBRARY[optimizer])
    trainer = make_trainer(tiny_model_path, tmp_path, optimizer=optimizer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    metrics = trainer.train_step(batch())
    assert metrics["grad_norm"] > 0
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)]
    assert len(moved) > len(before) // 2, f"{optimizer} left most weights untouched"


def test_missing_optimizer_library_is_a_clear_error(tiny_model_path, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import now raises ImportError
    with pytest.raises(SystemExit, match="pip install bitsandbytes"):
        make_trainer(tiny_model_path, tmp_path, optimizer="adamw_8bit")


def test_wandb_logs_offline_without_a_key(tiny_model_path, tmp_path, fresh_wandb):
    trainer = make_trainer(tiny_model_path, tmp_path, use_wandb=True, wandb_project="unit")
    metrics = trainer.train_step(batch())
    trainer.step = 1
    trainer.log({**metrics, "wait_s": 0.0, "train_s": 0.1, "restart_s": 0.0, "tokens_per_s": 1.0})
    trainer.step_log.close()
    (run,) = offline_runs(tmp_path / "wandb")
    assert "train/loss" in run.keys, sorted(run.keys)
