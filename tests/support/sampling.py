"""The distribution an engine draws a token from, rebuilt from the model's logits."""

from __future__ import annotations

import torch


def drawn_from(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probabilities each token was sampled from (the engine's documented rule)."""
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1:
        ordered, order = probs.sort(-1, descending=True)
        keep = ordered.cumsum(-1) - ordered < top_p
        probs = torch.zeros_like(probs).scatter(-1, order, ordered * keep)
    return torch.log(probs / probs.sum(-1, keepdim=True))
