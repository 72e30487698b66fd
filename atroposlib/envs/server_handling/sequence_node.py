"""`SequenceNode`: one tracked sequence, as a pydantic model like upstream's.

A model rather than a dataclass so environments can `model_dump()` / `model_copy()`
a node (upstream's proxy ships nodes as JSON) while reading fields as attributes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class SequenceNode(BaseModel):
    """Prompt + completion: `tokens`, `masked_tokens` (-100 on prompt positions) and
    `logprobs` (1.0 on prompt positions) are aligned one entry per token."""

    full_text: str
    tokens: list[int]
    masked_tokens: list[int]
    logprobs: list[float]
    metadata: dict[str, Any] | None = None
