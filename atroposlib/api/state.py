"""The run's state: one object with clear methods, backed by a `GroupStore`.

Design decisions:
- Group bodies live in the store; memory holds only `GroupRow`s (id, env, size,
  order), so the queue can hold 10,000 groups and a batch is planned without
  touching their JSON.
- Every mutation is planned first, written to the store, and only then applied
  to memory. A failed write leaves memory as it was, so nothing is half-accepted.
  Writes go through `_writing`, which turns a store failure (disk full, read-only,
  I/O error) into `StoreWriteError` (a 503), counts it and keeps the reason for
  `/status` until a write succeeds again: the API recovers without a restart.
- The queue and the batches served from it (planning, leases, serving again) are
  `batches.BatchServer`, a part this class holds; what it refuses with is
  `refusals.py`.
- All methods are synchronous and run on the event loop thread, which makes
  each request's check-then-write atomic without locks.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from atroposlib.api.batches import BatchServer
from atroposlib.api.env_table import EnvTable
from atroposlib.api.idempotency import IdempotentAnswers
from atroposlib.api.intake import plan_intake, post_errors
from atroposlib.api.refusals import (
    InvalidGroups,
    QueueFull,
    RunConflict,
    StoreWriteError,
    UnknownEnv,
)
from atroposlib.api.runs import run_name, run_refusal
from atroposlib.api.store import GroupRow, GroupStore, WriteSet, write_failure
from atroposlib.protocol import EMPTY_EXAMPLE, RegisterEnv, Registration, ScoredData

logger = logging.getLogger("atroposlib.api")

RESUMED_FIELDS = {
    *("batch_size", "max_token_len", "num_steps", "vocab_size", "max_staleness"),
    "starting_step",
}
"""What a trainer that registers again may change of its run's registration."""


class RunState:
    """The trajectory API's whole run: registration, envs, queue, batches, counters.

    Every route is one method here. A mutation is planned, written to the `GroupStore`,
    then applied to memory, so a failed write changes nothing and a restart reads back
    exactly what was accepted.
    """

    def __init__(
        self,
        store: GroupStore,
        max_queued_sequences: int = 1_000_000,
        idempotency_ttl_s: float | None = None,
        env_timeout_s: float = 120.0,
    ) -> None:
        self.store = store
        self.env_timeout_s = env_timeout_s
        self.max_queued_sequences = max_queued_sequences
        self.idempotency_ttl_s = idempotency_ttl_s
        self.counters: Counter[str] = Counter()
        self.env_counters: Counter[tuple[str, str]] = Counter()
        self.store_error: str | None = None  # why the last store write failed, until one works
        self._clear_memory()
        self._load()

    # ------------------------------------------------------------------ setup
    def _clear_memory(self) -> None:
        self.registration: Registration | None = None
        self.envs = EnvTable(self.env_timeout_s)
        self.batches = BatchServer(self.store, self._writing, self.counters)
        self.buffers: dict[int | None, list[GroupRow]] = {}  # keyed like GroupRow.env_id
        self.buffered_sequences = 0
        self.latest: bytes | None = None
        self.idempotency = IdempotentAnswers({}, self.idempotency_ttl_s, self.store, self._writing)
        self.next_id = 1

    def _load(self) -> None:
        loaded = self.store.load(self.idempotency_ttl_s)
        kv = loaded.kv
        if kv.get("registration"):
            self.registration = Registration.model_validate(kv["registration"])
        batches = self.batches
        batches.started = bool(kv.get("started", False))
        batches.step = int(kv.get("step", 0))
        self.envs = EnvTable(self.env_timeout_s, kv.get("envs", []))
        for row in loaded.rows:
            if row.served_step is not None:
                batches.keep(row, row.served_step)
            elif row.buffered:
                self.buffers.setdefault(row.env_id, []).append(row)
                self.buffered_sequences += row.size
            else:
                batches.enqueue(row)
            self.next_id = max(self.next_id, row.id + 1)
        self.next_id = max(self.next_id, int(kv.get("next_id", 1)))
        self.idempotency.answers = loaded.idempotency
        self.latest = loaded.latest
        if loaded.rows or self.registration:
            run = self.registration.wandb_group if self.registration else "(unregistered)"
            logger.warning(
                "resuming the stored state of run %s: step %d, %d queued groups, %d buffered "
                "groups, %d envs, batches kept for re-serving: steps %s",
                run,
                batches.step,
                len(batches.queue),
                sum(len(b) for b in self.buffers.values()),
                len(self.envs),
                sorted(batches.leases) or "none",
            )

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Wrap store writes: a failure is counted, remembered and raised as a 503."""
        try:
            yield
        except StoreWriteError:
            raise  # an inner write already counted and named it
        except (sqlite3.Error, OSError) as exc:
            self.counters["store_write_errors"] += 1
            reason = write_failure(exc, self.store.dir)
            if reason != self.store_error:
                logger.error("store write failed (answering 503 until one works): %s", reason)
            self.store_error = reason
            raise StoreWriteError(f"{reason}; retry later") from exc
        if self.store_error is not None:
            logger.warning("store writes work again (they failed with: %s)", self.store_error)
            self.store_error = None

    # ----------------------------------------------------------- registration
    def register(self, registration: Registration) -> dict[str, int]:
        step = registration.starting_step
        batches = self.batches
        if self.registration is None:
            batches.persist(registration=registration.model_dump(), step=step)
            self.registration = registration
            batches.step = step
        else:
            self._check_same_run(registration)
            updated = self.registration.model_copy(
                update=registration.model_dump(include=RESUMED_FIELDS)
            )
            self._rewind(step)
            batches.persist(registration=updated.model_dump(), step=step)
            self.registration = updated
            batches.step = step
            batches.version += 1
        batches.by_step = False  # until this trainer asks by step
        logger.info(
            "trainer registered: batch_size %d, max_token_len %d, num_steps %d",
            registration.batch_size,
            registration.max_token_len,
            registration.num_steps,
        )
        return {"uuid": uuid.uuid4().int}

    def _check_same_run(self, registration: Registration) -> None:
        """The stored state is resumed only by its own run, and only when it asks to.

        A run is its (wandb_group, wandb_project, checkpoint_dir); a trainer of another
        run, or one that starts from step 0 when a checkpoint of this run has released
        batches, would otherwise inherit its step, its queue and its kept batches without
        a word.
        """
        stored = self.registration
        assert stored is not None  # register() calls this only when a run is stored
        batches = self.batches
        refusal = run_refusal(stored, registration, batches.step, batches.leases.keys())
        if refusal is not None:
            raise RunConflict(refusal)
        logger.warning(
            "run %s resumes at step %d: %d queued groups, %d buffered, kept batches %s, "
            "%d envs known",
            run_name(stored),
            registration.starting_step,
            len(batches.queue),
            sum(len(rows) for rows in self.buffers.values()),
            sorted(batches.leases) or "none",
            len(self.envs),
        )

    def _rewind(self, step: int) -> None:
        """A trainer that registers again resumed from `step`: the API's step follows it.

        Kept batches up to `step` are in the checkpoint it resumed from, so they are
        released; later ones will be served again, in order, when it asks for them.
        The caller moves the step once the new step is stored.
        """
        batches = self.batches
        batches.release(step)
        if step != batches.step:
            logger.warning(
                "trainer registered again at step %d; the API was at step %d and moves to %d "
                "(batches kept for re-serving: steps %s)",
                step,
                batches.step,
                step,
                sorted(batches.leases) or "none",
            )

    def register_env(self, request: RegisterEnv) -> dict[str, Any]:
        if not self.batches.started or self.registration is None:
            return {"status": "wait for trainer to start"}
        before = [replace(record) for record in self.envs.records]
        env = self.envs.add(request)
        try:
            self.batches.persist(envs=self.envs.as_json())
        except StoreWriteError:  # not stored, so not known: the env registers again
            self.envs.records[:] = before
            self.envs.last_heard.pop(env.registered_id, None)
            raise
        self.batches.version += 1
        logger.info("env registered: id %d, name %s", env.registered_id, env.real_name)
        reg = self.registration
        return {
            "status": "success",
            "env_id": env.registered_id,
            "wandb_name": env.real_name,
            "checkpoint_dir": reg.checkpoint_dir,
            "starting_step": self.batches.step,
            "checkpoint_interval": reg.save_checkpoint_interval,
            "num_steps": reg.num_steps,
        }

    def disconnect_env(self, env_id: int) -> dict[str, str]:
        if not self.envs.knows(env_id):
            return {"status": "failure", "error": f"unknown env_id {env_id}"}
        envs = self.envs.as_json()
        envs[env_id]["connected"] = False
        self.batches.persist(envs=envs)
        self.envs[env_id].connected = False
        self.batches.version += 1
        return {"status": "success"}

    # ---------------------------------------------------------------- posting
    def accept(
        self,
        groups: list[ScoredData],
        as_list: bool,
        idempotency_key: str | None = None,
        raw: bytes | None = None,
    ) -> bytes:
        """Validate, store and queue (or buffer) posted groups; returns the JSON answer.

        `raw` is the posted JSON of a single group, reused as its stored body.
        """
        if idempotency_key is not None:
            previous = self.idempotency.replay(idempotency_key)
            if previous is not None:
                self.counters["idempotent_replays"] += 1
                return previous
        errors = post_errors(groups, as_list, self.registration, self.envs.knows)
        if errors:
            raise InvalidGroups(errors)
        incoming = sum(len(group.tokens) for group in groups)
        held = self.batches.queued_sequences + self.buffered_sequences
        if held + incoming > self.max_queued_sequences:
            raise QueueFull(
                f"queue holds {held} sequences; accepting {incoming} more would pass "
                f"--max-queued-sequences {self.max_queued_sequences}"
            )

        change, newly_queued, answers = self._plan_accept(groups, raw)
        if as_list:
            answer: dict[str, Any] = {"status": "received", "groups_processed": len(groups)}
            buffered = [a for a in answers if a["status"] == "buffered"]
            if buffered:
                answer["buffered"] = len(buffered)
                answer["last_buffer_size"] = buffered[-1]["buffer_size"]
        else:
            answer = answers[0]
        response = json.dumps(answer).encode()
        if idempotency_key is not None:
            change.idempotency = (idempotency_key, response)
        with self._writing():
            self.store.write(change)
        if idempotency_key is not None:  # committed: a retry must get this answer, even if
            self.idempotency.remember(idempotency_key, response)  # applying fails
        self._apply_accept(change, newly_queued)
        return response

    def _plan_accept(
        self, groups: list[ScoredData], raw: bytes | None
    ) -> tuple[WriteSet, list[GroupRow], list[dict[str, Any]]]:
        return plan_intake(
            groups, raw, self.buffers, self.next_id, lambda env: self.envs[env].group_size
        )

    def _apply_accept(self, change: WriteSet, newly_queued: list[GroupRow]) -> None:
        self.next_id = change.kv["next_id"]
        queued_ids = {row.id for row in newly_queued}
        for row, _ in change.inserts:
            if row.buffered:
                self.buffers.setdefault(row.env_id, []).append(row)
                self.buffered_sequences += row.size
        if change.promotions or any(r.buffered for r, _ in change.inserts):
            for env, rows in list(self.buffers.items()):
                kept = [r for r in rows if r.id not in queued_ids]
                self.buffered_sequences -= sum(r.size for r in rows) - sum(r.size for r in kept)
                self.buffers[env] = kept
        for row in newly_queued:
            self.batches.enqueue(row)
            self.counters["groups_queued"] += 1
            self.env_counters[("groups", str(row.env_id))] += 1
            self.env_counters[("sequences", str(row.env_id))] += row.size
        self.counters["groups_received"] += len(change.inserts)
        self.counters["sequences_received"] += sum(r.size for r, _ in change.inserts)
        if newly_queued:
            self.batches.version += 1
            bodies = {row.id: body for row, body in change.inserts}
            last = newly_queued[-1]
            try:  # only /latest_example reads it: a failed read must not fail the post
                self.latest = bodies.get(last.id) or self.store.bodies([last.id])[0]
            except OSError as exc:
                logger.warning("cannot read the latest group for /latest_example: %s", exc)

    # ------------------------------------------------------------------- envs
    def heard_from(self, env_id: int, progress: dict[str, int] | None = None) -> None:
        """An env polled: it counts as live (see `env_table`), with its counters."""
        self.envs.heard_from(env_id, progress)

    # ----------------------------------------------------------------- status
    def status(self) -> dict[str, Any]:
        if self.registration is None:
            unregistered: dict[str, Any] = {"current_step": 0, "queue_size": 0}
            if self.store_error is not None:
                unregistered["store_error"] = self.store_error
            return unregistered
        batches = self.batches
        batches.plan_if_stale(self.registration, self.envs.min_allocations())
        return {
            "current_step": batches.step,
            "queue_size": len(batches.queue),
            "queued_sequences": batches.queued_sequences,
            "buffered_groups": sum(len(rows) for rows in self.buffers.values()),
            "batch_blocked": batches.blocked_reason is not None,
            "kept_batch_steps": sorted(batches.leases),
            "blocked_reason": batches.blocked_reason,
            "store_error": self.store_error,
            "env_progress": self.envs.progress_by_name(),
        }

    def status_env(self, env_id: int) -> dict[str, Any]:
        if not self.envs.knows(env_id):
            raise UnknownEnv(f"unknown env_id {env_id}; register with /register-env")
        batches, allocations = self.batches, self.envs.min_allocations()
        return {
            "current_step": batches.step,
            **self.envs.status_numbers(
                env_id,
                batches.size_counts,
                batches.env_sizes,
                batches.min_sequences_by_env(self.registration, allocations),
            ),
            # ours: the trainer's bound on staleness, which narrows the env's window, and
            # its batch size, so an env sees a trainer that registered again with another
            "max_staleness": None if self.registration is None else self.registration.max_staleness,
            "batch_size": None if self.registration is None else self.registration.batch_size,
        }

    def info(self) -> dict[str, int]:
        if self.registration is None:
            return {"batch_size": -1, "max_token_len": -1}
        return {
            "batch_size": self.registration.batch_size,
            "max_token_len": self.registration.max_token_len,
        }

    def wandb_info(self) -> dict[str, str | None]:
        if self.registration is None:
            return {"group": None, "project": None}
        return {"group": self.registration.wandb_group, "project": self.registration.wandb_project}

    def latest_example(self) -> bytes | dict[str, list]:
        return self.latest if self.latest is not None else EMPTY_EXAMPLE

    def reset(self) -> None:
        with self._writing():
            self.store.reset()
        self._clear_memory()
        logger.info("run state reset")

    def next_batch(
        self, step: int | None = None, committed: int | None = None
    ) -> bytes | dict[str, Any]:
        """`/batch` (`BatchServer.next_batch`)."""
        allocations = self.envs.min_allocations()
        return self.batches.next_batch(self.registration, allocations, step, committed)
