"""The CPU inference server through the openai SDK, against the real tiny model."""

from __future__ import annotations

import asyncio

import httpx
import pytest

openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")

from tests.support.tolerances import SAME_LIBRARY_LOGPROB_REL, logprob_tolerance  # noqa: E402

SYSTEM = {"role": "system", "content": "Answer with one digit."}


def question(a: int, b: int) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": f"What is {a} + {b} mod 10?"}]


@pytest.fixture(scope="module")
def client(inference_server):
    return openai.OpenAI(base_url=f"{inference_server.url}/v1", api_key="x")


def test_models_and_health(client, inference_server):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(f"{inference_server.url}/health").status_code == 200


def test_chat_completion_with_n_and_logprobs(client):
    response = client.chat.completions.create(
        model="tiny",
        messages=question(2, 3),
        n=4,
        max_tokens=5,
        temperature=1.0,
        logprobs=True,
        top_logprobs=3,
        seed=7,
    )
    assert len(response.choices) == 4
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    for choice in response.choices:
        assert choice.finish_reason in ("stop", "length")
        assert choice.message.role == "assistant"
        tokens = choice.logprobs.content
        assert 1 <= len(tokens) <= 5
        assert all(t.logprob <= 0 and len(t.top_logprobs) == 3 for t in tokens)
        assert all(t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in tokens)
    usage = response.usage
    assert usage.completion_tokens == sum(len(c.logprobs.content) for c in response.choices)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_seed_makes_sampling_repeatable(client):
    kwargs = dict(
        model="tiny", messages=question(4, 4), n=3, max_tokens=6, temperature=1.0, seed=11
    )
    first = [c.message.content for c in client.chat.completions.create(**kwargs).choices]
    again = [c.message.content for c in client.chat.completions.create(**kwargs).choices]
    assert first == again


@pytest.mark.learning
def test_greedy_chat_answers_a_digit_and_stops(client):
    response = client.chat.completions.create(
        model="tiny", messages=question(1, 1), max_tokens=8, temperature=0
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content.isdigit()


def test_completion_from_token_ids_returns_token_ids(client, inference_server):
    ids = httpx.post(f"{inference_server.url}/tokenize", json={"messages": question(3, 5)}).json()
    assert ids["count"] == len(ids["tokens"]) and ids["max_model_len"] == 512
    response = client.completions.create(
        model="tiny",
        prompt=ids["tokens"],
        max_tokens=4,
        temperature=0,
        logprobs=1,
        extra_body={"return_tokens_as_token_ids": True},
    )
    choice = response.choices[0]
    assert all(t.startswith("token_id:") for t in choice.logprobs.tokens)
    generated = [int(t.split(":")[1]) for t in choice.logprobs.tokens]
    text = httpx.post(f"{inference_server.url}/detokenize", json={"tokens": generated}).json()
    assert text["prompt"].startswith(choice.text)
    assert response.usage.prompt_tokens == ids["count"]


def test_text_prompts_batch_and_stop_strings(client):
    response = client.completions.create(
        model="tiny",
        prompt=["What is 1 + 2", "What is 5 + 5"],
        max_tokens=12,
        temperature=0,
        n=2,
    )
    assert len(response.choices) == 4 and [c.index for c in response.choices] == [0, 1, 2, 3]
    # a system turn and an open next turn: greedy continues with a whole user question
    prompt = "<|im_start|>system\nAnswer with one digit.<|im_end|>\n<|im_start|>"
    full = client.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0)
    text = full.choices[0].text
    assert len(text) > 4
    stop = text[2:4]
    cut = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=10, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_logprobs_match_a_forward_pass(client, inference_server, tiny_model_path):
    from transformers import AutoModelForCausalLM

    ids = httpx.post(f"{inference_server.url}/tokenize", json={"messages": question(6, 7)}).json()[
        "tokens"
    ]
    response = client.completions.create(
        model="tiny",
        prompt=ids,
        max_tokens=6,
        temperature=1.0,
        seed=3,
        logprobs=0,
        extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True},
    )
    choice = response.choices[0]
    generated = [int(t.split(":")[1]) for t in choice.logprobs.tokens]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    with torch.no_grad():
        logits = model(torch.tensor([ids + generated])).logits[0].float()
    reference = torch.log_softmax(logits, -1)
    tolerance = logprob_tolerance(logits, SAME_LIBRARY_LOGPROB_REL)
    for k, token in enumerate(generated):
        served = choice.logprobs.token_logprobs[k]
        assert abs(reference[len(ids) - 1 + k, token].item() - served) <= tolerance


def rounds(server) -> int:
    text = httpx.get(f"{server.url}/metrics").text
    return int(
        next(
            line for line in text.splitlines() if line.startswith("atropos_inference_rounds_total")
        ).split()[1]
    )


def test_concurrent_requests_are_batched(inference_server):
    async def run() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=f"{inference_server.url}/v1", api_key="x"
        ) as aclient:
            calls = [
                aclient.chat.completions.create(
                    model="tiny", messages=question(i, 1), max_tokens=4, temperature=0
                )
                for i in range(16)
            ]
            return [r.choices[0].message.content for r in await asyncio.gather(*calls)]

    before = rounds(inference_server)
    answers = asyncio.run(run())
    after = rounds(inference_server)
    assert len(answers) == 16
    assert after - before < 16, "every request ran in its own round"


def test_errors_are_openai_shaped(client, inference_server):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=question(1, 2))
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="tiny", messages=question(1, 2), max_tokens=10_000)
    assert "context length" in str(bad.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=question(1, 2), temperature=-1)
    response = httpx.post(
        f"{inference_server.url}/v1/completions", json={"model": "tiny", "prompt": [10**9]}
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    json_type = {"Content-Type": "application/json"}
    url = f"{inference_server.url}/v1/completions"
    response = httpx.post(url, content=b"{bad json", headers=json_type)
    assert response.status_code == 400 and "error" in response.json()
    response = httpx.post(url, content=b"{bad json")  # what any web page can post
    assert response.status_code == 415 and "application/json" in response.json()["error"]["message"]
    assert client.chat.completions.create(
        model="tiny", messages=question(1, 2), max_tokens=2
    ).choices
