"""Each engine start draws a stream of its own (RNG-1 of the trainer review: every start
seeded its shared generator with 0, so a restart replayed it, and two engines of one run
returned the same samples for a prompt split between them)."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from atroposlib.inference.sampler import GenerationJob, SamplingParams, TransformersSampler  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def loaded(tiny_model_path) -> TransformersSampler:
    return TransformersSampler.load(str(tiny_model_path))


def samples(loaded: TransformersSampler, seed: int | None) -> list[list[int]]:
    """n=8 unseeded samples from an engine started on `loaded`'s model with `seed`."""
    engine = TransformersSampler(loaded.model, loaded.tokenizer, loaded.max_model_len, seed=seed)
    job = GenerationJob(loaded.tokenizer.encode("What is 3 + 4 mod 10?"), SamplingParams(6, n=8))
    engine.run([job])
    return [sample.token_ids for sample in job.samples]


def test_two_starts_draw_apart_unless_given_one_seed(loaded, caplog):
    with caplog.at_level(logging.INFO, logger="atroposlib.inference.sampler"):
        first, second = samples(loaded, None), samples(loaded, None)
    assert first != second
    seeds = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sampling seed")]
    assert len(seeds) == 2 and seeds[0] != seeds[1]  # each start says which it drew
    assert samples(loaded, 1234) == samples(loaded, 1234)  # --seed: a run can be repeated
