"""Source-side staleness admission: how many batches of work an env may have under way.

The trainer's `--max-staleness K` drops every sequence whose lag (the trainer's version
at the step that trains it minus the version of the weights that sampled it) exceeds K.
That drop is the hard bound; this module only keeps environments from producing work
that would arrive too stale to be trained, so rollouts are not wasted.
"""

from __future__ import annotations


def offpolicy_window(
    max_batches_offpolicy: int,
    max_staleness: int | None,
    current_step: int,
    newest_weight_version: int | None,
) -> int:
    """Batches of work (queued, spooled or in flight) an env may have in the system.

    Without a bound (`max_staleness` None) it is `max_batches_offpolicy`, as upstream.
    With `max_staleness = K` it is `min(max_batches_offpolicy, K + 1 - engine_lag)`,
    floored at 0, where `engine_lag = max(0, current_step - newest_weight_version)`
    (0 while no version was seen yet): how far behind the trainer the newest weights
    this env's engine was seen sampling with are.

    Derivation: a rollout admitted now samples with engine version v_e and is trained
    after the Q whole batches queued ahead of it, at the step whose trainer version is
    current_step + Q, so its lag is Q + (current_step - v_e). Requiring lag <= K allows
    at most K - engine_lag batches ahead of it, i.e. K + 1 - engine_lag batches in the
    system including its own. This is AReaL's `max_head_offpolicyness` admission rule
    expressed in batches. The estimate is conservative: the engine may have newer
    weights than the last group sent shows, and the trainer's drop decides anyway.
    """
    if max_staleness is None:
        return max_batches_offpolicy
    engine_lag = 0
    if newest_weight_version is not None:
        engine_lag = max(0, current_step - newest_weight_version)
    return max(0, min(max_batches_offpolicy, max_staleness + 1 - engine_lag))
