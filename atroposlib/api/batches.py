"""Serving batches: the queue, planning a batch from it, leasing it to a step, serving
it again. `RunState` holds one `BatchServer` and hands it, per call, what it reads of
the run (the registration, the environments' minimum shares).

The rules: `/batch` assembles one batch per call and each served batch advances the
step (Atropos assembled every ready batch at once, moving the step ahead of the trainer
and hiding those groups from the queue size environments throttle on). A trainer that
names the step it wants leases that step's batch: the same batch comes back if it asks
again, until a checkpoint at or after that step releases it. Like the run state, a
change is written to the store first and applied to memory after.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from atroposlib.api.packing import plan_batch
from atroposlib.api.refusals import StepConflict
from atroposlib.api.store import GroupRow, GroupStore, WriteSet
from atroposlib.protocol import Registration

logger = logging.getLogger("atroposlib.api")

NOT_REGISTERED = {
    "status": "error",
    "message": "no trainer has registered; POST /register first",
    "batch": [],
}


class BatchServer:
    """The queue and the batches served from it (see the module docstring)."""

    def __init__(
        self,
        store: GroupStore,
        writing: Callable[[], AbstractContextManager[None]],
        counters: Counter[str],
    ) -> None:
        """`writing`: the run state's guard around store writes (a failure is a 503)."""
        self.store, self.writing, self.counters = store, writing, counters
        self.queue: list[GroupRow] = []
        self.queued_sequences = 0
        self.size_counts: Counter[int] = Counter()
        self.env_sizes: dict[int | None, Counter[int]] = {}
        self.leases: dict[int, list[GroupRow]] = {}  # step -> its served groups, until released
        self.by_step = False
        """The registered trainer asks /batch by step (leases): a plain /batch from anyone
        else would take a batch from under it, and its next request would fail."""
        self.started = False
        self.step = 0
        self.version = 0
        """Bumped by every change a batch plan depends on."""
        self.blocked_reason: str | None = None
        self._no_batch_key: tuple | None = None  # the plan inputs that last gave no batch

    def enqueue(self, row: GroupRow) -> None:
        self.queue.append(row)
        self.queued_sequences += row.size
        self.size_counts[row.size] += 1
        self.env_sizes.setdefault(row.env_id, Counter())[row.size] += 1

    def keep(self, row: GroupRow, step: int) -> None:
        """A row the store holds as served to `step`: its lease, read back at start."""
        self.leases.setdefault(step, []).append(row)
        self.by_step = True  # its trainer leases: keep plain reads off its batches

    def persist(self, **kv: Any) -> None:
        with self.writing():
            self.store.write(WriteSet(kv=kv))

    def release(self, upto: int) -> None:
        """Forget the kept batches of steps <= `upto`: a trainer checkpoint holds them."""
        for step in sorted(s for s in self.leases if s <= upto):
            with self.writing():
                self.store.remove([row.id for row in self.leases[step]], {})
            del self.leases[step]

    def min_sequences_by_env(
        self, registration: Registration | None, allocations: dict[int, float]
    ) -> dict[int, int]:
        batch_size = registration.batch_size if registration else 0
        return {env: int(batch_size * share) for env, share in allocations.items()}

    def plan(self, batch_size: int, allocations: dict[int, float]) -> list[int] | None:
        """Positions in the queue of the next batch, or None (and why, when it is stuck)."""
        if self.queued_sequences < batch_size:
            self.blocked_reason = None
            return None
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

    def plan_if_stale(
        self, registration: Registration | None, allocations: dict[int, float]
    ) -> None:
        """Refresh `blocked_reason` without serving anything."""
        if registration is not None:
            if self.plan(registration.batch_size, allocations) is not None:
                self.blocked_reason = None

    def next_batch(
        self,
        registration: Registration | None,
        allocations: dict[int, float],
        step: int | None = None,
        committed: int | None = None,
    ) -> bytes | dict[str, Any]:
        """The next batch (upstream: a destructive read), or with `step` a leased one.

        A trainer that names the `step` it wants gets that step's batch, and the same
        batch again if it asks again (a lost or timed-out answer, or a resume); its
        groups are kept until the trainer reports a checkpoint at or after that step
        (`committed`). Without `step` the batch is deleted as it is served, as upstream.
        """
        if registration is None:
            return NOT_REGISTERED
        if not self.started:
            self.persist(started=True)
            self.started = True
        if committed is not None:
            self.release(committed)
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
        positions = self.plan(registration.batch_size, allocations)
        if positions is None:
            return {"batch": None}
        return self._serve(positions, step)

    def _serve(self, positions: list[int], step: int | None) -> bytes:
        rows = [self.queue[p] for p in positions]
        ids = [r.id for r in rows]
        payload = b'{"batch":[' + b",".join(self.store.bodies(ids)) + b"]}"
        with self.writing():  # a failure leaves the queue and step as they were
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
            self.persist(step=step)
            self.step = step
            self.version += 1
        logger.info("serving the batch of step %d again (%d groups)", step, len(rows))
        self.counters["batches_served_again"] += 1
        return b'{"batch":[' + b",".join(self.store.bodies([r.id for r in rows])) + b"]}"
