"""`configs/multimodal_cpu.yaml` launched as shipped, on the quick tiny VLM (tests/support/
vision.py) instead of `tiny-vl`, whose build costs about 100 s of CPU and is checked by
itself: pictures go from the environment through the CPU engine and the trainer, each
step's weights reach the engine, and the report shows the pictures. What the full config
learns is the run in docs/trainer.md (Vision-language models), not this one's question."""

from __future__ import annotations

import json

import pytest

from atroposlib.trainer_contract import read_metrics
from tests.support.launch import launched_clean, shipped

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

STEPS = 3
BATCH = 16  # 2 groups of 8


@pytest.fixture(scope="module")
def run(module_launch, quick_vlm_path):
    config = shipped("multimodal_cpu.yaml")
    config["model"] = str(quick_vlm_path)
    config["trainer"]["args"].update(training_steps=STEPS, batch_size=BATCH)
    return launched_clean(module_launch, config, "multimodal", STEPS)


def test_every_step_trains_on_pictures_and_its_weights_reach_the_engine(run, quick_vlm_path):
    from example_trainer.vision import VisionInputs

    metrics = read_metrics(run.run_dir / "metrics.jsonl")
    assert [m.step for m in metrics] == list(range(1, STEPS + 1))
    assert all((m.model_extra or {}).get("skipped_groups") == 0.0 for m in metrics)
    # the engine's sampled ids come with their logprobs: ratio and clipping are real
    assert all(m.model_extra["sequences_without_inference_logprobs"] == 0.0 for m in metrics)
    assert all((m.model_extra or {}).get("sync_s", 0) > 0 for m in metrics[:-1])
    vision = VisionInputs.for_model(str(quick_vlm_path))
    groups = [
        json.loads(line) for line in (run.run_dir / "rollouts" / "multimodal_counting.jsonl").open()
    ]
    assert groups
    for group in groups:
        for tokens, image in zip(group["tokens"], group["images"], strict=True):
            assert tokens.count(vision.image_token_id) == 16
            assert vision.problem(tokens, [image]) is None
        assert [len(row) for row in group["inference_logprobs"]] == [
            len(tokens) for tokens in group["tokens"]
        ]


def test_the_report_shows_the_pictures_above_the_answers(run):
    page = (run.run_dir / "report.html").read_text()
    assert page.count('<img class="picture" src="data:image/png;base64,') >= 2
