"""Which run a durable state belongs to, and when a registering trainer may resume it.

Design: upstream's API keeps nothing across restarts, so a second run never meets
the first one's queue. Ours is durable, so the rule is explicit: a state belongs to
the run that first registered, named by (wandb_group, wandb_project,
checkpoint_dir), and only that run resumes it: from a checkpoint (starting_step > 0),
or from step 0 while every batch it was served is still kept, so that none is skipped.
The second case is a trainer that crashed before its first checkpoint: it starts over
on the same batches, and nothing is lost or trained twice.
"""

from __future__ import annotations

from collections.abc import Collection

from atroposlib.protocol import Registration

USAGE = (
    "start run-api with an empty --state-dir for a new run, or POST /reset_data to wipe this one"
)


def run_name(registration: Registration) -> str:
    r = registration
    return f"{r.wandb_group}/{r.wandb_project} (checkpoints in {r.checkpoint_dir})"


def run_refusal(
    stored: Registration, new: Registration, step: int, kept_steps: Collection[int] = ()
) -> str | None:
    """Why `new` may not resume the state of `stored` (now at `step`), or None.

    `kept_steps`: the steps whose batches are still kept for serving again (no
    checkpoint has released them).
    """
    if run_name(stored) != run_name(new):
        return (
            f"this API's state belongs to run {run_name(stored)} at step {step}; "
            f"trainer of run {run_name(new)} refused: {USAGE}"
        )
    if new.starting_step == 0 and step > 0:
        if all(served in kept_steps for served in range(1, step + 1)):
            return None  # no checkpoint yet: start over on the kept batches
        return (
            f"run {run_name(stored)} is at step {step} here, and this trainer starts from "
            f"step 0: resume it from a checkpoint (its step is sent as starting_step), or {USAGE}"
        )
    return None
