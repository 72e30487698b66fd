"""`get_logprobs` (prompt logprobs, upstream's normalised schema) on every client layer.

The vLLM client is checked against the real CPU inference server's `/generate` and the
tiny model's own forward pass; the other wire shapes vLLM may use (per sequence, list
of single-entry dicts) against a stand-in HTTP server that records each request.
"""

from __future__ import annotations

import asyncio

import pytest

from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_baseline import APIServer, APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.server_handling.vllm_server import VLLMServer, encode_prompt
from tests.support.inference_servers import server_config

KEYS = {"prompt_tokens", "prompt_topk_token_ids", "prompt_topk_logprobs"}


def test_vllm_prompt_logprobs_match_the_model(inference_server, tiny_model_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.support.tolerances import SAME_LIBRARY_LOGPROB_REL, logprob_tolerance

    manager = ServerManager([server_config(inference_server.url)])
    ids = [5, 17, 42, 9, 33, 2]
    payload = asyncio.run(manager.get_logprobs(input_ids=ids, top_k=3, max_tokens=1))
    assert set(payload) >= KEYS and payload["prompt_tokens"] == ids
    top_ids, top_lps = payload["prompt_topk_token_ids"], payload["prompt_topk_logprobs"]
    assert len(top_ids) == len(top_lps) == len(ids)
    assert top_ids[0] == [] and top_lps[0] == [], "the first prompt token has no context"

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    reference = torch.log_softmax(logits, -1)
    tolerance = logprob_tolerance(logits, SAME_LIBRARY_LOGPROB_REL)
    for position in range(1, len(ids)):
        got = dict(zip(top_ids[position], top_lps[position], strict=True))
        assert ids[position] in got, "the prompt token's own logprob is reported"
        expected_top = torch.topk(reference[position - 1], 3).indices.tolist()
        assert set(expected_top) <= set(got), (position, expected_top, got)
        for token, logprob in got.items():
            assert abs(reference[position - 1, token].item() - logprob) <= tolerance


def test_vllm_text_prompt_is_encoded_with_the_servers_tokenizer(inference_server, tiny_model_path):
    transformers = pytest.importorskip("transformers")
    server = VLLMServer(server_config(inference_server.url, tokenizer_name=str(tiny_model_path)))
    text = "What is 2 + 5 mod 10?"
    payload = asyncio.run(server.get_logprobs(prompt=text, split="eval"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    assert payload["prompt_tokens"] == encode_prompt(tokenizer, text)
    assert all(len(entry) >= 1 for entry in payload["prompt_topk_token_ids"][1:])
    assert len(server.eval_request_timings) == 1 and len(server.request_timings) == 0


def test_vllm_request_and_per_sequence_answer_shape(standin):
    ids = [3, 4, 5]
    answer = {
        "prompt_logprobs": [
            [None, [{"4": -0.5}, {"7": -1.5}], {"5": -0.25, "8": -2.0}],
        ]
    }
    fake = standin({"/generate": lambda body: answer})
    server = VLLMServer(APIServerConfig(base_url=f"{fake.url}/v1", model_name="m"))
    payload = asyncio.run(
        server.get_logprobs(input_ids=ids, top_logprobs=2, temperature=0.9, seed=7)
    )
    assert payload == {
        "prompt_tokens": ids,
        "prompt_topk_token_ids": [[], [4, 7], [5, 8]],
        "prompt_topk_logprobs": [[], [-0.5, -1.5], [-0.25, -2.0]],
    }
    path, body = fake.requests[-1]
    assert path == "/generate"
    assert body == {
        "prompt": {"prompt_token_ids": ids},
        "prompt_logprobs": 2,
        "seed": 7,
        "n": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 1,
    }


def test_vllm_answer_without_prompt_logprobs_is_a_clear_error(standin):
    fake = standin({"/generate": lambda body: {"text": ["x"]}})
    server = VLLMServer(APIServerConfig(base_url=f"{fake.url}/v1", model_name="m"))
    with pytest.raises(ValueError, match="prompt_logprobs"):
        asyncio.run(server.get_logprobs(input_ids=[1, 2]))


def test_openai_endpoints_have_no_prompt_logprobs():
    config = APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name="m")
    with pytest.raises(NotImplementedError, match="get_logprobs"):
        asyncio.run(OpenAIServer(config).get_logprobs(prompt="hi"))
    with pytest.raises(NotImplementedError, match="get_logprobs"):
        asyncio.run(ServerManager([config]).get_logprobs(prompt="hi"))


class CharLogprobServer(APIServer):
    """A client whose wire call answers from the prompt's characters (upstream's test shape)."""

    async def _chat_completion_wrapper(self, **kwargs):
        raise NotImplementedError

    async def _completion_wrapper(self, **kwargs):
        raise NotImplementedError

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs):
        raise NotImplementedError

    async def _get_logprobs_wrapper(self, **kwargs):
        self.seen = kwargs
        ids = [ord(c) for c in kwargs["prompt"]]
        return {
            "prompt_tokens": ids,
            "prompt_topk_token_ids": [[t] for t in ids],
            "prompt_topk_logprobs": [[-0.1] for _ in ids],
        }


def test_apiserver_routes_get_logprobs_through_split_limits_and_records():
    server = CharLogprobServer(APIServerConfig(model_name="test-model", health_check=False))
    train = asyncio.run(server.get_logprobs(prompt="hi", split="train"))
    assert train["prompt_tokens"] == [104, 105] and server.seen["model"] == "test-model"
    assert "split" not in server.seen
    assert (len(server.request_timings), len(server.attempts_list)) == (1, 1)
    assert (len(server.eval_request_timings), len(server.eval_attempts_list)) == (0, 0)
    asyncio.run(server.get_logprobs(prompt="ok", split="eval"))
    assert (len(server.eval_request_timings), len(server.eval_attempts_list)) == (1, 1)


def test_manager_sends_get_logprobs_to_the_server_with_most_room():
    busy = CharLogprobServer(APIServerConfig(model_name="a", num_max_requests_at_once=2))
    free = CharLogprobServer(APIServerConfig(model_name="b", num_max_requests_at_once=8))
    manager = ServerManager.__new__(ServerManager)  # upstream's tests build one this way
    manager.servers = [busy, free]
    asyncio.run(manager.get_logprobs(prompt="x"))
    assert free.seen["model"] == "b" and not hasattr(busy, "seen")
