"""A prompt's samples share one prefill: what each sample gets must not depend on it.

`TransformersSampler` prefills each prompt once and copies its KV cache to its `n` rows.
A cache copied to the wrong row, or a row's mask or positions left behind, would give
a sample another prompt's continuation; these tests would then see other tokens than
the job run alone, and logprobs other than the model's own forward pass.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from atroposlib.inference.sampler import GenerationJob, SamplingParams, TransformersSampler  # noqa: E402
from tests.support.tolerances import SAME_LIBRARY_LOGPROB_REL, logprob_tolerance  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    return TransformersSampler.load(str(tiny_model_path))


def jobs(engine) -> list[GenerationJob]:
    """Prompts of three lengths, with 3, 1 and 4 samples; the middle one scores its prompt."""
    encode = engine.tokenizer.encode
    return [
        GenerationJob(encode("What is 3 + 4 mod 10?"), SamplingParams(6, n=3, seed=5)),
        GenerationJob(
            encode("Answer with one digit. What is 9 + 9 mod 10?"),
            SamplingParams(5, n=1, seed=9, prompt_logprobs=1),
        ),
        GenerationJob(encode("2 + 2"), SamplingParams(4, n=4, seed=2, ignore_eos=True)),
    ]


def test_a_round_of_several_prompts_gives_each_what_it_gets_alone(engine):
    together = jobs(engine)
    engine.run(together)
    for index, job in enumerate(together):
        alone = jobs(engine)[index]
        engine.run([alone])
        assert len(job.samples) == job.params.n
        assert [s.token_ids for s in job.samples] == [s.token_ids for s in alone.samples]
        for shared, single in zip(job.samples, alone.samples, strict=True):
            assert shared.logprobs == pytest.approx(single.logprobs, abs=1e-4)
    scored = together[1]
    assert scored.prompt_logprobs is not None
    assert len(scored.prompt_logprobs) == len(scored.prompt_ids) - 1


def test_every_samples_logprobs_are_the_models_own_over_its_prompt(engine):
    batch = jobs(engine)
    engine.run(batch)
    checked = 0
    for job in batch:
        for sample in job.samples:
            ids = torch.tensor([job.prompt_ids + sample.token_ids])
            with torch.no_grad():
                logits = engine.model(input_ids=ids).logits[0].float()
            start = len(job.prompt_ids) - 1
            expected = torch.log_softmax(logits[start : start + len(sample.token_ids)], dim=-1)
            own = expected.gather(1, torch.tensor(sample.token_ids)[:, None]).squeeze(1)
            bound = logprob_tolerance(logits, SAME_LIBRARY_LOGPROB_REL)
            assert torch.allclose(torch.tensor(sample.logprobs), own, atol=bound, rtol=0)
            checked += 1
    assert checked == 8
