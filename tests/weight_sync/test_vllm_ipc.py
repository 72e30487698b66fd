"""`--weight-bridge-mode shared_vllm` on CPU: the parameter mapping, and the handshake and
push protocol against a real HTTP server that imitates vLLM 0.32's RL routes.

Only the CUDA part is faked (`FakeCudaIpc`: the trainer's GPU UUID and the IPC
handle export); everything else, HTTP included, runs for real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from atroposlib.weight_sync.vllm_route_guard import MIDDLEWARE

torch = pytest.importorskip("torch")
pytest.importorskip("fastapi")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from atroposlib.weight_sync import vllm_ipc as sv  # noqa: E402
from atroposlib.weight_sync import vllm_ipc_mapping as mapping  # noqa: E402
from atroposlib.weight_sync.errors import WeightSyncError  # noqa: E402
from atroposlib.weight_sync.vllm_ipc_worker import (  # noqa: E402
    DEVICE_UUID_METHOD,
    SharedVLLMWorkerExtension,
)
from tests.support.fake_vllm_rl import FakeVLLM  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

GPU = "GPU-7f3a-test"
PUSH_ROUTES = [
    "/pause",
    "/start_weight_update",
    "/update_weights",
    "/finish_weight_update",
    "/update_weight_version",
    "/resume",
]


class FakeCudaIpc(sv.CudaIpc):
    """The GPU-only part: reports a GPU UUID and exports placeholder handles."""

    def __init__(self) -> None:
        self.exports: list[list[str]] = []
        self.shared: list[dict[str, torch.Tensor]] = []  # what each export would share
        self.releases = 0

    def trainer_gpu(self, model) -> str:
        return GPU

    def export(self, weights, gpu_uuid):
        self.exports.append([name for name, _ in weights])
        self.shared.append({name: tensor.detach().clone() for name, tensor in weights})
        handles = [{gpu_uuid: ("placeholder", name)} for name, _ in weights]
        return sv.update_info(weights, handles), []

    def release(self) -> None:
        self.releases += 1


class FakeDDP(torch.nn.Module):
    """What DistributedDataParallel does to names: the model under `module.`."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module


def checkpoint_names(model_dir: Path) -> set[str]:
    with safe_open(str(Path(model_dir) / "model.safetensors"), "pt") as handle:
        return set(handle.keys())


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)


@pytest.fixture(scope="module")
def stand_in() -> Iterator[dict[str, FakeVLLM]]:
    """The module's stand-in process, kept between tests: each start costs about a second
    of CPU (python, FastAPI, uvicorn), and `configure` makes it a new one."""
    kept: dict[str, FakeVLLM] = {}
    yield kept
    for engine in kept.values():
        engine.stop()


@pytest.fixture
def engines(stand_in, tmp_path) -> Iterator:
    """A stand-in with these settings and no calls yet: the module's process re-set, or a
    new one when a test before hung a route or killed it (or when this test asks twice)."""
    started: list[FakeVLLM] = []

    def make(model_dir, **settings) -> FakeVLLM:
        settings = {"model_dir": str(model_dir), "backend": "ipc", "gpu_uuids": [GPU], **settings}
        kept = stand_in.get("engine")
        if kept is not None and kept not in started and kept.reusable():
            engine = kept.configure(**settings)
        else:
            engine = FakeVLLM(tmp_path, **settings).start()
        started.append(engine)
        return engine

    yield make
    for engine in started:
        if engine is stand_in.get("engine"):
            continue
        if engine.reusable() and "engine" not in stand_in:
            stand_in["engine"] = engine
        else:
            engine.stop()
    kept = stand_in.get("engine")
    if kept is not None and not kept.reusable():
        kept.stop()
        del stand_in["engine"]


def bridge_for(engine: FakeVLLM, model, timeout_s: float = 30.0) -> sv.SharedVLLMBridge:
    bridge = sv.SharedVLLMBridge(engine.url, model, timeout_s=timeout_s)
    bridge.ipc = FakeCudaIpc()
    return bridge


# ---- the parameter mapping ----


@pytest.mark.parametrize(
    "trainer, engine",
    [
        ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("module.model.norm.weight", "model.norm.weight"),
        ("_orig_mod.module.lm_head.weight", "lm_head.weight"),
        (
            "base_model.model.model.layers.1.mlp.up_proj.base_layer.weight",
            "model.layers.1.mlp.up_proj.weight",
        ),
        ("module.base_model.model.model.embed_tokens.weight", "model.embed_tokens.weight"),
        ("base_model.model.score.modules_to_save.default.weight", "score.weight"),
        ("base_model.model.score.original_module.weight", None),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", None),
        ("module.base_model.model.model.layers.0.mlp.down_proj.lora_B.default.weight", None),
        ("base_model.model.model.embed_tokens.lora_embedding_A.default", None),
    ],
)
def test_engine_name(trainer, engine):
    assert mapping.engine_name(trainer) == engine


def test_plain_model_maps_onto_its_checkpoint(tiny, tiny_model_path):
    weights = mapping.engine_weights(tiny)
    names = [name for name, _ in weights]
    assert len(names) == len(set(names))
    assert set(names) == checkpoint_names(tiny_model_path)
    stored = load_file(str(Path(tiny_model_path) / "model.safetensors"))
    assert all(tuple(t.shape) == tuple(stored[n].shape) for n, t in weights)
    # tied: lm_head shares the embedding, is pushed once, and vLLM re-ties it
    assert tiny.config.tie_word_embeddings and "lm_head.weight" not in names


@pytest.mark.parametrize("wrap", ["peft", "ddp", "ddp+peft"])
def test_wrapped_model_maps_onto_the_checkpoint(tiny_model_path, wrap):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    if "peft" in wrap:
        lora = LoraConfig(
            r=4, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM"
        )
        model = get_peft_model(model, lora)
        assert any("lora_A" in n for n, _ in model.named_parameters())
    if "ddp" in wrap:
        model = FakeDDP(model)
    names = [name for name, _ in mapping.engine_weights(model)]
    assert sorted(names) == sorted(checkpoint_names(tiny_model_path))
    assert bool(mapping.trainable_adapters(model)) == ("peft" in wrap)


def test_untied_head_is_pushed(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    model = LlamaForCausalLM.from_pretrained(tmp_path)
    names = {name for name, _ in mapping.engine_weights(model)}
    assert "lm_head.weight" in names
    assert names == checkpoint_names(tmp_path)


def test_checkpoint_shapes_reads_headers(tiny_model_path):
    stored = load_file(str(Path(tiny_model_path) / "model.safetensors"))
    assert mapping.checkpoint_shapes(Path(tiny_model_path)) == {
        name: tuple(t.shape) for name, t in stored.items()
    }


# ---- the handshake ----


def test_connect_checks_then_inits_the_ipc_transfer(engines, tiny, tiny_model_path):
    engine = engines(tiny_model_path)
    bridge = bridge_for(engine, tiny)
    bridge.connect()
    state = engine.state()
    assert [c["path"] for c in state["calls"]] == [
        "/health",
        "/server_info",
        "/collective_rpc",
        "/init_weight_transfer_engine",
    ]
    assert state["calls"][1]["query"] == {"config_format": "json"}
    assert state["calls"][2]["body"] == {"method": DEVICE_UUID_METHOD}
    assert state["calls"][3]["body"] == {"init_info": {"packed": False}}
    assert state["initialized"]
    bridge.close()
    assert not engine.state()["initialized"]


def test_mismatched_parameters_are_refused_at_connect(engines, tiny, tiny_model_path, tmp_path):
    stored = load_file(str(Path(tiny_model_path) / "model.safetensors"))
    stored["model.layers.0.self_attn.qkv_proj.weight"] = stored.pop(
        "model.layers.0.self_attn.q_proj.weight"
    )
    stored["model.norm.weight"] = torch.ones(stored["model.norm.weight"].shape[0] + 1)
    other = tmp_path / "other-model"
    other.mkdir()
    save_file(stored, str(other / "model.safetensors"))
    engine = engines(other)
    bridge = bridge_for(engine, tiny)
    with pytest.raises(sv.SharedVLLMSetupError) as refused:
        bridge.connect()
    message = str(refused.value)
    assert "not in the engine's checkpoint: model.layers.0.self_attn.q_proj.weight" in message
    assert "model.layers.0.self_attn.qkv_proj.weight" in message  # missing from the trainer
    assert "model.norm.weight" in message and "shape differs" in message
    assert "/init_weight_transfer_engine" not in engine.paths()


def test_dtype_mismatch_is_refused_at_connect(engines, tiny, tiny_model_path):
    engine = engines(tiny_model_path, dtype="bfloat16")
    with pytest.raises(sv.SharedVLLMSetupError, match="dtype differs.*float32 vs engine bfloat16"):
        bridge_for(engine, tiny).connect()


def test_trainable_lora_adapters_are_refused_at_connect(engines, tiny_model_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    engine = engines(tiny_model_path)
    with pytest.raises(sv.SharedVLLMSetupError, match="lora_restart"):
        bridge_for(engine, model).connect()


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({"backend": None}, "--weight-transfer-config"),
        ({"backend": "nccl"}, "backend is 'nccl'; shared_vllm needs 'ipc'"),
        ({"insecure": False}, "VLLM_ALLOW_INSECURE_SERIALIZATION=1"),
        ({"tp": 2}, "several GPUs"),
        ({"gpu_uuids": ["GPU-other"]}, "CUDA IPC needs trainer and engine on the same GPU"),
        ({"gpu_uuids": []}, "--worker-extension-cls"),
    ],
)
def test_engine_setup_errors_say_what_to_fix(engines, tiny, tiny_model_path, settings, expected):
    engine = engines(tiny_model_path, **settings)
    with pytest.raises(sv.SharedVLLMSetupError) as refused:
        bridge_for(engine, tiny).connect()
    assert expected in str(refused.value)
    assert "/init_weight_transfer_engine" not in engine.paths()


def test_unreachable_engine_is_a_clear_error(tiny, tmp_path):
    from atroposlib.utils.ports import free_port

    bridge = sv.SharedVLLMBridge(f"http://127.0.0.1:{free_port()}", tiny, timeout_s=5)
    bridge.ipc = FakeCudaIpc()
    with pytest.raises(WeightSyncError, match="is not answering"):
        bridge.connect()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_without_a_gpu_connect_says_shared_vllm_needs_cuda(engines, tiny, tiny_model_path):
    engine = engines(tiny_model_path)
    bridge = sv.SharedVLLMBridge(engine.url, tiny)  # the real CudaIpc
    with pytest.raises(sv.SharedVLLMSetupError) as refused:
        bridge.connect()
    message = str(refused.value)
    assert "shared_vllm needs CUDA" in message
    assert "same GPU" in message and "hot_reload" in message
    assert engine.paths() == []  # refused before touching the engine


# ---- pushes ----


def test_push_pauses_transfers_sets_version_resumes(engines, tiny, tiny_model_path):
    engine = engines(tiny_model_path)
    bridge = bridge_for(engine, tiny)
    bridge.connect()
    seconds = bridge.push("step-3")
    assert seconds >= 0
    calls = engine.state()["calls"][4:]
    assert [c["path"] for c in calls] == PUSH_ROUTES
    assert calls[0]["query"]["mode"] == "keep"
    update = calls[2]["body"]["update_info"]
    expected = [name for name, _ in mapping.engine_weights(tiny)]
    assert update["names"] == expected and bridge.ipc.exports == [expected]
    assert update["dtype_names"] == ["float32"] * len(expected)
    assert calls[4]["body"] == {"new_version": "step-3"}
    state = engine.state()
    assert state["version"] == "step-3" and not state["paused"] and not state["active"]
    assert bridge.ipc.releases == 1


def test_refused_update_raises_rolls_back_and_resumes(engines, tiny, tiny_model_path):
    engine = engines(tiny_model_path)
    bridge = bridge_for(engine, tiny)
    bridge.connect()
    engine.fault("/update_weights", status=500, error="IPC handle not found", once=True)
    with pytest.raises(WeightSyncError) as failed:
        bridge.push("step-1")
    message = str(failed.value)
    assert "/update_weights" in message and "500" in message
    assert "resumed" in message and "previous weights" in message
    paths = engine.paths()[4:]
    assert paths[:3] == ["/pause", "/start_weight_update", "/update_weights"]
    # roll-back round (puts back the layers vLLM had not loaded), then resume
    assert paths[3:] == [
        "/health",
        "/start_weight_update",
        "/finish_weight_update",
        "/health",
        "/resume",
    ]
    state = engine.state()
    assert not state["paused"] and not state["active"] and state["version"] == "0"
    # the engine is usable again: the next push goes through
    bridge.push("step-2")
    assert engine.state()["version"] == "step-2"


def test_refused_version_still_resumes(engines, tiny, tiny_model_path):
    engine = engines(tiny_model_path)
    bridge = bridge_for(engine, tiny)
    bridge.connect()
    engine.fault("/update_weight_version", status=422)
    with pytest.raises(WeightSyncError, match="new weights, still labelled with the previous"):
        bridge.push("step-1")
    assert engine.paths()[-1] == "/resume" and not engine.state()["paused"]


def test_refused_pause_still_resumes(engines, tiny, tiny_model_path):
    engine = engines(tiny_model_path)
    bridge = bridge_for(engine, tiny)
    bridge.connect()
    engine.fault("/pause", status=503)
    with pytest.raises(WeightSyncError, match="/pause"):
        bridge.push("step-1")
    assert "/start_weight_update" not in engine.paths()
    assert engine.paths()[-1] == "/resume"


def test_timed_out_update_raises_and_resumes(engines, tiny, tiny_model_path):
    engine = engines(tiny_model_path)
    bridge = bridge_for(engine, tiny, timeout_s=1.5)
    bridge.connect()
    engine.fault("/update_weights", hang=True)
    with pytest.raises(WeightSyncError, match="timed out after 1.5s"):
        bridge.push("step-1")
    state = engine.state()
    assert not state["paused"] and state["calls"][-1]["path"] == "/resume"


def test_engine_dead_before_push(engines, tiny, tiny_model_path):
    engine = engines(tiny_model_path)
    bridge = bridge_for(engine, tiny, timeout_s=5)
    bridge.connect()
    engine.kill()
    with pytest.raises(WeightSyncError, match=r"not answering \(did it die\?\)"):
        bridge.push("step-1")


def test_engine_dies_during_the_transfer(engines, tiny, tiny_model_path):
    engine = engines(tiny_model_path)
    bridge = bridge_for(engine, tiny, timeout_s=5)
    bridge.connect()
    engine.fault("/update_weights", die=True)
    with pytest.raises(WeightSyncError) as failed:
        bridge.push("step-1")
    assert "not answering (did it die?)" in str(failed.value)
    assert "/update_weights" in str(failed.value)
    # the socket closes as the process exits, so the push may see it a moment before
    # the process is gone
    wait_until(engine.exited, 10, "the engine that died mid-push did not exit")


def test_push_before_connect_is_refused(tiny):
    bridge = sv.SharedVLLMBridge("http://127.0.0.1:9", tiny)
    with pytest.raises(WeightSyncError, match="before a successful connect"):
        bridge.push("step-1")
    bridge.close()


# ---- the engine's launch ----


def test_launch_extras_name_ipc_backend_dev_mode_and_the_worker_extension():
    args, env = sv.shared_vllm_launch_extras("a-sync-key")
    assert args[args.index("--middleware") + 1] == MIDDLEWARE
    assert env["ATROPOS_WEIGHT_SYNC_KEY"] == "a-sync-key"
    config = args[args.index("--weight-transfer-config") + 1]
    assert json.loads(config) == {"backend": "ipc"}
    extension = args[args.index("--worker-extension-cls") + 1]
    module, _, name = extension.rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) is SharedVLLMWorkerExtension
    assert callable(getattr(SharedVLLMWorkerExtension, DEVICE_UUID_METHOD))
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    repo = Path(sv.__file__).resolve().parents[2]
    assert str(repo) in env["PYTHONPATH"].split(":")


def test_the_update_payload_names_each_weight_with_its_handle_in_vllms_fields():
    """The fields of vLLM 0.32's IPCWeightTransferUpdateInfo, one entry per weight in
    the same order; the handles pickled as its `ipc_handles_pickled` reads them. (That
    real vLLM parses it is test_vllm_ipc_vllm_cpu.py's question.)"""
    import base64
    import pickle

    weights = [("a.weight", torch.zeros(2, 3)), ("b.bias", torch.zeros(4, dtype=torch.bfloat16))]
    handles = [{GPU: ("handle", index)} for index in range(len(weights))]
    payload = sv.update_info(weights, handles)
    assert set(payload) == {"names", "dtype_names", "shapes", "ipc_handles_pickled"}
    assert payload["names"] == ["a.weight", "b.bias"]
    assert payload["dtype_names"] == ["float32", "bfloat16"]
    assert payload["shapes"] == [[2, 3], [4]]
    assert pickle.loads(base64.b64decode(payload["ipc_handles_pickled"])) == handles
    json.dumps(payload)  # it travels as JSON


def test_a_sharded_trainer_shares_its_gathered_weights_in_the_engines_dtype(
    engines, tiny_model_path
):
    """FSDP (a group of one on CPU): the parameters are float32 shards, so each push
    gathers the whole weights (`SharedBridge.export`, every rank's part of the push) and
    shares those, cast to the engine's bfloat16, under the engine's names."""
    from types import SimpleNamespace

    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from atroposlib.weight_sync.bridge import SharedBridge
    from example_trainer.checkpoint import gathered_weights
    from example_trainer.distributed import init_data_parallel
    from example_trainer.logprobs import PolicyLogprobs
    from example_trainer.sharding import shard

    init_data_parallel(torch.device("cpu"), group_of_one=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        expected = {name: p.detach().to(torch.bfloat16) for name, p in model.named_parameters()}
        shard(PolicyLogprobs(model), model, torch.bfloat16)
        assert all(hasattr(p, "full_tensor") for p in model.parameters())
        engine = engines(tiny_model_path, dtype="bfloat16")
        port = int(engine.url.rsplit(":", 1)[1])
        config = SimpleNamespace(engine_port=port, weight_sync_timeout_s=30.0)
        bridge = SharedBridge(config, model, lambda: gathered_weights(model))
        bridge.bridge.ipc = FakeCudaIpc()
        assert bridge.export(model, None, 3) is None and bridge.staged is not None
        bridge.push(None, 3, engine.url)
        bridge.pushed()
        assert bridge.staged is None, "the gathered copy outlived the push"
        with pytest.raises(WeightSyncError, match="shards"):  # never the shards themselves
            bridge.bridge.push("4")
        bridge.close()
    finally:
        dist.destroy_process_group()
    update = next(c for c in engine.state()["calls"] if c["path"] == "/update_weights")
    names = [name for name, _ in mapping.engine_weights(model)]
    assert update["body"]["update_info"]["names"] == names
    assert update["body"]["update_info"]["dtype_names"] == ["bfloat16"] * len(names)
    (shared,) = bridge.bridge.ipc.shared
    assert set(shared) == set(names) == checkpoint_names(tiny_model_path)
    for name, tensor in shared.items():
        assert torch.equal(tensor, expected[name]), name
    assert engine.state()["version"] == "3"
