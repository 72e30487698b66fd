"""`POST /generate` and `/health_generate` of the CPU server, as upstream's client reads them.

The parsers below restate what Atropos's `VLLMServer._tokens_and_logprobs_completion_wrapper`
and `_get_logprobs_wrapper` read from the answer, so a change of shape fails here.
"""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest

from atroposlib.inference.generate_requests import (
    FLOOR_LOGPROB,
    GenerateRequest,
    generate_body,
    generate_prompt_ids,
    generate_sampling,
    logprob_entry,
)
from atroposlib.inference.openai_requests import OpenAIError
from atroposlib.inference.sampler import GenerationJob, Sample, SamplingParams

torch = pytest.importorskip("torch")

from tests.support.tolerances import SAME_LIBRARY_LOGPROB_REL, logprob_tolerance  # noqa: E402

SYSTEM = {"role": "system", "content": "Answer with one digit."}


def question(a: int, b: int) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": f"What is {a} + {b} mod 10?"}]


def upstream_sample_parse(results: dict) -> tuple[list[list[int]], list[list[float]], list]:
    """What `_tokens_and_logprobs_completion_wrapper` takes: the first key/value of item[0]."""
    tokens, logprobs, reasons = [], [], []
    for per_token, reason in zip(results["logprobs"], results["finish_reasons"], strict=True):
        logprobs.append([list(item[0].values())[0] for item in per_token])
        tokens.append([int(list(item[0].keys())[0]) for item in per_token])
        reasons.append(reason)
    return tokens, logprobs, reasons


def upstream_prompt_parse(results: dict) -> tuple[list[list[int]], list[list[float]]]:
    """What `_get_logprobs_wrapper` takes: positions, each a {id: logprob} dict (None: empty)."""
    raw = results.get("prompt_logprobs")
    assert raw is not None, "answer lacks prompt_logprobs"
    entries = raw[0] if raw and isinstance(raw[0], list) else raw
    ids, values = [], []
    for entry in entries:
        assert entry is None or isinstance(entry, dict)
        items = list(entry.items()) if isinstance(entry, dict) else []
        ids.append([int(k) for k, _ in items])
        values.append([float(v) for _, v in items])
    return ids, values


@pytest.fixture(scope="module")
def prompt_ids(inference_server) -> list[int]:
    body = {"messages": question(6, 7)}
    return httpx.post(f"{inference_server.url}/tokenize", json=body).json()["tokens"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def generate(server, **body) -> dict:
    response = httpx.post(f"{server.url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


# --- the pure shaping, without a model -------------------------------------------------


class FakeTokenizer:
    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) % 50 for c in text]}

    def __len__(self) -> int:
        return 50


def test_logprob_entry_puts_the_chosen_token_first_then_rank_order():
    assert list(logprob_entry(7, -2.0, [(3, -0.1), (7, -2.0), (9, -3.0)]).items()) == [
        ("7", -2.0),
        ("3", -0.1),
        ("9", -3.0),
    ]
    assert logprob_entry(1, -math.inf, [(2, math.nan)]) == {"1": FLOOR_LOGPROB, "2": FLOOR_LOGPROB}


def test_generate_body_shapes_samples_and_prompt_logprobs():
    job = GenerationJob([5, 6, 7], SamplingParams(n=2, top_logprobs=1, prompt_logprobs=1))
    job.samples = [
        Sample([1, 2], [-0.5, -0.25], [[(1, -0.5)], [(4, -0.1)]], "ab", "length"),
        Sample([3], [-1.5], [[(8, -0.2)]], "c", "stop"),
    ]
    job.prompt_logprobs = [-1.0, -2.0]
    job.prompt_top_logprobs = [[(6, -1.0)], [(0, -0.3)]]
    request = GenerateRequest(prompt={"prompt_token_ids": [5, 6, 7]}, logprobs=1, prompt_logprobs=1)
    body = generate_body(request, job, lambda ids: "decoded")
    assert body["text"] == ["ab", "c"] and body["prompt"] == "decoded"
    assert body["finish_reasons"] == ["length", "stop"]
    assert body["token_ids"] == [[1, 2], [3]] and body["prompt_token_ids"] == [5, 6, 7]
    assert body["logprobs"] == [
        [[{"1": -0.5}], [{"2": -0.25, "4": -0.1}]],
        [[{"3": -1.5, "8": -0.2}]],
    ]
    assert body["prompt_logprobs"] == [None, {"6": -1.0}, {"7": -2.0, "0": -0.3}]
    plain = generate_body(GenerateRequest(prompt="hi", detokenize=False), job, lambda ids: "")
    assert "logprobs" not in plain and "prompt_logprobs" not in plain
    assert plain["prompt"] == "hi" and plain["text"] == ["", ""]


def test_requests_the_engine_cannot_honour_are_refused():
    tok = FakeTokenizer()
    assert generate_prompt_ids(tok, GenerateRequest(prompt={"prompt": "ab"}).prompt) == [47, 48]
    with pytest.raises(OpenAIError, match="empty"):
        generate_prompt_ids(tok, "")
    with pytest.raises(OpenAIError, match="token ids"):
        generate_prompt_ids(tok, GenerateRequest(prompt={"prompt_token_ids": [60]}).prompt)
    for field, value in [("stream", True), ("repetition_penalty", 1.2), ("min_tokens", 2)]:
        with pytest.raises(OpenAIError) as refused:
            generate_sampling(GenerateRequest(prompt="a", **{field: value}), 1, 64, 50)
        assert refused.value.param == field
    with pytest.raises(OpenAIError, match="context length"):
        generate_sampling(GenerateRequest(prompt="a", max_tokens=64), 1, 64, 50)
    params = generate_sampling(
        GenerateRequest(prompt="a", top_k=-1, max_tokens=None, logprobs=2, stop="x"), 4, 64, 50
    )
    assert (params.top_k, params.max_tokens, params.top_logprobs, params.stop) == (0, 60, 2, ["x"])


# --- the real server and the real tiny model -------------------------------------------


def test_n_samples_parse_with_upstream_client_logic(inference_server, prompt_ids, tokenizer):
    # the body VLLMServer builds: token-id prompt, logprobs=0, the caller's sampling kwargs
    results = generate(
        inference_server,
        prompt={"prompt_token_ids": prompt_ids},
        logprobs=0,
        n=3,
        max_tokens=6,
        temperature=1.0,
        top_p=1.0,
        seed=5,
    )
    tokens, logprobs, reasons = upstream_sample_parse(results)
    assert len(tokens) == len(logprobs) == len(reasons) == len(results["text"]) == 3
    assert results["prompt_token_ids"] == prompt_ids
    assert results["prompt"] == tokenizer.decode(prompt_ids)
    for ids, values, reason, text, listed in zip(
        tokens, logprobs, reasons, results["text"], results["token_ids"], strict=True
    ):
        assert 1 <= len(ids) <= 6 and len(values) == len(ids) and ids == listed
        assert all(isinstance(v, float) and v <= 0 for v in values)
        assert reason in ("stop", "length")
        assert (reason == "length") == (len(ids) == 6 and ids[-1] != tokenizer.eos_token_id)
        assert text == tokenizer.decode(ids, skip_special_tokens=True)
    again = generate(
        inference_server,
        prompt={"prompt_token_ids": prompt_ids},
        logprobs=0,
        n=3,
        max_tokens=6,
        temperature=1.0,
        seed=5,
    )
    assert upstream_sample_parse(again)[0] == tokens


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (1.0, 9)])
def test_logprobs_equal_the_completions_route(inference_server, prompt_ids, temperature, seed):
    common = dict(max_tokens=5, temperature=temperature, n=2, ignore_eos=True)
    if seed is not None:
        common["seed"] = seed
    completion = httpx.post(
        f"{inference_server.url}/v1/completions",
        json={
            "model": "tiny",
            "prompt": prompt_ids,
            "logprobs": 2,
            "return_tokens_as_token_ids": True,
            **common,
        },
        timeout=120,
    ).json()
    results = generate(
        inference_server, prompt={"prompt_token_ids": prompt_ids}, logprobs=2, **common
    )
    tokens, logprobs, _ = upstream_sample_parse(results)
    for choice, ids, values, per_token in zip(
        completion["choices"], tokens, logprobs, results["logprobs"], strict=True
    ):
        served = choice["logprobs"]
        assert ids == [int(t.split(":")[1]) for t in served["tokens"]]
        assert values == pytest.approx(served["token_logprobs"], abs=1e-6)
        for item, top in zip(per_token, served["top_logprobs"], strict=True):
            entry = item[0]
            expected = {int(k.split(":")[1]): v for k, v in top.items()}
            assert set(map(int, entry)) - set(expected) <= {int(next(iter(entry)))}
            assert {k: entry[str(k)] for k in expected} == pytest.approx(expected, abs=1e-6)


def test_prompt_logprobs_are_the_models_own(inference_server, prompt_ids, tiny_model_path):
    from transformers import AutoModelForCausalLM

    longer = prompt_ids + prompt_ids[-6:]  # scored beside the first, so the batch is left-padded

    async def both() -> list[dict]:
        async with httpx.AsyncClient(base_url=inference_server.url, timeout=120) as client:
            # the body `_get_logprobs_wrapper` builds
            bodies = [
                {
                    "prompt": {"prompt_token_ids": ids},
                    "prompt_logprobs": 3,
                    "n": 1,
                    "temperature": 0.0,
                    "top_p": 1.0,
                    "max_tokens": 1,
                }
                for ids in (prompt_ids, longer)
            ]
            answers = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
        assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
        return [a.json() for a in answers]

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    for ids, results in zip((prompt_ids, longer), asyncio.run(both()), strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        reference = torch.log_softmax(logits, -1)
        tolerance = logprob_tolerance(logits, SAME_LIBRARY_LOGPROB_REL)
        raw = results["prompt_logprobs"]
        assert len(raw) == len(ids) and raw[0] is None
        top_ids, top_values = upstream_prompt_parse(results)
        assert len(top_ids) == len(ids) and top_ids[0] == [] and top_values[0] == []
        for p in range(1, len(ids)):
            row = reference[p - 1]
            best = row.topk(3)
            assert top_ids[p][0] == ids[p]  # the prompt token's own logprob comes first
            in_top = ids[p] in best.indices.tolist()
            assert len(top_ids[p]) == (3 if in_top else 4)
            for token, value in zip(top_ids[p], top_values[p], strict=True):
                assert abs(row[token].item() - value) <= tolerance
            ranked = top_values[p][1:]
            assert ranked == sorted(ranked, reverse=True)  # the top k by rank
            assert all(v >= best.values[-1].item() - tolerance for v in ranked)


def test_text_prompt_and_generation_health(inference_server, tokenizer):
    results = generate(inference_server, prompt="What is 1 + 1", max_tokens=3, temperature=0)
    assert results["prompt"] == "What is 1 + 1"
    assert results["prompt_token_ids"] == tokenizer("What is 1 + 1")["input_ids"]
    assert "logprobs" not in results and len(results["token_ids"][0]) <= 3
    single = generate(inference_server, prompt={"prompt_token_ids": [5]}, prompt_logprobs=2)
    assert single["prompt_logprobs"] == [None]  # one token: nothing before it to score from
    for route in ("/health", "/health_generate"):
        assert httpx.get(f"{inference_server.url}{route}", timeout=60).status_code == 200


@pytest.mark.parametrize(
    "body,blamed",
    [
        (b"{not json", None),
        (b'{"prompt": "a", "temperature": Infinity}', "temperature"),
        ({"max_tokens": 2}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": {"prompt_token_ids": []}}, "prompt"),
        ({"prompt": {"prompt_token_ids": [10**9]}}, "prompt"),
        ({"prompt": "a", "frobnicate": 1}, "frobnicate"),
        ({"prompt": "a", "n": 0}, "n"),
        ({"prompt": "a", "logprobs": -1}, "logprobs"),
        ({"prompt": "a", "prompt_logprobs": 99}, "prompt_logprobs"),
        ({"prompt": "a", "stream": True}, "stream"),
        ({"prompt": "a", "presence_penalty": 0.5}, "presence_penalty"),
        ({"prompt": "a", "max_tokens": 100_000}, "max_tokens"),
    ],
)
def test_bad_bodies_get_a_clear_400(inference_server, body, blamed):
    raw = {"content": body, "headers": {"content-type": "application/json"}}
    kwargs = raw if isinstance(body, bytes) else {"json": body}
    response = httpx.post(f"{inference_server.url}/generate", timeout=60, **kwargs)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"]
    if blamed is not None:
        assert error["param"].split(".")[0] == blamed


def test_top_k_min_p_and_stop_token_ids_reach_the_engine(inference_server, prompt_ids):
    prompt = {"prompt_token_ids": prompt_ids}
    greedy = generate(inference_server, prompt=prompt, max_tokens=4, temperature=0, n=1)
    ids = greedy["token_ids"][0]
    # one candidate left: sampling at a high temperature must still pick the greedy token
    for cut in ({"top_k": 1}, {"min_p": 1.0}):
        sampled = generate(
            inference_server, prompt=prompt, max_tokens=4, temperature=5.0, n=4, seed=1, **cut
        )
        assert sampled["token_ids"] == [ids] * 4, cut
    stopped = generate(
        inference_server, prompt=prompt, max_tokens=4, temperature=0, stop_token_ids=[ids[0]]
    )
    assert stopped["token_ids"] == [ids[:1]] and stopped["finish_reasons"] == ["stop"]
