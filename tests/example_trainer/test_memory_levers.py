"""The memory levers change what a step holds, never what it computes.

Chunked token logprobs, gradient checkpointing and micro-batches cut by a token budget
each give the gradients of the plain step. For the logprobs, both paths take float32
logits of the same head and subtract a log-sum-exp over the vocabulary; only the order
of the sums differs. So values agree to `SAME_LIBRARY_LOGPROB_REL` of the largest
|logit| and gradients to `GRADIENT_REL_TO_SCALE` of the largest gradient entry
(tests/support/tolerances.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from example_trainer.logprobs import (  # noqa: E402
    PolicyLogprobs,
    chunked_token_logprobs,
    head_is_plain_linear,
)
from example_trainer.loss import token_logprobs  # noqa: E402
from tests.support.tolerances import (  # noqa: E402
    GRADIENT_REL_TO_SCALE,
    SAME_LIBRARY_LOGPROB_REL,
    assert_close_to_scale,
    logprob_tolerance,
)


def gradients(values: torch.Tensor, weights: torch.Tensor, *tensors: torch.Tensor) -> list:
    return list(torch.autograd.grad((values * weights).sum(), tensors))


@pytest.mark.parametrize("chunk", [1, 7, 36, 500])
@pytest.mark.parametrize("bias", [False, True])
def test_chunks_give_the_full_values_and_gradients(chunk, bias):
    generator = torch.Generator().manual_seed(chunk)
    hidden = torch.randn(3, 13, 16, generator=generator, requires_grad=True)
    head = nn.Linear(16, 1000, bias=bias)
    ids = torch.randint(0, 1000, (3, 13), generator=generator)
    weights = torch.randn(3, 12, generator=generator)  # a loss that weighs each token

    logits = head(hidden)
    full = token_logprobs(logits, ids)
    chunked = chunked_token_logprobs(hidden, head, ids, chunk)
    assert chunked.shape == full.shape == (3, 12)
    assert (chunked - full).abs().max() <= logprob_tolerance(logits, SAME_LIBRARY_LOGPROB_REL)
    params = (hidden, head.weight, *([head.bias] if bias else []))
    for got, want in zip(
        gradients(chunked, weights, *params), gradients(full, weights, *params), strict=True
    ):
        assert_close_to_scale(got, want, GRADIENT_REL_TO_SCALE)


def test_without_gradients_no_graph_is_kept():
    head = nn.Linear(8, 50)
    with torch.no_grad():
        values = chunked_token_logprobs(torch.randn(2, 5, 8), head, torch.zeros(2, 5).long(), 3)
    assert values.shape == (2, 4) and values.grad_fn is None and (values <= 0).all()


def test_a_chunk_size_below_one_is_refused():
    with pytest.raises(ValueError, match="chunk_tokens must be at least 1"):
        chunked_token_logprobs(torch.zeros(1, 2, 4), nn.Linear(4, 5), torch.zeros(1, 2).long(), 0)


def test_the_wrapped_tiny_policy_trains_the_same_either_way(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float32)
    assert head_is_plain_linear(model)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0)
    )
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # a left-padded row
    weights = torch.randn(2, 23, generator=torch.Generator().manual_seed(1))
    params = [p for p in model.parameters() if p.requires_grad]
    full = PolicyLogprobs(model, 0)(ids, mask)
    chunked = PolicyLogprobs(model, 10)(ids, mask)
    logits = model(input_ids=ids, attention_mask=mask).logits
    assert (chunked - full).abs().max() <= logprob_tolerance(logits, SAME_LIBRARY_LOGPROB_REL)
    for got, want in zip(
        gradients(chunked, weights, *params), gradients(full, weights, *params), strict=True
    ):
        assert_close_to_scale(got, want, GRADIENT_REL_TO_SCALE)


class SoftCapped(nn.Module):
    """A model whose logits are soft-capped after the head (Gemma 2's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(final_logit_softcapping=30.0)
        self.head = nn.Linear(4, 9)

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def forward(self, input_ids: torch.Tensor, **_: object):
        hidden = torch.ones(*input_ids.shape, 4)
        return SimpleNamespace(logits=30.0 * torch.tanh(self.head(hidden) / 30.0))


def test_a_model_with_more_than_a_linear_head_keeps_the_full_path(caplog):
    model = SoftCapped()
    assert not head_is_plain_linear(model)
    wrapped = PolicyLogprobs(model, 16)
    assert wrapped.chunk_tokens == 0
    assert "computing them whole" in caplog.text
    ids = torch.zeros(1, 3).long()
    expected = token_logprobs(model(ids).logits, ids)
    assert torch.equal(wrapped(ids, torch.ones_like(ids)), expected)


def test_a_trainer_step_with_chunked_logprobs_matches_the_whole_one(tiny_model_path, tmp_path):
    """The same batch from the same weights: the loss, its metrics and every gradient agree."""
    from example_trainer.data import split_trainable
    from tests.support.trainer_batches import make_trainer, rollout_group

    batch = [rollout_group(), rollout_group(scores=[0.0, 1.0])]
    steps = {}
    for chunk in (0, 3):
        trainer = make_trainer(tiny_model_path, tmp_path / str(chunk), logprob_chunk_tokens=chunk)
        assert trainer.forward.module.chunk_tokens == chunk
        groups, skipped = split_trainable(batch, trainer.vocab_size)
        assert not skipped
        metrics = trainer.accumulate_gradients(trainer.sequences(groups))
        steps[chunk] = metrics, [p.grad.clone() for p in trainer.model.parameters()]
    (whole, whole_grads), (chunked, chunked_grads) = steps[0], steps[3]
    for key in ("loss", "pg_loss", "logprob_mismatch"):
        assert chunked[key] == pytest.approx(whole[key], rel=GRADIENT_REL_TO_SCALE, abs=1e-7), key
    assert any(g.abs().max() > 0 for g in whole_grads)
    for got, want in zip(chunked_grads, whole_grads, strict=True):
        assert_close_to_scale(got, want, GRADIENT_REL_TO_SCALE)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_path, tmp_path):
    """Recomputing each layer in backward changes what is kept, not what is computed."""
    from example_trainer.data import split_trainable
    from tests.support.trainer_batches import make_trainer, rollout_group

    batch = [rollout_group(), rollout_group(scores=[0.0, 1.0])]
    grads = {}
    for on in (False, True):
        trainer = make_trainer(tiny_model_path, tmp_path / str(on), gradient_checkpointing=on)
        model = trainer.model
        checkpointing = getattr(model, "is_activation_checkpointing", None)
        assert (model.is_gradient_checkpointing if checkpointing is None else checkpointing) == on
        groups, _ = split_trainable(batch, trainer.vocab_size)
        trainer.accumulate_gradients(trainer.sequences(groups))
        grads[on] = [p.grad.clone() for p in trainer.model.parameters()]
    assert any(g.abs().max() > 0 for g in grads[False])
    for got, want in zip(grads[True], grads[False], strict=True):
        assert_close_to_scale(got, want, GRADIENT_REL_TO_SCALE)


def sequences_of(lengths: list[int]) -> list:
    from example_trainer.data import Sequence

    return [Sequence([1] * n, [-100] + [1] * (n - 1), 0.0, [0.0] * n, None, None) for n in lengths]


@pytest.mark.parametrize("budget", [1, 10, 24, 40, 1000])
def test_a_token_budget_bounds_every_micro_batch_and_keeps_every_sequence(budget):
    from example_trainer.data import micro_batches

    lengths = [9, 3, 12, 3, 7, 20, 5, 5, 8]
    chunks = micro_batches(sequences_of(lengths), 1, 0, token_budget=budget)
    rows = sorted(int(n) for chunk in chunks for n in chunk.attention_mask.sum(dim=1))
    assert rows == sorted(lengths)
    for chunk in chunks:
        count, width = chunk.input_ids.shape
        assert count * width <= budget or count == 1
    if budget >= 20 * len(lengths):
        assert len(chunks) == 1


@pytest.mark.parametrize("budget", [1, 10, 24, 40, 1000])
def test_packed_micro_batches_hold_every_sequence_end_to_end_within_the_budget(budget):
    from example_trainer.data import Sequence, micro_batches, trained_tokens

    lengths = [9, 3, 12, 3, 7, 20, 5, 5, 8]
    sequences = [
        Sequence(
            [100 * k + t for t in range(n)],
            [-100, -100] + [1] * (n - 2),
            0.0,
            [float(k)] * n,
            [-float(k)] * n if k % 2 else None,  # some rows come without logprobs
            None,
        )
        for k, n in enumerate(lengths)
    ]
    chunks = micro_batches(sequences, 1, 0, token_budget=budget, pack=True)
    seen = []
    for chunk in chunks:
        assert chunk.input_ids.shape[0] == 1 and chunk.attention_mask is None
        width = chunk.input_ids.shape[1]
        assert width <= budget or len(chunk.position_ids[0].eq(0).nonzero()) == 1
        starts = chunk.position_ids[0].eq(0).nonzero().flatten().tolist()
        for start, end in zip(starts, [*starts[1:], width], strict=True):
            tokens = chunk.input_ids[0, start:end].tolist()
            k = tokens[0] // 100
            seen.append(k)
            assert tokens == sequences[k].tokens
            assert chunk.position_ids[0, start:end].tolist() == list(range(end - start))
            # label positions start..end-2 predict this sequence's tokens 1..n-1
            labels = slice(start, end - 1)
            assert chunk.loss_mask[0, labels].sum() == trained_tokens(sequences[k])
            assert (chunk.advantages[0, labels] == k).all()
            old = chunk.old_logprobs
            if k % 2:
                assert old is not None and (old[0, labels] == -k).all()
            elif old is not None:
                assert old[0, labels].isnan().all()
            if end < width:  # the position predicting the next sequence's first token
                assert not chunk.loss_mask[0, end - 1]
    assert sorted(seen) == list(range(len(lengths)))
    assert sum(int(c.loss_mask.sum()) for c in chunks) == sum(map(trained_tokens, sequences))


def test_a_model_that_attends_across_packed_sequences_is_not_packed():
    from example_trainer.logprobs import keeps_packed_sequences_apart

    class RunningSum(nn.Module):
        """Each position sees every token before it, position ids or not."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(64, 8)
            self.head = nn.Linear(8, 64)

        def get_input_embeddings(self) -> nn.Embedding:
            return self.embed

        def forward(self, input_ids: torch.Tensor, **_: object):
            return SimpleNamespace(logits=self.head(self.embed(input_ids).cumsum(dim=1)))

    model = RunningSum().train()
    assert not keeps_packed_sequences_apart(model)
    assert model.training, "the probe left the model in eval mode"


@pytest.mark.parametrize("padding_free", ["on", "off", "auto"])
def test_micro_batches_cut_by_tokens_give_the_gradients_of_one(
    padding_free, tiny_model_path, tmp_path
):
    from example_trainer.data import split_trainable
    from tests.support.trainer_batches import PROMPT, make_trainer, rollout_group

    long = PROMPT + [9, 10, 11, 12, 13, 2]
    batch = [
        rollout_group(),
        rollout_group(
            tokens=[long, long[:-2] + [2]],
            masks=[[-100] * 3 + long[3:], [-100] * 3 + long[3:-2] + [2]],
            inference_logprobs=[[1.0] * 3 + [-0.5] * 6, [1.0] * 3 + [-0.7] * 5],
            scores=[0.0, 1.0],
        ),
    ]
    grads = {}
    for budget in (None, 12):
        trainer = make_trainer(
            tiny_model_path,
            tmp_path / str(budget),
            micro_batch_tokens=budget,
            padding_free=padding_free,
        )
        # auto packs under a varlen kernel only; the tiny model runs sdpa here
        assert trainer.forward.packs == (padding_free == "on" and budget is not None)
        groups, skipped = split_trainable(batch, trainer.vocab_size)
        assert not skipped
        trainer.accumulate_gradients(trainer.sequences(groups))
        grads[budget] = [p.grad.clone() for p in trainer.model.parameters()]
    assert any(g.abs().max() > 0 for g in grads[None])
    for got, want in zip(grads[12], grads[None], strict=True):
        assert_close_to_scale(got, want, GRADIENT_REL_TO_SCALE)


def test_both_ways_of_cutting_micro_batches_at_once_are_refused():
    from pydantic import ValidationError

    from example_trainer.config import TrainingConfig

    with pytest.raises(ValidationError, match="give one"):
        TrainingConfig(model_name="m", micro_batch_tokens=512, gradient_accumulation_steps=4)


def test_fsdp_cpu_offload_trains_as_without_it(tiny_model_path, tmp_path):
    """--fsdp-cpu-offload moves where the shards and AdamW state live, not what a step
    computes: the same batch gives the same loss, gradient norm and updated weights.
    (On this CPU the shards stay in host memory either way; nothing is pinned.)"""
    from example_trainer.data import split_trainable
    from tests.support.trainer_batches import make_trainer, rollout_group

    batch = [rollout_group(), rollout_group(scores=[0.0, 1.0])]
    results = {}
    for offload in (False, True):
        trainer = make_trainer(
            tiny_model_path, tmp_path / str(offload), parallelism="fsdp", fsdp_cpu_offload=offload
        )
        try:
            groups, _ = split_trainable(batch, trainer.vocab_size)
            before = [p.full_tensor().detach().clone() for p in trainer.model.parameters()]
            metrics = trainer.train_step(groups)
            after = [p.full_tensor().detach() for p in trainer.model.parameters()]
        finally:
            trainer.parallel.close()
        results[offload] = (metrics, [a - b for a, b in zip(after, before, strict=True)])
    (plain, plain_updates), (offloaded, offloaded_updates) = results[False], results[True]
    assert plain["grad_norm"] > 0 and any(u.abs().max() > 0 for u in plain_updates)
    for key in ("loss", "grad_norm"):
        assert offloaded[key] == pytest.approx(plain[key], rel=GRADIENT_REL_TO_SCALE), key
    for got, want in zip(offloaded_updates, plain_updates, strict=True):
        assert_close_to_scale(got, want, GRADIENT_REL_TO_SCALE)
