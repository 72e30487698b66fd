"""--shared-prompt-forward: each prompt runs once, and the loss and gradients stay the same.

Two groups with prompts of different lengths and completions of different lengths (so
both the left-padded prompts and the right-padded completions are exercised), through
the tiny model: the token logprobs on every trained position and the gradient of a
loss over them must equal those of the plain padded forward, to float32 rounding.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from example_trainer.data import Sequence, micro_batches  # noqa: E402
from example_trainer.logprobs import PolicyLogprobs  # noqa: E402
from example_trainer.shared_prefix import shared_prompts  # noqa: E402
from tests.support.tolerances import (  # noqa: E402
    GRADIENT_REL_TO_SCALE,
    SAME_LIBRARY_LOGPROB_REL,
    assert_close_to_scale,
)

pytestmark = pytest.mark.integration  # the tiny model


def sequence(prompt: list[int], completion: list[int], advantage: float, group: int) -> Sequence:
    tokens = prompt + completion
    masks = [-100] * len(prompt) + completion
    advantages = [advantage] * len(tokens)
    return Sequence(tokens, masks, advantage, advantages, None, None, group)


def two_groups() -> list[Sequence]:
    short, long = [1, 30, 31, 32, 2], [1, 40, 41, 42, 43, 44, 45, 2]
    completions = [[22, 2], [23, 24, 2], [25, 2], [26, 27, 28, 2]]
    return [
        sequence(prompt, completion, advantage, group)
        for group, prompt in enumerate((short, long))
        for completion, advantage in zip(completions, (1.0, -0.5, 0.25, -0.75), strict=True)
    ]


def test_rows_are_cut_at_their_first_trained_label():
    rows = two_groups()
    layout = shared_prompts([s.tokens for s in rows], [s.masks for s in rows], pad_id=0)
    assert layout is not None
    assert layout.prompt_ids.shape == (2, 8) and layout.prompt_of_row.tolist() == [0] * 4 + [1] * 4
    assert layout.prompt_ids[0].tolist() == [0, 0, 0, 1, 30, 31, 32, 2]  # left-padded
    assert layout.prompt_length.tolist() == [5] * 4 + [8] * 4
    assert layout.completion_ids[3].tolist() == [26, 27, 28, 2]
    assert layout.completion_ids[0].tolist() == [22, 2, 0, 0]  # right-padded
    distinct = [sequence([1, 50 + i], [22, 2], 1.0, i) for i in range(3)]
    assert shared_prompts([s.tokens for s in distinct], [s.masks for s in distinct], 0) is None
    untrained = [sequence([1, 30], [], 1.0, 0), sequence([1, 30], [22, 2], 1.0, 0)]
    assert shared_prompts([s.tokens for s in untrained], [s.masks for s in untrained], 0) is None


def logprobs_and_gradients(model, share: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    (chunk,) = micro_batches(two_groups(), 1, pad_id=0, share_prompts=share)
    assert (chunk.shared is not None) == share
    policy = PolicyLogprobs(model)
    extra = (chunk.shared,) if share else ()
    logprobs = policy(chunk.input_ids, chunk.attention_mask, None, *extra)
    trained = logprobs[chunk.loss_mask]
    (trained * chunk.advantages[chunk.loss_mask]).sum().backward()
    return trained.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_loss_and_its_gradients_are_the_plain_forwards(tiny_model_path):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path)
    model.train()
    plain, plain_grads = logprobs_and_gradients(model, share=False)
    shared, shared_grads = logprobs_and_gradients(model, share=True)
    assert plain.shape == shared.shape == (2 * (2 + 3 + 2 + 4),)
    assert_close_to_scale(shared, plain, SAME_LIBRARY_LOGPROB_REL * 10, "token logprobs")
    for name, grad in plain_grads.items():
        assert_close_to_scale(shared_grads[name], grad, GRADIENT_REL_TO_SCALE, name)
