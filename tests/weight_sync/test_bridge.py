"""`--weight-bridge-mode hot_reload`: the trainer pushes its weights into the running CPU engine.

The trainer runs in this process against a real `run-api` fed scripted groups and
the real CPU engine (`--inference-engine transformers`) on the tiny model. The
engine's own `/weight_info` says which step it serves. A push an engine refuses, and
an engine killed mid-run, are in tests/weight_sync/test_engines.py, on two engines.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

torch = pytest.importorskip("torch")

from atroposlib.envs.scored_data import group_from_chat  # noqa: E402
from atroposlib.envs.server_handling.sequence_node import SequenceNode  # noqa: E402
from atroposlib.inference.supervised import SupervisedEngine as Engine  # noqa: E402
from atroposlib.protocol import ScoredData  # noqa: E402
from atroposlib.trainer_contract import read_events, read_metrics  # noqa: E402
from atroposlib.weight_sync import bridge as weight_bridge  # noqa: E402
from atroposlib.weight_sync.versions import (  # noqa: E402
    FinishReason,
    choice_weight_version,
    weight_version_of,
)
from example_trainer.config import HOT_MODE_CHECKPOINT_INTERVAL, TrainingConfig  # noqa: E402
from example_trainer.data import flatten, staleness  # noqa: E402
from example_trainer.grpo import Trainer  # noqa: E402
from tests.support.trainer_batches import hot_trainer, post_groups, rollout_group  # noqa: E402


def events(save: Path) -> list[tuple]:
    return [
        (e.kind.value, e.step, e.detail.get("reason"), Path(e.detail.get("model", "")).name)
        for e in read_events(save / "events.jsonl")
    ]


def served_version(trainer: Trainer) -> str | None:
    return httpx.get(f"{trainer.engines[0].process.url}/weight_info", timeout=30).json()[
        "weight_version"
    ]


@pytest.fixture
def last_served(monkeypatch) -> list:
    """What each engine the trainer stops was serving, read just before it stops."""
    seen: list = []
    stop = Engine.stop

    def reading_stop(engine: Engine) -> None:
        if engine.alive():
            url = engine.process.url
            seen.append(httpx.get(f"{url}/weight_info", timeout=30).json()["weight_version"])
        stop(engine)

    monkeypatch.setattr(Engine, "stop", reading_stop)
    return seen


# ------------------------------------------------------------ whole runs
def test_hot_reload_syncs_without_restarts_checkpoints_on_its_interval_and_survives_a_full_disk(
    api, wire_client, tiny_model_path, tmp_path, monkeypatch, last_served
):
    """Five steps pushing after each but the last; the first push's export meets a full
    disk. MISC (review of e6a9d2c): such an export restarted the engine on every step,
    and each restart failed to export the same way; now that push is skipped, the engine
    keeps its weights, and the next step's push lands on it."""
    export = weight_bridge.export_weights
    full = []

    def export_on_a_full_disk_once(model, tokenizer, target, adapter_only, write=None):
        if not full:
            full.append(target.name)
            raise OSError(errno.ENOSPC, "No space left on device")
        return export(model, tokenizer, target, adapter_only, write)

    monkeypatch.setattr(weight_bridge, "export_weights", export_on_a_full_disk_once)
    save = tmp_path / "ckpt"
    # upstream's --checkpoint-interval spelling; the restart interval must not matter
    trainer = hot_trainer(
        tiny_model_path,
        save,
        api.url,
        training_steps=5,
        checkpoint_interval=2,
        vllm_restart_interval=1,
    )
    assert trainer.config.checkpoint.save_checkpoint_interval == 2
    post_groups(wire_client, 5, weight_versions=["0", "0"])
    trainer.run()

    assert full == ["step-1"]
    assert events(save) == [
        ("engine_started", 0, None, tiny_model_path.name),
        ("weight_sync_failed", 1, None, ""),
        ("checkpoint_saved", 2, None, ""),
        ("checkpoint_saved", 4, None, ""),
        ("checkpoint_saved", 5, None, ""),
    ]
    assert sorted(p.name for p in save.glob("step-*")) == ["step-2", "step-4", "step-5"]
    rows = {row.step: row.model_dump() for row in read_metrics(save / "metrics.jsonl")}
    assert sorted(rows) == [1, 2, 3, 4, 5]
    assert rows[1]["sync_s"] == 0, "the push the full disk skipped"
    assert all(rows[s]["sync_s"] > 0 for s in (2, 3, 4)), "a sync step recorded no sync"
    assert rows[5]["sync_s"] == 0, "the last step pushed weights to an engine about to stop"
    # every group was sampled by step 0's weights: step s trained on s - 1 steps old data
    assert [rows[s]["staleness_max"] for s in (1, 2, 3, 4, 5)] == [0, 1, 2, 3, 4]
    assert rows[3]["staleness_mean"] == 2
    assert last_served == ["4"], "the engine does not serve the last synced step"
    assert sorted(p.name for p in (save / "live").iterdir()) == ["step-3", "step-4"]
    from transformers import AutoModelForCausalLM

    pushed = AutoModelForCausalLM.from_pretrained(save / "live" / "step-4").state_dict()
    checkpoint = AutoModelForCausalLM.from_pretrained(save / "step-4").state_dict()
    assert all(torch.equal(pushed[k], checkpoint[k]) for k in checkpoint)


# ------------------------------------------------------------ configuration
def test_hot_modes_checkpoint_by_default_and_restart_modes_need_not():
    """RUN-1: hot modes saved nothing before the last step, so any crash lost the run."""
    for mode in ("hot_reload", "lora_only", "shared_vllm"):
        config = TrainingConfig(model_name="m", weight_bridge_mode=mode)
        assert config.checkpoint.save_checkpoint_interval == HOT_MODE_CHECKPOINT_INTERVAL == 10
    for mode in ("none", "restart", "lora_restart"):
        restart = TrainingConfig(model_name="m", weight_bridge_mode=mode)
        assert restart.checkpoint.save_checkpoint_interval == 0
    explicit = TrainingConfig(
        model_name="m", weight_bridge_mode="hot_reload", checkpoint_interval=0
    )
    assert explicit.checkpoint.save_checkpoint_interval == 0  # asked for: only the last


def test_checkpoint_interval_is_an_alias_and_a_disagreement_is_refused(tmp_path, capsys):
    aliased = TrainingConfig(model_name="m", checkpoint_interval=4)
    assert aliased.checkpoint.save_checkpoint_interval == 4
    both = TrainingConfig(model_name="m", save_checkpoint_interval=4, checkpoint_interval=4)
    assert both.checkpoint.save_checkpoint_interval == 4
    with pytest.raises(ValueError, match="disagree"):
        TrainingConfig(model_name="m", save_checkpoint_interval=3, checkpoint_interval=4)
    # atropos-grpo's own entry point, in this process: a usage error (exit 2) that names
    # the two flags, before any model is loaded (an exception would escape instead)
    from example_trainer.grpo import main

    with pytest.raises(SystemExit) as stop:
        main(
            ["--model-name", str(tmp_path / "never-loaded")]
            + ["--checkpoint-interval", "2", "--save-checkpoint-interval", "3"]
        )
    assert stop.value.code == 2
    assert "disagree" in capsys.readouterr().err


# ------------------------------------------------------------ units
def scored(**fields) -> ScoredData:
    return ScoredData.model_validate(rollout_group(**fields))


def test_staleness_counts_steps_behind_from_numeric_versions():
    def lag(groups: list[ScoredData], version: int) -> dict[str, float]:
        return staleness(flatten(groups, "group", 100), version)

    batch = [scored(weight_versions=["3", "5"]), scored(weight_versions=["5", None])]
    assert lag(batch, 5) == {"staleness_mean": 2 / 3, "staleness_max": 2.0}
    assert lag([scored(), scored(weight_versions=[None, None])], 5) == {}
    assert lag([scored(weight_versions=["base", "x1"])], 5) == {}, "labels, not steps"
    assert lag([scored(weight_versions=["5", "5"])], 5) == {
        "staleness_mean": 0.0,
        "staleness_max": 0.0,
    }


def node(version: str | None) -> SequenceNode:
    metadata = {"finish_reason": "stop"}
    if version is not None:
        metadata["weight_version"] = version
    return SequenceNode(
        full_text="x",
        tokens=[1, 5, 7],
        masked_tokens=[-100, 5, 7],
        logprobs=[1.0, -0.5, -0.2],
        metadata=metadata,
    )


def test_group_from_chat_carries_versions_only_when_the_engine_gave_some():
    messages = [{"role": "user", "content": "hi"}]
    labelled = group_from_chat(messages, ["a", "b"], [node("3"), node(None)], [1, 0])
    assert labelled["weight_versions"] == ["3", None]
    assert ScoredData.model_validate(labelled).model_extra["weight_versions"] == ["3", None]
    plain = group_from_chat(messages, ["a"], [node(None)], [1.0])
    assert "weight_versions" not in plain
    assert plain["messages"] == [messages + [{"role": "assistant", "content": "a"}]]
    assert (
        group_from_chat(
            messages, ["a"], [node(None).model_copy(update={"metadata": None})], [1.0]
        ).keys()
        == plain.keys()
    )


def test_finish_reason_is_the_plain_string_that_remembers_its_version():
    reason = FinishReason("stop", "7")
    assert reason == "stop" and isinstance(reason, str) and hash(reason) == hash("stop")
    assert json.dumps({"finish_reason": reason}) == '{"finish_reason": "stop"}'
    assert weight_version_of(reason) == "7" and weight_version_of("stop") is None
    assert FinishReason("length").weight_version is None
    spans = [{"version": "2", "start": 0, "end": 3}, {"version": "3", "start": 3, "end": 5}]
    assert choice_weight_version({"weight_versions": spans}) == "2"
    assert choice_weight_version(SimpleNamespace(weight_versions=spans)) == "2"
    assert choice_weight_version(SimpleNamespace(weight_versions=[{"version": 4}])) == "4"
    assert choice_weight_version({"finish_reason": "stop"}) is None
    assert choice_weight_version(SimpleNamespace()) is None
