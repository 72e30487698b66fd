"""The importance-sampling correction under the sampling settings environments use
(IS-1 of the trainer review: the engine reported the raw model's logprobs whatever the
temperature or top-p, so the correction of a top-p rollout was 1 where the behaviour
policy's true ratio is the nucleus's mass).

The engine samples the tiny model; the trainer's own functions (`loss.token_logprobs`,
`importance.correction_weights`) give the sequence weight; the true ratio pi_old / mu
comes from the distribution the sample was drawn from, rebuilt here from the logits.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from atroposlib.inference.sampler import GenerationJob, SamplingParams, TransformersSampler  # noqa: E402
from example_trainer.importance import correction_weights  # noqa: E402
from example_trainer.loss import token_logprobs  # noqa: E402
from tests.support.sampling import drawn_from  # noqa: E402

pytestmark = pytest.mark.integration

AGREEMENT = 1e-3
"""The issue's bound between the trainer's weight and the true ratio."""


@pytest.fixture(scope="module")
def raw_engine(tiny_model_path) -> TransformersSampler:
    return TransformersSampler.load(str(tiny_model_path))


def weights_and_truth(engine, temperature: float, top_p: float) -> tuple[list, list]:
    """Per sample, the trainer's sequence weight and the true pi_old / mu."""
    prompt = engine.tokenizer.encode("What is 3 + 4 mod 10?")
    params = SamplingParams(8, n=16, temperature=temperature, top_p=top_p, seed=3)
    job = GenerationJob(prompt, params)
    engine.run([job])
    computed, truth = [], []
    with torch.no_grad():
        for sample in job.samples:
            ids = torch.tensor([prompt + sample.token_ids])
            logits = engine.model(input_ids=ids).logits.float()
            old = token_logprobs(logits, ids)[:, len(prompt) - 1 :]  # the trainer's, raw
            behaviour = torch.tensor([sample.logprobs])
            trained = torch.ones_like(old, dtype=torch.bool)
            segments = torch.zeros_like(old, dtype=torch.long)
            weights, _ = correction_weights(
                old, behaviour, trained, segments, 1, "sequence_truncate", None, None
            )
            computed.append(float(weights[0, 0]))
            sampled = drawn_from(logits[0, len(prompt) - 1 : -1], temperature, top_p)
            mu = sampled.gather(1, ids[0, len(prompt) :, None]).squeeze(1)
            truth.append(float(torch.exp((old[0] - mu).sum())))
    return computed, truth


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 0.95), (1.0, 0.7), (0.7, 1.0)])
def test_with_processed_logprobs_the_weight_is_the_true_ratio(raw_engine, temperature, top_p):
    """(1.0, 0.95) is the MATH environment's default. The trainer runs its engines with
    --logprobs-mode processed_logprobs when the correction is on (example_trainer/engine.py)."""
    engine = TransformersSampler(
        raw_engine.model,
        raw_engine.tokenizer,
        raw_engine.max_model_len,
        logprobs_mode="processed_logprobs",
    )
    computed, truth = weights_and_truth(engine, temperature, top_p)
    assert max(abs(c - t) for c, t in zip(computed, truth, strict=True)) <= AGREEMENT
    assert any(abs(t - 1.0) > AGREEMENT for t in truth), "settings that change the ratio"


def test_with_raw_logprobs_top_p_goes_uncorrected(raw_engine):
    """What the review measured, and why the trainer asks for processed logprobs."""
    computed, truth = weights_and_truth(raw_engine, 1.0, 0.7)
    assert all(abs(c - 1.0) < 1e-4 for c in computed)
    assert max(abs(c - t) for c, t in zip(computed, truth, strict=True)) > AGREEMENT


@pytest.mark.parametrize("kind", ["transformers", "vllm"])
def test_the_trainer_asks_its_engines_for_processed_logprobs_when_it_corrects(kind, tmp_path):
    from atroposlib.inference.engines import engine_kind
    from example_trainer.config import TrainingConfig
    from example_trainer.serving import engine_config

    for correcting in (True, False):
        config = TrainingConfig(
            model_name="tiny",
            save_path=str(tmp_path),
            inference_engine=kind,
            vllm_importance_sampling_correction=correcting,
            ratio_reference="trainer",
        )
        args = engine_config(config, engine_kind(kind), 0).extra_args
        assert ("--logprobs-mode" in args) == correcting
        if correcting:
            assert args[args.index("--logprobs-mode") + 1] == "processed_logprobs"
