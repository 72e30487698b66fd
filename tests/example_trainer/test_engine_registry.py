"""Engines are registered kinds: a config names one the registry knows, and a kind
registered from outside the library (a module and a line) is one the trainer starts,
pushes its weights into and stops."""

from __future__ import annotations

import json

import pytest

from atroposlib.inference.engines import ENGINES, engine_kind, engine_name, register_engine
from atroposlib.inference.launcher import EngineConfig, engine_command
from atroposlib.utils.ports import free_port
from tests.support.standin_engine import StandInEngine


def test_an_unknown_engine_is_refused_with_the_kinds_there_are():
    from example_trainer.config import TrainingConfig

    with pytest.raises(ValueError, match="no engine named 'sglang'; registered: cpu, vllm"):
        TrainingConfig(model_name="m", inference_engine="sglang")
    with pytest.raises(ValueError, match="no engine named 'sglang'"):
        EngineConfig(engine="sglang")


def test_transformers_is_the_cpu_engines_other_name():
    assert engine_name("transformers") == "cpu" and engine_name("auto") == "auto"
    assert EngineConfig(engine="transformers").engine == "cpu"
    assert engine_kind("transformers") is engine_kind("cpu")


def test_each_kind_builds_its_command_from_the_shared_flags_and_its_own():
    config = EngineConfig(port=9100, max_model_len=64, gpu_memory_utilization=0.3)
    cpu = engine_command(config, "cpu", "/m")
    vllm = engine_command(config, "vllm", "/m")
    assert cpu[1:3] == ["-m", "atroposlib.cli.inference_server"]
    assert vllm[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--gpu-memory-utilization" in vllm and "--gpu-memory-utilization" not in cpu
    assert engine_kind("cpu").placement("cuda:1") == (["--device", "cuda:1"], {})
    assert engine_kind("vllm").placement("cuda:1") == ([], {"CUDA_VISIBLE_DEVICES": "1"})
    assert engine_kind("vllm").supports_lora and not engine_kind("cpu").supports_lora


def test_a_name_is_registered_once(tmp_path):
    class Clash(StandInEngine):
        name = "cpu"

    with pytest.raises(ValueError, match="'cpu' is already registered"):
        register_engine(Clash(tmp_path / "r.jsonl"))


@pytest.mark.integration
def test_a_stand_in_engine_registered_from_outside_trains_and_takes_each_push(
    api, wire_client, tiny_model_path, tmp_path
):
    from atroposlib.trainer_contract import read_events
    from tests.support.trainer_batches import make_trainer, post_groups

    records = tmp_path / "standin.jsonl"
    register_engine(StandInEngine(records))
    try:
        trainer = make_trainer(
            tiny_model_path,
            tmp_path / "ckpt",
            atropos_url=api.url,
            inference_engine="standin",
            weight_bridge_mode="hot_reload",
            engine_port=free_port(),
            training_steps=3,
        )
        post_groups(wire_client, 3)
        trainer.run()
    finally:
        ENGINES.pop("standin", None)
    seen = [json.loads(line) for line in records.read_text().splitlines()]
    assert seen[0] == {"event": "start", "model": str(tiny_model_path), "served": "tiny"}
    loads = [(entry["version"], entry["path"].rsplit("/", 1)[-1]) for entry in seen[1:]]
    assert loads == [("1", "step-1"), ("2", "step-2")]  # the last step saves instead
    kinds = [event.kind.value for event in read_events(tmp_path / "ckpt" / "events.jsonl")]
    assert kinds[0] == "engine_started" and "checkpoint_saved" in kinds
    assert not trainer.engines[0].alive(), "the run stops the engine it started"
