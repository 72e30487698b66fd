"""The reference policies the trainer computes itself (--kl-reference model), and the
entropy its forward answers for the bonus, on the real tiny model."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from example_trainer.data import micro_batches  # noqa: E402
from example_trainer.logprobs import PolicyLogprobs  # noqa: E402
from example_trainer.loss import token_entropy, token_logprobs  # noqa: E402
from example_trainer.objective import forward_inputs  # noqa: E402
from tests.support.trainer_batches import make_trainer, rollout_group  # noqa: E402


def inputs(trainer):
    (chunk,) = micro_batches(trainer.sequences([rollout_group()]), 1, 0)
    return chunk, forward_inputs(chunk, trainer.device)


def base_logprobs(model_path, ids):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path).eval()
    with torch.no_grad():
        return token_logprobs(base(ids).logits, ids)


@pytest.mark.parametrize("mode", ["none", "lora_only"], ids=["frozen-copy", "lora-base"])
def test_the_reference_is_the_starting_policy_while_the_policy_moves(
    tiny_model_path, tmp_path, mode
):
    trainer = make_trainer(
        tiny_model_path,
        tmp_path,
        weight_bridge_mode=mode,
        kl_coef=0.5,
        kl_reference="model",
        lr=5e-2,
        lora_dropout=0.0,
    )
    reference = trainer.objective.reference
    assert reference is not None and reference.lora == (mode == "lora_only")
    chunk, forward = inputs(trainer)
    ids = forward[0]
    expected = base_logprobs(tiny_model_path, ids)
    first = trainer.train_step([rollout_group()])
    assert first["kl"] == pytest.approx(0.0, abs=1e-6), "policy and reference start equal"
    for _ in range(3):
        last = trainer.train_step([rollout_group()])
    with torch.no_grad():
        moved = token_logprobs(trainer.model(ids).logits, ids)
    assert not torch.allclose(moved, expected, atol=1e-4), "the policy did not train"
    assert torch.allclose(reference.logprobs(*forward), expected, atol=1e-5)
    assert last["kl"] > 1e-6, "the KL to the reference must grow once the policy moves"
    assert not any(p.requires_grad for p in reference.forward.parameters()) or reference.lora


@pytest.mark.parametrize("chunk_tokens", [0, 2])
def test_the_forward_answers_entropy_and_a_teachers_ids_chunked_or_whole(
    tiny_model_path, chunk_tokens
):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    ids = torch.tensor([[1, 5, 6, 7, 2, 9]])
    teacher_ids = torch.tensor([[[5, 0], [6, 3], [7, 7], [2, 11], [9, 4]]])  # [1, T-1, K]
    out = PolicyLogprobs(model, chunk_tokens, with_entropy=True)(ids, None, None, None, teacher_ids)
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.allclose(out["logprobs"], token_logprobs(logits, ids), atol=1e-5)
    assert torch.allclose(out["entropy"], token_entropy(logits), atol=1e-5)
    every = torch.log_softmax(logits[:, :-1], dim=-1)
    assert torch.allclose(out["extra"], every.gather(-1, teacher_ids), atol=1e-5)
    assert out["entropy"].requires_grad, "the bonus needs the entropy's gradient"
    assert out["extra"].requires_grad, "forward_topk distillation needs their gradient"
    plain = PolicyLogprobs(model, chunk_tokens)(ids, None, None, None, teacher_ids)
    assert set(plain) == {"logprobs", "extra"}


def test_an_entropy_bonus_reports_entropy_and_changes_the_step(tiny_model_path, tmp_path):
    plain = make_trainer(tiny_model_path, tmp_path / "plain")
    bonus = make_trainer(tiny_model_path, tmp_path / "bonus", entropy_coef=0.5)
    without = plain.train_step([rollout_group()])
    with_bonus = bonus.train_step([rollout_group()])
    assert "entropy" not in without and with_bonus["entropy"] > 0
    assert with_bonus["loss"] == pytest.approx(
        without["loss"] - 0.5 * with_bonus["entropy"], rel=1e-4
    )
