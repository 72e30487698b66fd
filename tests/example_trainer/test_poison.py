"""A group the trainer cannot train on is skipped and counted; the run goes on.

RUN-3 of the correctness review: a NaN at a trained position, a token id outside the
vocabulary or an empty sequence crashed the trainer, and the API served the same kept
batch to every restart, so the run died. The API now refuses such groups at intake
(tests/api/test_endpoints.py); these tests cover the ones that still reach a trainer,
such as a group queued before the trainer declared its vocabulary.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from atroposlib.trainer_contract import (  # noqa: E402
    groups_path,
    metrics_path,
    read_metrics,
    read_trained_groups,
)
from example_trainer.data import split_trainable  # noqa: E402
from tests.support.trainer_batches import (  # noqa: E402
    PROMPT,
    make_trainer,
    rollout_group,
)

NAN = float("nan")


def test_split_trainable_keeps_the_good_groups_and_says_why_of_each_other():
    good = rollout_group()
    batch = [
        rollout_group(inference_logprobs=[[1.0] * 3 + [NAN, -0.2], [1.0] * 3 + [-1.5, -0.3]]),
        good,
        rollout_group(tokens=[PROMPT + [7, 400], PROMPT + [8, 2]]),
        rollout_group(tokens=[PROMPT + [7, 2], []], masks=[[-100] * 3 + [7, 2], []]),
    ]
    kept, skipped = split_trainable(batch, vocab_size=319)
    assert [group.tokens for group in kept] == [good["tokens"]]
    assert skipped == {
        0: "group 0 sequence 0: inference_logprobs[0][3] is nan at a trained position",
        2: "group 2 sequence 0: token id 400 is outside 0 to 318, the trainer's vocabulary",
        3: "group 3 sequence 1: a sequence needs at least one token",
    }


def test_a_group_queued_before_the_vocabulary_was_known_is_skipped_not_fatal(
    api, wire_client, tiny_model_path, tmp_path
):
    # posted before any trainer registered its vocabulary: the API had no bound to check
    poison = rollout_group(tokens=[PROMPT + [7, 10**6], PROMPT + [8, 2]], group_id="poison")
    groups = [poison] + [rollout_group(group_id=f"g{n}") for n in (1, 2, 3)]
    for group in groups:
        assert wire_client.post("/scored_data", json=group).is_success
    save = tmp_path / "ckpt"
    trainer = make_trainer(
        tiny_model_path, save, atropos_url=api.url, training_steps=2, batch_size=4
    )
    trainer.run()  # used to raise IndexError on the embedding lookup, on every restart

    assert trainer.step == 2
    trained = read_trained_groups(groups_path(save))
    assert [(r.step, r.group_ids, r.skipped_ids) for r in trained] == [
        (1, ["g1"], ["poison"]),
        (2, ["g2", "g3"], []),
    ]
    assert [row.model_extra["skipped_groups"] for row in read_metrics(metrics_path(save))] == [
        1.0,
        0.0,
    ]


def test_a_step_whose_every_group_is_skipped_still_counts(tiny_model_path, tmp_path):
    trainer = make_trainer(tiny_model_path, tmp_path / "ckpt")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    bad = rollout_group(tokens=[PROMPT + [7, -1], PROMPT + [8, 2]])
    metrics = trainer.train_step([bad])
    assert metrics["skipped_groups"] == 1.0 and metrics["sequences"] == 0.0
    after = list(trainer.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))  # no update
    assert trainer.scheduler.last_epoch == 1  # the schedule follows the steps
