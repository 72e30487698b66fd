"""`--shared-prompt-forward`: a group's prompt through the policy once, not once per sample.

GRPO trains every group as `group_size` sequences that begin with the same prompt, and
the prompt is most of each sequence when completions are short (26 of 28 tokens in
the CPU quickstart). A padded micro-batch runs that prompt `group_size` times, forward
and backward. Here each distinct untrained prompt of a micro-batch is run once, with
the KV cache kept; the cache is copied to the rows that share the prompt
(`Cache.reorder_cache`, an index_select, which autograd follows) and the completions
run on top of it. The backward sums each row's gradient into the one prompt
computation, which is the sum the padded batch computes row by row: the same loss
and gradients, up to float32 rounding, for a fraction of the work (the quickstart's
1,792 token positions per step become 8 x 26 + 64 x 2 = 336).

The output has the padded micro-batch's layout, [B, T-1] token logprobs, so the loss
is unchanged. Prompt positions, which nothing trains, hold 0 (the loss masks them).
The layout is built only where it saves work (fewer prompts than rows) and where the
rows can be cut cleanly: each row's prompt is everything before its first trained
label. Otherwise, and for a packed, chunked, entropy-bearing or
activation-checkpointed forward (a KV cache under checkpointing is not kept), the
micro-batch runs whole as before.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import torch

from example_trainer.loss import token_logprobs


@dataclass
class SharedPrompts:
    """How a padded micro-batch's rows split into shared prompts and own completions."""

    prompt_ids: torch.Tensor  # [P, L] distinct prompts, left-padded
    prompt_mask: torch.Tensor  # [P, L]
    prompt_of_row: torch.Tensor  # [B] long: each row's prompt
    prompt_length: torch.Tensor  # [B] long: each row's prompt length (its first label)
    completion_ids: torch.Tensor  # [B, S] each row's tokens after its prompt, right-padded
    completion_mask: torch.Tensor  # [B, S]

    def to(self, device: torch.device) -> SharedPrompts:
        return SharedPrompts(
            *(getattr(self, name).to(device) for name in self.__dataclass_fields__)
        )


def shared_prompts(
    tokens: Seq[Seq[int]], masks: Seq[Seq[int]], pad_id: int
) -> SharedPrompts | None:
    """The layout of rows `tokens` (with their label `masks`, -100 untrained), or None when
    sharing saves nothing or a row has no prompt or no trained label."""
    starts = []
    for row, mask in zip(tokens, masks, strict=True):
        first = next((t for t, m in enumerate(mask) if m != -100), None)
        if first is None or first < 1 or first >= len(row):
            return None
        starts.append(first)
    prompts: dict[tuple[int, ...], int] = {}
    owner = [
        prompts.setdefault(tuple(row[:t]), len(prompts))
        for row, t in zip(tokens, starts, strict=True)
    ]
    if len(prompts) == len(tokens):
        return None
    longest = max(len(p) for p in prompts)
    prompt_ids = torch.tensor([[pad_id] * (longest - len(p)) + list(p) for p in prompts])
    prompt_mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    tails = [list(row[t:]) for row, t in zip(tokens, starts, strict=True)]
    widest = max(len(tail) for tail in tails)
    return SharedPrompts(
        prompt_ids,
        prompt_mask,
        torch.tensor(owner),
        torch.tensor(starts),
        torch.tensor([tail + [pad_id] * (widest - len(tail)) for tail in tails]),
        torch.tensor([[1] * len(tail) + [0] * (widest - len(tail)) for tail in tails]),
    )


def shared_prompt_logprobs(model: Any, layout: SharedPrompts, width: int) -> torch.Tensor:
    """[B, width - 1] token logprobs of the padded rows `layout` describes (prompt
    positions 0): what `token_logprobs(model(rows).logits, rows)` gives on the trained
    positions, with each prompt run once (see the module docstring)."""
    positions = (layout.prompt_mask.cumsum(-1) - 1).clamp(min=0)
    prompt = model(
        input_ids=layout.prompt_ids,
        attention_mask=layout.prompt_mask,
        position_ids=positions,
        use_cache=True,
    )
    cache = prompt.past_key_values
    cache.reorder_cache(layout.prompt_of_row)  # each row gets its prompt's keys and values
    owner = layout.prompt_of_row
    completion_positions = (
        layout.prompt_mask.sum(-1)[owner][:, None]
        + torch.arange(layout.completion_ids.shape[1], device=owner.device)[None]
    )
    completion = model(
        input_ids=layout.completion_ids,
        attention_mask=torch.cat([layout.prompt_mask[owner], layout.completion_mask], dim=1),
        position_ids=completion_positions,
        past_key_values=cache,
        use_cache=True,
    )
    # the prompt's last position predicts the first completion token
    first = torch.log_softmax(prompt.logits[:, -1].float(), dim=-1)[owner]
    first = first.gather(1, layout.completion_ids[:, :1]).squeeze(1)
    rest = token_logprobs(completion.logits, layout.completion_ids)  # [B, S - 1]
    along = torch.cat([first[:, None], rest], dim=1)  # labels prompt_length .. + S - 1
    rows, span = along.shape
    target = layout.prompt_length[:, None] - 1 + torch.arange(span, device=along.device)[None]
    placed = along.new_zeros(rows, width - 1 + span).scatter(1, target, along)
    return placed[:, : width - 1].clone()
