"""Serving batches: planning one from the queue, leasing it to a step, serving it again.

`RunState` inherits this; the state it reads is declared here and set up there. The
rules: `/batch` assembles one batch per call and each served batch advances the step
(Atropos assembled every ready batch at once, moving the step ahead of the trainer and
hiding those groups from the queue size environments throttle on). A trainer that
names the step it wants leases that step's batch: the same batch comes back if it asks
again, until a checkpoint at or after that step releases it.
"""

from __future__ import annotations

import logging
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from atroposlib.api.env_table import EnvTable
from atroposlib.api.packing import plan_batch
from atroposlib.api.refusals import StepConflict
from atroposlib.api.store import GroupRow, GroupStore
from atroposlib.protocol import Registration

logger = logging.getLogger("atroposlib.api")


class BatchServing:
    """The batch half of `RunState` (see the module docstring)."""

    store: GroupStore
    registration: Registration | None
    started: bool
    step: int
    version: int
    envs: EnvTable
    queue: list[GroupRow]
    queued_sequences: int
    size_counts: Counter[int]
    env_sizes: dict[int | None, Counter[int]]
    leases: dict[int, list[GroupRow]]
    by_step: bool
    blocked_reason: str | None
    counters: Counter[str]
    _no_batch_key: tuple | None

    def _writing(self) -> AbstractContextManager[None]:
        raise NotImplementedError  # RunState's: a store failure becomes a 503

    def _persist(self, **kv: Any) -> None:
        raise NotImplementedError

    def min_allocations(self) -> dict[int, float]:
        return self.envs.min_allocations()

    def _release(self, upto: int) -> None:
        """Forget the kept batches of steps <= `upto`: a trainer checkpoint holds them."""
        for step in sorted(s for s in self.leases if s <= upto):
            with self._writing():
                self.store.remove([row.id for row in self.leases[step]], {})
            del self.leases[step]

    def min_sequences_by_env(self) -> dict[int, int]:
        batch_size = self.registration.batch_size if self.registration else 0
        return {env: int(batch_size * share) for env, share in self.min_allocations().items()}

    def _plan(self) -> list[int] | None:
        assert self.registration is not None  # both callers return early without one
        batch_size = self.registration.batch_size
        if self.queued_sequences < batch_size:
            self.blocked_reason = None
            return None
        allocations = self.min_allocations()
        key = (self.version, tuple(sorted(allocations.items())))
        if self._no_batch_key == key:
            return None
        positions = plan_batch(
            [r.size for r in self.queue], [r.env_id for r in self.queue], batch_size, allocations
        )
        if positions is None:
            self._no_batch_key = key
            reason = (
                f"{self.queued_sequences} sequences queued in groups of sizes "
                f"{dict(sorted(self.size_counts.items()))}, but no set of whole groups "
                f"sums to batch_size {batch_size}"
            )
            if allocations:
                reason = (
                    f"the minimum shares {allocations} (env id: min_batch_allocation) "
                    f"cannot be met from the queue: {reason}"
                )
            if reason != self.blocked_reason:
                logger.warning("no batch can be formed: %s", reason)
            self.blocked_reason = reason
        else:
            self.blocked_reason = None
        return positions

    def next_batch(
        self, step: int | None = None, committed: int | None = None
    ) -> bytes | dict[str, Any]:
        """The next batch (upstream: a destructive read), or with `step` a leased one.

        A trainer that names the `step` it wants gets that step's batch, and the same
        batch again if it asks again (a lost or timed-out answer, or a resume); its
        groups are kept until the trainer reports a checkpoint at or after that step
        (`committed`). Without `step` the batch is deleted as it is served, as upstream.
        """
        if self.registration is None:
            return {
                "status": "error",
                "message": "no trainer has registered; POST /register first",
                "batch": [],
            }
        if not self.started:
            self._persist(started=True)
            self.started = True
        if committed is not None:
            self._release(committed)
        if step is None and self.by_step:
            raise StepConflict(
                "this run's trainer takes its batches by step (/batch?step=N): a plain /batch "
                "would take one from under it; nothing was served"
            )
        if step is not None:
            self.by_step = True
            if step in self.leases:
                return self._serve_again(step)
            if step != self.step + 1:
                raise StepConflict(
                    f"the API is at step {self.step} and has no kept batch for step {step}; "
                    f"ask for step {self.step + 1}, or register again with the step you "
                    "resumed from"
                )
        positions = self._plan()
        if positions is None:
            return {"batch": None}
        rows = [self.queue[p] for p in positions]
        ids = [r.id for r in rows]
        payload = b'{"batch":[' + b",".join(self.store.bodies(ids)) + b"]}"
        with self._writing():  # a failure leaves the queue and step as they were
            if step is None:
                self.store.remove(ids, {"step": self.step + 1})
            else:
                self.store.lease(ids, step, {"step": step})
        if step is not None:
            self.leases[step] = [replace(r, served_step=step) for r in rows]
        chosen = set(positions)
        self.queue = [r for i, r in enumerate(self.queue) if i not in chosen]
        for row in rows:
            self.queued_sequences -= row.size
            self.size_counts[row.size] -= 1
            self.env_sizes[row.env_id][row.size] -= 1
        self.size_counts += Counter()  # drop zero counts
        self.step += 1
        self.version += 1
        self.counters["batches_served"] += 1
        self.counters["sequences_served"] += sum(r.size for r in rows)
        return payload

    def _serve_again(self, step: int) -> bytes:
        rows = self.leases[step]
        if step != self.step:
            self._persist(step=step)
            self.step = step
            self.version += 1
        logger.info("serving the batch of step %d again (%d groups)", step, len(rows))
        self.counters["batches_served_again"] += 1
        return b'{"batch":[' + b",".join(self.store.bodies([r.id for r in rows])) + b"]}"

    def _plan_if_stale(self) -> None:
        """Refresh `blocked_reason` without serving anything."""
        if self.registration is not None:
            if self._plan() is not None:
                self.blocked_reason = None
