"""The token limit: one notion under the names each side of the Atropos contract gave it.

A sequence (prompt and completion tokens together) is bounded by one number:

- `max_token_len`: what the trainer registers (`/register`, `/info`) and every
  environment reads back;
- `max_token_length`: `BaseEnvConfig` and `/register-env` (the API keeps it per
  environment as `max_context_len`, for weighting);
- `seq_len`: the trainer's flag (`LaunchSettings.seq_len` in the trainer contract);
- `max_model_len`: the inference engine's context length.

`atropos-launch` makes them agree before a run starts (`launch/plan.py`): every
environment gets the trainer's `seq_len` as `max_token_length` (a smaller one is
allowed, a larger one is an error naming it), and an engine's `max_model_len` may
not be smaller.

The names stay, because environments and trainers written for Atropos use them.
The rule lives here, once: a sequence fits when it holds at most the limit, and
a limit of 0 or less means none. So the environment drops a group only when a
sequence is over the limit, the API refuses exactly those (422), and the
trainer's batches hold a sequence of the limit whole. (Upstream's environment
also dropped a sequence of exactly the limit, which its API would have taken.)
"""

from __future__ import annotations


def exceeds_token_limit(length: int, limit: int) -> bool:
    return limit > 0 and length > limit
