"""Losses are registered kinds: a name is checked against the registry, a user's loss
is loaded by import path, and the trainer trains with whatever is registered."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from example_trainer.config import TrainingConfig  # noqa: E402
from example_trainer.loss import LossSettings, policy_loss  # noqa: E402
from example_trainer.losses import (  # noqa: E402
    LOSSES,
    LossOutputs,
    clipped_surrogate,
    load_loss,
    register_loss,
)
from tests.support import custom_loss  # noqa: E402
from tests.support.trainer_batches import make_trainer, rollout_group  # noqa: E402


def config(**fields) -> TrainingConfig:
    return TrainingConfig(model_name="m", **fields)


def test_an_unknown_loss_is_refused_with_the_names_there_are():
    with pytest.raises(ValueError, match=r"no loss named 'sapo'; registered: cispo, dapo, dr_grpo"):
        config(loss_type="sapo")


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="'dapo' is already registered"):
        register_loss("dapo", trl=None)(custom_loss.plain_reinforce)
    # registering the same function again (a module imported twice) is no error
    register_loss("dapo", trl="dapo")(clipped_surrogate)
    assert LOSSES["dapo"].per_token is clipped_surrogate


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.support.custom_loss", "wants module:function"),
        ("tests.support.no_such_module:fn", "no module 'tests.support.no_such_module'"),
        ("no_such_package.losses:fn", "no module 'no_such_package.losses'"),
        ("tests.support.custom_loss:missing", "has no function 'missing'"),
        ("tests.support.custom_loss:CALLS", "has no function 'CALLS'"),
    ],
)
def test_a_bad_import_path_is_refused_with_what_is_wrong(path, message):
    with pytest.raises(ValueError, match=message):
        config(loss_import_path=path)


def test_an_import_path_and_a_loss_type_together_are_refused():
    with pytest.raises(ValueError, match="give one"):
        config(loss_import_path="tests.support.custom_loss:plain_reinforce", loss_type="grpo")


def test_a_plain_function_is_registered_under_its_path_and_a_decorated_one_by_its_name():
    plain = config(loss_import_path="tests.support.custom_loss:plain_reinforce")
    assert plain.loss.loss_type == "tests.support.custom_loss:plain_reinforce"
    assert LOSSES[plain.loss.loss_type].normaliser == "token"
    assert LOSSES[plain.loss.loss_type].trl_loss_type is None
    decorated = load_loss("tests.support.custom_loss:sequence_reinforce")
    assert decorated.name == "test_sequence_reinforce" and decorated.normaliser == "sequence"


def test_the_registered_normaliser_is_the_one_applied():
    """The same function under grpo's normaliser gives grpo's loss, not dapo's."""
    generator = torch.Generator().manual_seed(0)
    logp = -torch.rand(2, 4, generator=generator, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    advantages = torch.tensor([[1.0] * 4, [-1.0] * 4], dtype=torch.float64)

    def loss(name: str) -> float:
        value, _ = policy_loss(logp, logp, advantages, mask, LossSettings(name), 5, 2)
        return value.item()

    register_loss("test_grpo_again", trl=None, normaliser="sequence")(clipped_surrogate)
    assert loss("test_grpo_again") == loss("grpo") != pytest.approx(loss("dapo"))
    load_loss("tests.support.custom_loss:sequence_reinforce")
    # each sequence's mean of -A logp, over the 2 sequences
    per_sequence = (-(advantages * logp * mask).sum(1) / mask.sum(1)).sum() / 2
    assert loss("test_sequence_reinforce") == pytest.approx(per_sequence.item())


def test_a_loss_of_ones_own_trains_a_step(tiny_model_path, tmp_path):
    trainer = make_trainer(
        tiny_model_path, tmp_path, loss_import_path="tests.support.custom_loss:plain_reinforce"
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    custom_loss.CALLS.clear()
    metrics = trainer.train_step([rollout_group()])
    assert custom_loss.CALLS, "the trainer never called the loss"
    outputs: list[LossOutputs] = custom_loss.CALLS
    tokens = sum(int(o.per_token.ne(0).sum()) for o in outputs)
    assert tokens > 0
    # the step's policy-gradient loss is the function's answer, per trained token
    answered = sum(float(o.per_token.detach().sum()) for o in outputs)
    assert metrics["pg_loss"] == pytest.approx(answered / metrics["tokens"], rel=1e-5)
    after = list(trainer.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
