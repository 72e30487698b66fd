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


def test_the_counting_environment_sends_tokens_the_trainer_accepts(
    server, quick_vlm_path, tmp_path
):
    """`process` against this engine with the VLM's processor as tokenizer: each
    sequence holds the picture's 16 image tokens, as the trainer's check wants them."""
    import json
    import subprocess
    import sys

    from example_trainer.vision import VisionInputs

    out = tmp_path / "groups.jsonl"
    command = [
        sys.executable,
        "environments/multimodal_counting.py",
        "process",
        *("--env.total_steps", "1", "--env.group_size", "2", "--env.train_size", "2"),
        *("--env.max_tokens", "3", "--env.question_kind", "total"),
        *("--env.answer_format", "bare", "--env.tokenizer_name", str(quick_vlm_path)),
        *("--env.ensure_scores_are_not_same", "false", "--env.use_wandb", "false"),
        *("--env.data_path_to_save_groups", str(out)),
        *("--openai.base_url", f"{server.url}/v1", "--openai.model_name", "tiny-vl"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert groups
    vision = VisionInputs.for_model(str(quick_vlm_path))
    for group in groups:
        for tokens, image in zip(group["tokens"], group["images"], strict=True):
            assert tokens.count(vision.image_token_id) == 16
            assert vision.problem(tokens, [image]) is None
