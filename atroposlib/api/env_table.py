"""The environments a run knows: who registered, who is live, what share each gets.

Design: liveness is a heartbeat kept in memory only. Every `/status-env` poll
marks its env as heard from; an env silent for longer than `timeout_s` (killed
without `/disconnect-env`, or its machine gone) stops counting in the weights
and its `min_batch_allocation` stops holding batches, until it polls again.
The table itself (ids, names, weights, sizes) is persisted by `RunState`.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from atroposlib.protocol import RegisterEnv

logger = logging.getLogger("atroposlib.api")

MIN_ENV_WEIGHT = 0.01


@dataclass
class EnvRecord:
    registered_id: int
    desired_name: str
    real_name: str
    max_context_len: int
    weight: float
    group_size: int
    min_batch_allocation: float | None
    connected: bool = True
    last_update: float = 0.0


class EnvTable:
    def __init__(self, timeout_s: float, records: list[dict[str, Any]] | None = None) -> None:
        self.timeout_s = timeout_s
        self.records = [EnvRecord(**record) for record in records or []]
        now = time.monotonic()  # restored envs get a full timeout to poll again
        self.last_heard = {env.registered_id: now for env in self.records}
        self.progress: dict[int, dict[str, int]] = {}
        """Each env's counters from its last poll (in memory, as liveness is)."""

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, env_id: int) -> EnvRecord:
        return self.records[env_id]

    def knows(self, env_id: int) -> bool:
        return 0 <= env_id < len(self.records)

    def as_json(self) -> list[dict[str, Any]]:
        return [asdict(env) for env in self.records]

    def add(self, request: RegisterEnv) -> EnvRecord:
        """A new record; or the first disconnected one of the same name, taken over: an
        environment stopped with /disconnect-env and started again (a resumed run) keeps
        its id and name, and so finds its checkpoints under that name."""
        for env in self.records:
            if env.desired_name == request.desired_name and not env.connected:
                env.max_context_len, env.weight = request.max_token_length, request.weight
                env.group_size = request.group_size
                env.min_batch_allocation = request.min_batch_allocation
                env.connected, env.last_update = True, time.time()
                self.last_heard[env.registered_id] = time.monotonic()
                return env
        same_name = sum(1 for env in self.records if env.desired_name == request.desired_name)
        env = EnvRecord(
            registered_id=len(self.records),
            desired_name=request.desired_name,
            real_name=f"{request.desired_name}_{same_name}",
            max_context_len=request.max_token_length,
            weight=request.weight,
            group_size=request.group_size,
            min_batch_allocation=request.min_batch_allocation,
            last_update=time.time(),
        )
        self.records.append(env)
        self.last_heard[env.registered_id] = time.monotonic()
        return env

    def heard_from(self, env_id: int, progress: dict[str, int] | None = None) -> None:
        if not self.knows(env_id):
            return
        if progress:
            self.progress[env_id] = progress
        if self._silent(env_id) and self.records[env_id].connected:
            logger.warning(
                "env %d polls again after more than %.0fs of silence; it counts again",
                env_id,
                self.timeout_s,
            )
        self.last_heard[env_id] = time.monotonic()

    def _silent(self, env_id: int) -> bool:
        return time.monotonic() - self.last_heard.get(env_id, -math.inf) > self.timeout_s

    def progress_by_name(self) -> dict[str, dict[str, int]]:
        """The live envs' counters, by their names (`/status`'s `env_progress`)."""
        live = {env.registered_id: env.real_name for env in self.live()}
        return {live[i]: counts for i, counts in self.progress.items() if i in live}

    def live(self) -> list[EnvRecord]:
        """Connected envs heard from within the timeout."""
        return [e for e in self.records if e.connected and not self._silent(e.registered_id)]

    def min_allocations(self) -> dict[int, float]:
        """Live envs' `min_batch_allocation`: the share of each batch they must get."""
        return {
            env.registered_id: env.min_batch_allocation
            for env in self.live()
            if env.min_batch_allocation is not None
        }

    def weight_of(self, env_id: int) -> float:
        """This env's share of the live envs' context-length-weighted total."""
        env = self.records[env_id]
        total = sum(e.max_context_len * max(0.0, e.weight) for e in self.live())
        return env.max_context_len * env.weight / total if total > 0 else 0.0

    def status_numbers(
        self,
        env_id: int,
        size_counts: Counter[int],
        env_sizes: dict[int | None, Counter[int]],
        min_sequences: dict[int, int],
    ) -> dict[str, Any]:
        """Upstream's `/status-env` numbers from the queue's group sizes per env.

        A pure read: like upstream, the largest group this env has queued counts as its
        group size when that exceeds the registered one, but it is computed, not saved.
        """
        env = self.records[env_id]
        max_group_size = max([1, *(s for s, c in size_counts.items() if c > 0)])
        own_sizes = env_sizes.get(env_id, Counter())
        group_size = max([env.group_size, *(s for s, c in own_sizes.items() if c > 0)])
        own_sequences = sum(s * c for s, c in own_sizes.items())
        from_others = 0
        for other, sizes in env_sizes.items():
            if other == env_id:
                continue
            sequences = sum(s * c for s, c in sizes.items())
            if sequences:
                packed = math.ceil(sequences / max_group_size) * max_group_size
                reserved = min_sequences.get(other, 0) if other is not None else 0
                from_others += max(0, packed - reserved)
        return {
            "queue_size": (own_sequences + from_others) // group_size,
            "unallocated_fraction": 1.0 - min(1.0, sum(self.min_allocations().values())),
            "self_queue_size": own_sequences // group_size,
            "max_group_size": max_group_size,
            "env_weight": max(MIN_ENV_WEIGHT, self.weight_of(env_id)),
        }
