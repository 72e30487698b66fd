"""The training loop's edges: engine restarts that fail, the last step, pruning, the logged lr.

The engine is the real CPU engine (`--inference-engine transformers`) on the tiny
model; a checkpoint it cannot load is a directory with a config and no weights.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

torch = pytest.importorskip("torch")

from atroposlib.inference.launcher import EngineError  # noqa: E402
from atroposlib.trainer_contract import read_events, read_metrics  # noqa: E402
from atroposlib.utils.ports import free_port  # noqa: E402
from example_trainer.checkpoint import prune_checkpoints  # noqa: E402
from example_trainer.grpo import Trainer  # noqa: E402
from tests.support.trainer_batches import (  # noqa: E402
    PROMPT,
    make_trainer,
    post_groups,
    rollout_group,
)


def with_engine(model: Path, save: Path, **overrides) -> Trainer:
    return make_trainer(
        model, save, inference_engine="transformers", vllm_port=free_port(), **overrides
    )


def events(save: Path) -> list[tuple]:
    return [
        (e.kind.value, e.step, e.detail.get("reason"), Path(e.detail.get("model", "")).name)
        for e in read_events(save / "events.jsonl")
    ]


def cut_short(checkpoint: Path) -> None:
    """Only the config is left: the engine refuses it before its imports (no weights,
    atroposlib.utils.model_files), where a checkpoint that still held the trainer's
    state (`trainer_state.pt`) would cost a failed load on every try."""
    for path in checkpoint.iterdir():
        if path.name != "config.json":
            path.unlink()


def test_a_failed_restart_is_retried_then_falls_back_then_gives_up_and_the_last_step_only_saves(
    api, wire_client, tiny_model_path, tmp_path
):
    """§1.8: a restart that failed used to raise out of the run at once, and the last
    step restarted the engine only for the run's end to stop it. One run of 2 steps
    restarting at every step: step 1's checkpoint is cut short (no weights), so its
    restart is tried twice and falls back to the base model; step 2, the last, saves
    and restarts nothing. The fallback serves the base model's weights under their own
    label, 0, not step 1's (VER-1 of the trainer review: staleness was counted from the
    new step). Then, with the base model's weights gone too, a dead engine's restart
    gives up and names both."""
    base = tmp_path / "base"
    shutil.copytree(tiny_model_path, base)
    save = tmp_path / "ckpt"
    trainer = with_engine(
        base, save, atropos_url=api.url, training_steps=2, vllm_restart_interval=1
    )
    checkpoint = trainer.save

    labels = []

    def cut_short_at_step_one() -> Path:
        path = checkpoint()
        if trainer.step == 1:
            cut_short(path)
        else:  # what the engine that fell back says it serves
            labels.append(httpx.get(f"{trainer.engines[0].url}/weight_info").json())
        return path

    trainer.save = cut_short_at_step_one  # type: ignore[method-assign]
    post_groups(wire_client, 2)
    trainer.run()
    assert events(save) == [
        ("engine_started", 0, None, "base"),
        ("checkpoint_saved", 1, None, ""),
        ("engine_restart_failed", 1, "new weights", "step-1"),
        ("engine_restart_failed", 1, "new weights", "step-1"),
        ("engine_restarted", 1, "fallback: new weights", "base"),
        ("checkpoint_saved", 2, None, ""),
    ]
    assert labels == [{"weight_version": "0"}]
    restarted = [
        e for e in read_events(save / "events.jsonl") if e.kind.value == "engine_restarted"
    ]
    assert restarted[0].detail["weights_step"] == 0
    assert (save / "step-2" / "model.safetensors").exists()
    assert not trainer.engines[0].alive()

    for model in (save / "step-2", base):  # now neither the newest nor the fallback loads
        cut_short(model)
    with pytest.raises(EngineError, match="nor on the previous checkpoint"):
        trainer.ensure_engines()  # the engine the run stopped is dead to it
    assert events(save)[6:] == [
        ("engine_crashed", 2, None, "step-2"),
        ("engine_restart_failed", 2, "engine died", "step-2"),
        ("engine_restart_failed", 2, "engine died", "step-2"),
        ("engine_restart_failed", 2, "fallback: engine died", "base"),
    ]


def test_keep_checkpoints_prunes_all_but_the_newest(api, wire_client, tiny_model_path, tmp_path):
    """§1.8: every restart interval wrote a full checkpoint and none was ever removed."""
    save = tmp_path / "ckpt"
    trainer = make_trainer(
        tiny_model_path,
        save,
        atropos_url=api.url,
        training_steps=4,
        vllm_restart_interval=1,
        keep_checkpoints=2,
    )
    post_groups(wire_client, 4)
    trainer.run()
    assert sorted(p.name for p in save.glob("step-*")) == ["step-3", "step-4"]
    resumed = make_trainer(tiny_model_path, save, resume=str(save / "step-4"))
    assert resumed.step == 4


def test_pruning_spares_the_served_checkpoint_and_what_is_not_a_checkpoint(
    tiny_model_path, tmp_path
):
    trainer = make_trainer(tiny_model_path, tmp_path)
    for step in (1, 2, 3, 4):
        trainer.step = step
        trainer.save()
    (tmp_path / ".step-5.partial").mkdir()
    (tmp_path / "step-0").mkdir()  # no trainer state: not a checkpoint of this trainer
    assert prune_checkpoints(tmp_path, 0) == []
    removed = prune_checkpoints(tmp_path, 1, protect=[tmp_path / "step-2", None])
    assert sorted(p.name for p in removed) == ["step-1", "step-3"]
    left = sorted(p.name for p in tmp_path.iterdir() if "step" in p.name)
    assert left == [".step-5.partial", "step-0", "step-2", "step-4"]


def test_the_logged_learning_rate_is_the_one_the_step_used(tiny_model_path, tmp_path):
    """§1.7: the metric was read after scheduler.step(), i.e. the next step's lr."""
    trainer = make_trainer(tiny_model_path, tmp_path, lr=1e-2, warmup_steps=4)
    for step in range(6):
        used = trainer.optimizer.param_groups[0]["lr"]
        assert used == pytest.approx(1e-2 * min(1.0, (step + 1) / 4))
        assert trainer.train_step([rollout_group()])["lr"] == used


def test_a_steps_row_has_trls_rollout_figures_and_its_line_fits_80_columns(
    tiny_model_path, tmp_path, caplog
):
    """The row the launcher and its report read (`read_metrics`) carries TRL's figures;
    the console gets one line that fits beside the launcher's prefix."""
    trainer = make_trainer(tiny_model_path, tmp_path, seq_len=8)
    completion = [7, 8, 9, 7, 8, 2]  # 6 trained tokens, of which the cut at 8 keeps 5
    long = rollout_group(
        tokens=[PROMPT + completion] * 2,
        masks=[[-100] * 3 + completion] * 2,
        inference_logprobs=[[1.0] * 3 + [-0.5] * 6] * 2,
        scores=[0.5, 0.5],  # no spread
    )
    metrics = trainer.train_step([rollout_group(), long])  # 2 trained tokens each, and EOS
    trainer.step = 1
    metrics.update(wait_s=0.5, train_s=0.25, sync_s=0.0, tokens_per_s=10.0)
    with caplog.at_level("INFO", logger="example_trainer"):
        trainer.log(metrics)
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    figures = row.model_extra or {}
    assert figures["frac_reward_zero_std"] == 0.5
    assert figures["completions/mean_length"] == (2 + 2 + 5 + 5) / 4
    assert figures["completions/min_length"] == 2.0 and figures["completions/max_length"] == 5.0
    assert figures["completions/clipped_ratio"] == 0.5  # the cut took the long ones' EOS
    assert figures["completions/mean_terminated_length"] == 2.0
    assert figures["tokens_per_s"] == 10.0  # no longer on the line, still in the row
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 1/")]
    assert line.startswith(f"step 1/{trainer.config.optim.training_steps} score 0.500 loss ")
    assert line.endswith(" 0.8s") and len("trainer        | " + line) <= 80
