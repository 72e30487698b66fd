"""The CPU inference server serving a vision-language model: OpenAI `image_url` parts
(data URLs) go through the model's own processor, as vLLM's do, and bad pictures are
400s that name `messages`. A real `atropos-inference-server` on the quick tiny VLM."""

from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")

from atroposlib.utils.counting_pictures import make_item  # noqa: E402
from atroposlib.utils.image_messages import prompt_with_pictures  # noqa: E402
from tests.support.processes import InferenceProcess  # noqa: E402
from tests.support.vision import picture_messages  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(quick_vlm_path, tmp_path_factory):
    process = InferenceProcess(quick_vlm_path, tmp_path_factory.mktemp("vl"), "tiny-vl")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def processor(quick_vlm_path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(quick_vlm_path)


def test_a_picture_prompt_is_the_processors_expansion_in_chat_and_tokenize(server, processor):
    messages = picture_messages(make_item(9, "total"))
    expected, _ = prompt_with_pictures(processor, messages, True)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert expected.count(image_token) == 16
    tokenized = httpx.post(f"{server.url}/tokenize", json={"messages": messages}).json()
    assert tokenized["tokens"] == expected
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
    reply = client.chat.completions.create(
        model="tiny-vl", messages=messages, n=3, max_tokens=3, logprobs=True, seed=4
    )
    assert reply.usage.prompt_tokens == len(expected)
    assert len(reply.choices) == 3
    assert all(len(choice.logprobs.content) >= 1 for choice in reply.choices)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://example.com/cat.png", "nothing is fetched"),
        ("data:image/png;base64,AAAA", "not a base64 picture"),
    ],
)
def test_a_picture_it_cannot_read_is_a_400_naming_messages(server, url, says):
    content = [
        {"type": "text", "text": "How many?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    body = {"model": "tiny-vl", "messages": [{"role": "user", "content": content}]}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "messages" and says in error["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200  # and it still serves
