"""Token logprobs without the whole micro-batch's float32 logits.

`token_logprobs` (loss.py) takes the model's logits: for 8 x 1,024 tokens and a
152k vocabulary that is 2.5 GB of bf16 logits, then 5 GB of float32 log-softmax, then
its gather. The loss needs one number per token: log p(label) = logit[label] -
logsumexp(logits). `chunked_token_logprobs` computes it from the last hidden state,
`chunk_tokens` positions at a time, each chunk under activation checkpointing: the
backward pass recomputes that chunk's logits instead of keeping them, so the peak holds
one chunk's float32 logits (and their gradient), not the micro-batch's.

The arithmetic is the same as log_softmax + gather (float32 logits of the same head,
the same logsumexp), so values and gradients agree to float32 rounding of sums over the
vocabulary (tests/example_trainer/test_memory_levers.py states the bound).

`PolicyLogprobs` wraps the policy so that DDP (and FSDP) see one forward that returns
token logprobs, with either path inside. Models whose logits are more than the head's
matmul (Gemma's soft-capping, Cohere's logit scale) keep the full path.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from example_trainer.loss import token_logprobs
from example_trainer.shared_prefix import SharedPrompts, shared_prompt_logprobs
from example_trainer.vision import multimodal_backbone

logger = logging.getLogger("example_trainer")


def _label_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor
) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias).float()
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _label_logprobs_and_more(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    extra_ids: torch.Tensor | None,
    with_entropy: bool,
) -> tuple[torch.Tensor, ...]:
    """(label logprobs, entropy, logprobs of `extra_ids`): the last two empty when not asked."""
    return head_outputs(F.linear(hidden, weight, bias), labels, extra_ids, with_entropy)


def head_outputs(
    logits: torch.Tensor, labels: torch.Tensor, extra_ids: torch.Tensor | None, with_entropy: bool
) -> tuple[torch.Tensor, ...]:
    """From logits aligned with `labels` ([..., V] and [...]): each label's logprob, the
    entropy (or an empty tensor) and the logprobs of `extra_ids` ([..., K]; or empty)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    picked = logprobs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    nothing = picked.new_empty(0)
    entropy = -(logprobs.exp() * logprobs).sum(-1) if with_entropy else nothing
    extra = logprobs.gather(-1, extra_ids) if extra_ids is not None else nothing
    return picked, entropy, extra


def chunked_token_logprobs(
    hidden: torch.Tensor,
    head: nn.Linear,
    input_ids: torch.Tensor,
    chunk_tokens: int,
    with_entropy: bool = False,
    extra_ids: torch.Tensor | None = None,
) -> Any:
    """log p(input_ids[:, t] | input_ids[:, :t]) for t >= 1, shape [B, T-1], as
    `token_logprobs(head(hidden), input_ids)` gives it, `chunk_tokens` positions at a time.
    With `with_entropy` or `extra_ids` ([B, T-1, K] ids per label position): the
    `head_outputs` triple instead, each shaped like its input."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    batch, length, width = hidden.shape
    flat = hidden[:, :-1].reshape(-1, width)
    labels = input_ids[:, 1:].reshape(-1)
    extra = None if extra_ids is None else extra_ids.reshape(labels.shape[0], -1)
    more = with_entropy or extra is not None
    pieces = []
    for start in range(0, flat.shape[0], chunk_tokens):
        end = start + chunk_tokens
        parts: tuple[Any, ...] = (flat[start:end], head.weight, head.bias, labels[start:end])
        compute: Any = _label_logprobs
        if more:
            compute = _label_logprobs_and_more
            parts = (*parts, None if extra is None else extra[start:end], with_entropy)
        if torch.is_grad_enabled() and (flat.requires_grad or head.weight.requires_grad):
            pieces.append(checkpoint(compute, *parts, use_reentrant=False))
        else:
            pieces.append(compute(*parts))
    if not more:
        return torch.cat(pieces).view(batch, length - 1)
    logprobs = torch.cat([piece[0] for piece in pieces]).view(batch, length - 1)
    entropy = torch.cat([piece[1] for piece in pieces])
    chosen = torch.cat([piece[2] for piece in pieces])
    return (
        logprobs,
        entropy.view(batch, length - 1) if with_entropy else entropy,
        chosen.view(batch, length - 1, -1) if extra is not None else chosen,
    )


def head_is_plain_linear(model: Any) -> bool:
    """The logits are exactly the output embedding's matmul (no soft-capping or scale)."""
    config = getattr(model, "config", None)
    extra = (getattr(config, name, None) for name in ("final_logit_softcapping", "logit_scale"))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return isinstance(head, nn.Linear) and all(v in (None, 1.0) for v in extra)


class PolicyLogprobs(nn.Module):
    """The policy whose forward answers token logprobs (see the module docstring)."""

    def __init__(self, model: Any, chunk_tokens: int = 0, with_entropy: bool = False) -> None:
        """`model`: a transformers causal LM (or a peft model around one); `with_entropy`:
        forward answers (logprobs, entropy), for an entropy bonus."""
        super().__init__()
        self.model: Any = model
        self.chunk_tokens = chunk_tokens
        self.with_entropy = with_entropy
        if chunk_tokens and not head_is_plain_linear(model):
            logger.warning(
                "--logprob-chunk-tokens %d: this model's logits are more than its output "
                "layer's matmul; computing them whole",
                chunk_tokens,
            )
            self.chunk_tokens = 0

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None = None,
        shared: SharedPrompts | None = None,
        extra_ids: torch.Tensor | None = None,
        pixels: dict[str, torch.Tensor] | None = None,
    ) -> Any:
        """[B, T-1] token logprobs; with `with_entropy` or `extra_ids` ([B, T-1, K] ids
        per label position: a teacher's top-k), a dict of `logprobs`, `entropy` and
        `extra` (the logprobs of `extra_ids`), each present when asked. Tensors of their
        own, not views (FSDP2 hooks its backward onto the output, and warns that an
        in-place change to a view skips it).
        Packed rows come with `position_ids` and no mask (`data.py`). No KV cache: a
        training forward never reads one back, and a cache would hide the packing.
        `pixels`: a vision-language policy's picture inputs for the rows (`vision.py`)."""
        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "use_cache": False,
            **(pixels or {}),
        }
        more = self.with_entropy or extra_ids is not None
        if shared is not None and not self.chunk_tokens and not more and not pixels:
            return shared_prompt_logprobs(self.model, shared, input_ids.shape[1])
        if not self.chunk_tokens:
            logits = self.model(**inputs).logits
            if not more:
                return token_logprobs(logits, input_ids).clone()
            parts = head_outputs(logits[:, :-1], input_ids[:, 1:], extra_ids, self.with_entropy)
        else:
            trunk = multimodal_backbone(self.model) if pixels else self.model.get_decoder()
            hidden = trunk(**inputs).last_hidden_state
            head = self.model.get_output_embeddings()
            if not more:
                return chunked_token_logprobs(hidden, head, input_ids, self.chunk_tokens).clone()
            parts = chunked_token_logprobs(
                hidden, head, input_ids, self.chunk_tokens, self.with_entropy, extra_ids
            )
        answer = {"logprobs": parts[0].clone()}
        if self.with_entropy:
            answer["entropy"] = parts[1].clone()
        if extra_ids is not None:
            answer["extra"] = parts[2].clone()
        return answer


@torch.no_grad()
def keeps_packed_sequences_apart(model: Any) -> bool:
    """Whether `model` reads restarting position ids without a mask as separate
    sequences (transformers' own architectures do, from 4.5x): one sequence alone and
    the same sequence packed after another must give the same logits. A model that lets
    them attend to each other gives other logits, and trains on padded rows instead."""
    vocab = model.get_input_embeddings().num_embeddings
    device = model.get_input_embeddings().weight.device
    first = torch.arange(3, 3 + 11, device=device) % vocab
    second = torch.arange(17, 17 + 7, device=device) % vocab
    positions = torch.cat([torch.arange(11), torch.arange(7)]).to(device)[None]
    was_training = model.training
    model.eval()  # dropout off: the two forwards must be comparable
    try:
        alone = model(input_ids=second[None], use_cache=False).logits[0].float()
        packed = (
            model(
                input_ids=torch.cat([first, second])[None], position_ids=positions, use_cache=False
            )
            .logits[0, 11:]
            .float()
        )
    finally:
        model.train(was_training)
    # the same sums in the same kernels: rounding alone (bf16's, at most) separates them,
    # while attending to 11 other tokens moves logits by their own order of magnitude
    scale = float(alone.abs().max()) or 1.0
    return bool((alone - packed).abs().max() <= 0.05 * scale)


def packs_micro_batches(model: Any, micro_batch_tokens: int | None, padding_free: str) -> bool:
    """Whether micro-batches are packed rows (`--micro-batch-tokens`, `--padding-free`)."""
    if micro_batch_tokens is None or padding_free == "off":
        return False
    kernel = str(getattr(model.config, "_attn_implementation", None))
    if padding_free == "auto" and not kernel.startswith("flash_attention"):
        return False  # a dense kernel: packing trades padding for cross-sequence attention
    if keeps_packed_sequences_apart(model):
        return True
    logger.warning(
        "--micro-batch-tokens: %s attends across packed sequences given position ids "
        "alone; padding each micro-batch's rows instead",
        type(model).__name__,
    )
    return False
