"""The quick tiny VLM the vision tests share, and image groups sampled from it."""

from __future__ import annotations

from typing import Any

from atroposlib.utils.counting_pictures import make_item
from atroposlib.utils.tiny_vlm import TinyVlmSpec

QUICK_VLM = TinyVlmSpec(pictures=64, held_out=16, batch_size=8, read_steps=2, max_steps=2)
"""A few steps of the build (about 10 s): the real architecture, processor and files,
weights that do not count yet. For plumbing; the full build's figures are its own check."""


def picture_messages(item: dict[str, Any]) -> list[dict[str, Any]]:
    """A counting question with its picture, as the environment sends it."""
    url = f"data:image/png;base64,{item['image']}"
    content = [
        {"type": "text", "text": item["question"]},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    return [{"role": "user", "content": content}]


def sampled_groups(engine: Any, seeds: list[int], n: int = 4, max_tokens: int = 3) -> list[dict]:
    """One group per seed's picture, sampled by `engine` (a `TransformersSampler` of a VLM),
    tokens and masks as the environment makes them, scores alternating 1 and 0."""
    from atroposlib.inference.sampler import GenerationJob, SamplingParams
    from atroposlib.utils.image_messages import prompt_with_pictures

    groups = []
    for seed in seeds:
        item = make_item(seed, "total")
        ids, pictures = prompt_with_pictures(engine.processor, picture_messages(item), True)
        job = GenerationJob(ids, SamplingParams(max_tokens=max_tokens, n=n, seed=seed), pictures)
        engine.run([job])
        groups.append(
            {
                "tokens": [ids + s.token_ids for s in job.samples],
                "masks": [[-100] * len(ids) + s.token_ids for s in job.samples],
                "scores": [float(i % 2 == 0) for i in range(n)],
                "inference_logprobs": [[1.0] * len(ids) + s.logprobs for s in job.samples],
                "images": [item["image"]] * n,
            }
        )
    return groups
