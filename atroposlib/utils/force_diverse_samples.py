"""Diverse samples by forcing different first tokens.

Sampling n completions of one prompt often gives n near-copies, which carry no
learning signal for group-relative training. Here the first token's distribution
is read once (top 20 logprobs, greedy), n distinct first tokens are drawn from it
at the requested temperature without replacement, and each completion is then
generated from its own forced first token.

Like Atropos' version this is a function taking the environment as ``self``: it
calls ``self.server.chat_completion`` and, when the server returns no logprobs,
``self.fallback_generate(messages, prefill, n, max_tokens, temperature)``. Unlike
it, the completions are returned (Atropos' version documents a list but returns
None).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from typing import Any

__all__ = ["generate_with_diverse_first_tokens"]

logger = logging.getLogger(__name__)

TOP_LOGPROBS = 20
CONTINUATION_TOP_P = 0.3
CONTINUATION_EXTRA_BODY = {"min_p": 0.5, "repetition_penalty": 1.05}


def _draw_distinct(logprobs: list[float], k: int, temperature: float) -> list[int]:
    """Up to k distinct indices, drawn one by one in proportion to exp(logprob / temperature).

    A temperature of 0 or less takes the k most likely, in order.
    """
    k = min(k, len(logprobs))
    if temperature <= 0:
        return sorted(range(len(logprobs)), key=lambda i: -logprobs[i])[:k]
    top = max(logprobs)
    weights = [math.exp((lp - top) / temperature) for lp in logprobs]  # shifted: no overflow
    remaining = list(range(len(logprobs)))
    chosen: list[int] = []
    while len(chosen) < k:
        left = [weights[i] for i in remaining]
        if sum(left) > 0:
            pick = random.choices(remaining, weights=left, k=1)[0]
        else:
            pick = random.choice(remaining)
        chosen.append(pick)
        remaining.remove(pick)
    return chosen


async def generate_with_diverse_first_tokens(
    self: Any,
    messages: list[dict[str, Any]],
    prefill: str = "",
    n: int = 8,
    max_tokens: int = 4096,
    temperature: float = 1.0,
) -> list[str]:
    """Up to ``n`` completions of ``messages`` after ``prefill``, each with its own first token.

    ``self`` is the environment: it needs ``server`` (with ``chat_completion``) and, for
    servers that return no logprobs, ``fallback_generate``. Each returned string is the
    forced first token followed by the rest of its completion (the prefill not included);
    fewer than ``n`` come back when the server offers fewer candidate first tokens.
    """
    probe = await self.server.chat_completion(
        messages=[*messages, {"role": "assistant", "content": prefill}],
        n=1,
        max_tokens=1,
        temperature=0.0,
        logprobs=True,
        top_logprobs=TOP_LOGPROBS,
    )
    try:
        candidates = [
            (item.token, item.logprob) for item in probe.choices[0].logprobs.content[0].top_logprobs
        ]
        if not candidates:
            raise IndexError("no top_logprobs for the first token")
    except (AttributeError, IndexError, KeyError, TypeError) as error:
        fallback = getattr(self, "fallback_generate", None)
        if fallback is None:
            raise RuntimeError(
                "the server returned no first-token logprobs and "
                f"{type(self).__name__} has no fallback_generate"
            ) from error
        logger.warning("No first-token logprobs (%s); using fallback_generate", error)
        return await fallback(messages, prefill, n, max_tokens, temperature)

    picked = _draw_distinct([lp for _, lp in candidates], n, temperature)
    first_tokens = [candidates[i][0] for i in picked]

    async def continue_from(token: str) -> str:
        completion = await self.server.chat_completion(
            messages=[*messages, {"role": "assistant", "content": prefill + token}],
            n=1,
            max_tokens=max_tokens - 1,  # the forced token counts against the budget
            temperature=temperature,
            top_p=CONTINUATION_TOP_P,
            extra_body=dict(CONTINUATION_EXTRA_BODY),
        )
        return token + (completion.choices[0].message.content or "")

    return list(await asyncio.gather(*(continue_from(token) for token in first_tokens)))
