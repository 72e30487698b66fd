"""A vision-language policy in the trainer (example_trainer/vision.py): its logprobs on
picture samples are the engine's, a group whose image tokens miss its pictures is skipped
with both counts, a step trains the language model and leaves a frozen picture encoder,
and the engine takes the trained weights. All in-process on the quick tiny VLM (tests/
support/vision.py, built once per session in about 10 s of CPU)."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from atroposlib.inference.sampler import (  # noqa: E402
    GenerationJob,
    SamplingParams,
    TransformersSampler,
)
from atroposlib.utils.counting_pictures import make_item  # noqa: E402
from atroposlib.utils.image_messages import prompt_with_pictures  # noqa: E402
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer  # noqa: E402
from example_trainer.checkpoint import save_checkpoint  # noqa: E402
from example_trainer.grpo import Trainer  # noqa: E402
from example_trainer.logprobs import PolicyLogprobs  # noqa: E402
from example_trainer.vision import VisionInputs, vision_tower  # noqa: E402
from tests.support.tolerances import SAME_LIBRARY_LOGPROB_REL, logprob_tolerance  # noqa: E402
from tests.support.trainer_batches import make_trainer  # noqa: E402
from tests.support.vision import picture_messages, sampled_groups  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine(quick_vlm_path):
    return TransformersSampler.load(str(quick_vlm_path), seed=3)


def trainer_for(path, tmp_path, **settings) -> Trainer:
    """No engine, one thread; sequences of a picture prompt fit (seq_len 256)."""
    return make_trainer(path, tmp_path, **{"lr": 1e-2, "seq_len": 256, **settings})


@pytest.mark.parametrize("chunk_tokens", [0, 5])
def test_the_trainers_logprobs_on_picture_samples_are_the_engines(engine, chunk_tokens):
    """Two picture prompts and a text one share the engine's left-padded round; the
    trainer re-scores each sample on its own row with the processor's pixels, whole or
    chunked (--logprob-chunk-tokens), to the text path's bound."""
    items = [make_item(7, "total"), make_item(8, "total")]
    jobs = []
    for item in items:
        ids, pictures = prompt_with_pictures(engine.processor, picture_messages(item), True)
        jobs.append(GenerationJob(ids, SamplingParams(max_tokens=4, n=2, seed=1), pictures))
    text_ids = engine.tokenizer("How many shapes?")["input_ids"]
    jobs.append(GenerationJob(text_ids, SamplingParams(max_tokens=4, n=1, seed=1)))
    engine.run(jobs)
    vision = VisionInputs(engine.processor)
    policy = PolicyLogprobs(engine.model, chunk_tokens)
    checked = 0
    for item, job in zip(items, jobs, strict=False):
        for sample in job.samples:
            tokens = job.prompt_ids + sample.token_ids
            assert vision.problem(tokens, [item["image"]]) is None
            pixels = vision.tensors([[item["image"]]], torch.float32)
            ids = torch.tensor([tokens])
            with torch.no_grad():
                mine = policy(ids, torch.ones_like(ids), pixels=pixels)[0]
                logits = engine.model(input_ids=ids, **pixels).logits[0]
            start = len(job.prompt_ids) - 1
            bound = logprob_tolerance(logits, SAME_LIBRARY_LOGPROB_REL)
            assert torch.allclose(
                mine[start:], torch.tensor(sample.logprobs), atol=bound, rtol=0
            ), (mine[start:], sample.logprobs)
            checked += 1
    assert checked == 4


def test_a_group_whose_image_tokens_miss_its_pictures_is_skipped_naming_both(
    engine, quick_vlm_path, tmp_path, caplog
):
    """Text-only tokens (the picture as one `<image>`) and tokens cut inside the picture
    by --seq-len are refused; the good group trains."""
    good = sampled_groups(engine, [11])[0]
    item = make_item(12, "total")
    flat = [
        {"role": "user", "content": f"{item['question']}\n<image>"},
        {"role": "assistant", "content": "5"},
    ]
    text = tokenize_for_trainer(engine.tokenizer, flat)
    as_text = {**good, "tokens": [text["tokens"]] * 2, "masks": [text["masks"]] * 2}
    as_text.update(scores=[1.0, 0.0], images=[item["image"]] * 2, inference_logprobs=None)
    nested = {**good, "images": [[["not", ["a", "picture"]]]] * 4}  # API-A's shape
    trainer = trainer_for(quick_vlm_path, tmp_path)
    with caplog.at_level(logging.WARNING, logger="example_trainer"):
        metrics = trainer.train_step([good, as_text, nested])
    assert trainer.skipped_groups == {1, 2} and metrics["skipped_groups"] == 2.0
    assert "group 2 sequence 0: an image must be a base64 string, not list" in caplog.text
    assert metrics["sequences"] == 4.0
    said = caplog.text
    assert "group 1 sequence 0: it holds 1 image tokens (<image>)" in said
    assert "expands its 1 picture(s) to 16" in said
    cut_at = good["tokens"][0].index(trainer.vision.image_token_id) + 3
    with caplog.at_level(logging.WARNING, logger="example_trainer"):
        short = trainer_for(
            quick_vlm_path, tmp_path / "short", seq_len=cut_at, shared_prompt_forward=True
        )
    assert "--shared-prompt-forward: a vision-language policy runs each row whole" in caplog.text
    assert not short.forward.shares_prompts and not short.forward.packs
    assert short.train_step([good])["skipped_groups"] == 1.0


@pytest.mark.parametrize(("frozen", "parallelism"), [(True, "ddp"), (False, "ddp"), (True, "fsdp")])
def test_a_step_trains_the_language_model_and_a_frozen_encoder_stays(
    engine, quick_vlm_path, tmp_path, frozen, parallelism
):
    """One process: ddp is the plain module; fsdp shards every layer the model names,
    the vision encoder's among them, frozen or not."""
    trainer = trainer_for(
        quick_vlm_path, tmp_path, freeze_vision_tower=frozen, parallelism=parallelism
    )
    try:
        name, tower = vision_tower(trainer.model)
        assert name == "model.vision_model"

        def weights() -> dict[str, torch.Tensor]:
            return {
                n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                for n, p in trainer.model.named_parameters()
            }

        before = weights()
        metrics = trainer.train_step(sampled_groups(engine, [21, 22]))
        after = weights()
    finally:
        trainer.parallel.close()
    assert metrics["skipped_groups"] == 0.0 and metrics["sequences"] == 8.0
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    in_tower = {n for n in moved if n.startswith(f"{name}.")}
    assert any(n.startswith("model.text_model.") for n in moved)
    assert any(n.startswith("model.connector.") for n in moved)
    assert (not in_tower) if frozen else in_tower
    assert all(not p.requires_grad for p in tower.parameters()) == frozen


def test_the_engine_serves_the_trained_vlm_by_hot_reload_and_from_its_checkpoint(
    engine, quick_vlm_path, tmp_path
):
    """A checkpoint holds the processor beside the weights (a restarted engine loads it
    whole); the running engine takes its weights and then scores as the trained policy."""
    trainer = trainer_for(quick_vlm_path, tmp_path)
    groups = sampled_groups(engine, [31])
    trainer.train_step(groups)
    trainer.step = 1
    parts = (trainer.optimizer, trainer.scheduler)
    path = save_checkpoint(str(tmp_path), 1, trainer.model, trainer.serving.tokenizer, *parts)
    restarted = TransformersSampler.load(str(path), seed=0)
    assert restarted.processor is not None
    hot = TransformersSampler.load(str(quick_vlm_path), seed=0)
    hot.load_weights(str(path), "step-1")
    tokens, image = groups[0]["tokens"][0], groups[0]["images"][0]
    pixels = trainer.vision.tensors([[image]], torch.float32)
    ids = torch.tensor([tokens])
    with torch.no_grad():
        trained = trainer.model(input_ids=ids, **pixels).logits
        for served in (restarted, hot):
            assert torch.allclose(served.model(input_ids=ids, **pixels).logits, trained, atol=1e-5)


def test_lora_adapts_the_language_model_alone_while_the_encoder_is_frozen(
    engine, quick_vlm_path, tmp_path
):
    pytest.importorskip("peft")
    trainer = trainer_for(
        quick_vlm_path,
        tmp_path,
        weight_bridge_mode="lora_restart",
        lora_r=4,
        lora_target_modules="q_proj,v_proj",
    )
    adapted = {n.split(".lora_")[0] for n, _ in trainer.model.named_parameters() if ".lora_" in n}
    assert adapted and all(".text_model." in n for n in adapted), sorted(adapted)
    metrics = trainer.train_step(sampled_groups(engine, [41]))
    assert metrics["skipped_groups"] == 0.0 and metrics["grad_norm"] > 0


def test_a_loss_variant_with_a_model_reference_and_chunked_logprobs_sees_the_pictures(
    engine, quick_vlm_path, tmp_path
):
    """CISPO, the KL to a reference model the trainer loads (the VLM's auto class, the same
    pixels) and --logprob-chunk-tokens: at the first step policy and reference are one
    model, so the KL is zero only if both read the pictures (a reference without pixels,
    its image tokens bare embeddings, gave a KL of 0.005 here)."""
    trainer = trainer_for(
        quick_vlm_path,
        tmp_path,
        loss_type="cispo",
        kl_coef=0.1,
        kl_reference="model",
        logprob_chunk_tokens=7,
    )
    metrics = trainer.train_step(sampled_groups(engine, [51]))
    assert metrics["skipped_groups"] == 0.0 and metrics["grad_norm"] > 0
    assert abs(metrics["kl"]) < 1e-6, metrics["kl"]


def test_tokenize_with_pictures_masks_the_expanded_prompt_and_trains_the_reply(engine):
    """The helper for environments without the engine's sampled ids: the prompt is the
    processor's expansion (masked), the reply and its end are trained."""
    from atroposlib.utils.image_messages import tokenize_with_pictures

    messages = picture_messages(make_item(61, "total"))
    prompt, _ = prompt_with_pictures(engine.processor, messages, True)
    made = tokenize_with_pictures(engine.processor, messages, "5", "stop")
    assert made["tokens"][: len(prompt)] == prompt
    assert made["masks"][: len(prompt)] == [-100] * len(prompt)
    reply = made["tokens"][len(prompt) :]
    assert made["masks"][len(prompt) :] == reply
    assert engine.tokenizer.decode(reply).startswith("5<|im_end|>")
    cut = tokenize_with_pictures(engine.processor, messages, "5", "length")
    assert engine.tokenizer.decode(cut["tokens"][len(prompt) :]) == "5"
