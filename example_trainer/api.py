"""The trainer's side of the trajectory API: /register with retries, then /batch by step.

Asking `/batch?step=N&committed=K` is our lease (docs/api.md); upstream's server
ignores the query and serves its next batch, which is what a plain `/batch` gets,
so the same request works against both. A server that refuses the lease
parameters with a 4xx gets plain `/batch` from then on (with one WARNING), and
any other 4xx stops the trainer with the API's answer.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from atroposlib.protocol import Batch, Registration, ScoredData
from example_trainer.config import TrainingConfig

logger = logging.getLogger("example_trainer")


LEASE_REFUSALS = frozenset({400, 404, 405, 422})

"""Answers of a server that does not know `?step=&committed=` (and would not use them)."""


class BatchAnswer(Batch):
    """`/batch`'s answer, with the `status`/`message` both servers add before a /register."""

    status: str | None = None
    message: str | None = None


class APIRefused(RuntimeError):
    """The API answered 4xx: asking again will not help, so the trainer stops and says why."""


def _refusal(response: httpx.Response) -> APIRefused:
    hint = (
        " (set ATROPOS_API_KEY to the key run-api was started with)"
        if response.status_code in (401, 403)
        else ""
    )
    return APIRefused(
        f"{response.request.method} {response.request.url.path} was refused with HTTP "
        f"{response.status_code}: {response.text[:500]}{hint}"
    )


class TrajectoryAPI:
    """The trainer's side of the protocol: /register, then /batch.

    Transport errors and 5xx answers are waited out (the API may be starting or
    restarting); a 4xx is final and raises `APIRefused` quoting the API's answer.
    """

    def __init__(self, url: str, timeout_s: float = 60.0, batch_wait_s: float = 2.0) -> None:
        """`batch_wait_s`: how long the API may hold an empty /batch open for data
        (`Prefer: wait`, atroposlib/api/long_poll.py); 0 asks for an answer at once."""
        key = os.environ.get("ATROPOS_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.leases = True
        """False once the API refused the lease parameters: plain /batch from then on."""
        self.batch_wait_s = min(batch_wait_s, timeout_s / 2)  # well inside the call timeout
        self.waits = False
        """True while the API honours `Prefer: wait` (it answers as soon as a batch is
        ready, so polling again needs no back-off); upstream's answers at once."""
        self.registered: tuple[TrainingConfig, int, int | None] | None = None
        """What the last /register sent (config, starting step, vocabulary size), to
        register again."""

    def register(
        self, config: TrainingConfig, starting_step: int, vocab_size: int | None = None
    ) -> None:
        """`vocab_size`: the rows of the model's embedding; the API then refuses a group
        with a token id it cannot embed (upstream's API ignores the field). The config's
        `max_staleness`, when set, goes along: the API tells environments, which then
        admit no more work than can arrive within it (upstream's ignores it too)."""
        payload = Registration(
            wandb_group=config.logging.wandb_group,
            wandb_project=config.logging.wandb_project,
            batch_size=config.batching.batch_size,
            max_token_len=config.batching.seq_len,
            checkpoint_dir=str(Path(config.checkpoint.save_path).resolve()),
            save_checkpoint_interval=config.checkpoint.save_checkpoint_interval
            or (
                config.weight_sync.engine_restart_interval
                if config.weight_sync.restarts_engine
                else config.optim.training_steps
            ),
            starting_step=starting_step,
            num_steps=config.optim.training_steps,
            vocab_size=vocab_size,
            # environments narrow their off-policy window to it (`/status-env`)
            max_staleness=getattr(config, "max_staleness", None),
        ).model_dump(exclude_none=True)
        self.registered = (config, starting_step, vocab_size)
        delay = 0.5
        while True:
            try:
                response = self.http.post("/register", json=payload)
            except httpx.TransportError as exc:
                why = f"cannot reach the API ({exc})"
            else:
                if response.is_success:
                    return
                if response.status_code < 500:
                    raise _refusal(response)
                why = f"the API answered HTTP {response.status_code}: {response.text[:200]}"
            logger.warning("%s; registering again in %.1fs", why, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10)

    def batch(
        self, step: int | None = None, committed: int | None = None
    ) -> list[ScoredData] | None:
        """The groups of `step`, or None while the API has none (or cannot be reached).

        Naming the step makes the API keep the batch until `committed` (the step of the
        trainer's latest checkpoint) covers it, so a lost answer or a resume gets the
        same batch again instead of skipping it.
        """
        params = {k: v for k, v in (("step", step), ("committed", committed)) if v is not None}
        response = self._get_batch(params if self.leases else {})
        if response is None:
            return None
        if params and self.leases and response.status_code in LEASE_REFUSALS:
            self.leases = False
            logger.warning(
                "the API refused /batch?step=&committed= (HTTP %d: %s); asking plain /batch "
                "from now on, so a lost answer or a resume can skip a batch",
                response.status_code,
                response.text[:200],
            )
            response = self._get_batch({})
            if response is None:
                return None
        if not response.is_success:
            raise _refusal(response)
        try:
            answer = BatchAnswer.model_validate_json(response.content)
        except ValidationError as exc:
            raise APIRefused(f"/batch answered a malformed batch: {exc}") from exc
        if answer.status == "error":  # upstream's answer when no trainer is registered
            self._register_again(step, answer.message or response.text[:200])
            return None
        return answer.batch

    def _register_again(self, step: int | None, answer: str) -> None:
        """The API lost this trainer (restarted without its store, or reset): register at
        the step being trained, so the run goes on from there."""
        if self.registered is None:
            raise APIRefused(f"/batch answered an error before any /register: {answer}")
        config, starting_step, vocab_size = self.registered
        at = step - 1 if step is not None else starting_step
        logger.warning(
            "/batch answered %r: the API no longer knows this trainer (restarted without its "
            "state?); registering again at step %d",
            answer,
            at,
        )
        self.register(config, at, vocab_size)

    def _get_batch(self, params: dict[str, int]) -> httpx.Response | None:
        """GET /batch; None (after a WARNING) when it cannot be reached or answers 5xx."""
        try:
            wait = {"Prefer": f"wait={self.batch_wait_s:g}"} if self.batch_wait_s > 0 else {}
            response = self.http.get("/batch", params=params, headers=wait)
        except httpx.TransportError as exc:
            logger.warning("/batch failed: %s", exc)
            return None
        self.waits = "preference-applied" in response.headers
        if response.status_code >= 500:
            logger.warning("/batch answered HTTP %d: %s", response.status_code, response.text[:200])
            return None
        return response

    def wait_for_batch(
        self, step: int, committed: int, poll_s: float, meanwhile: Callable[[], object]
    ) -> tuple[list[ScoredData], float]:
        """The batch of `step` and the seconds it took, asking until there is one; each
        try first calls `meanwhile` (the trainer revives dead engines, which the batch
        may wait on). A long wait is noted every 30 s with the API's status."""
        started, delay = time.perf_counter(), 0.05
        next_note = started + 30
        while True:
            meanwhile()
            batch = self.batch(step=step, committed=committed)
            if batch:
                return batch, time.perf_counter() - started
            if time.perf_counter() >= next_note:
                next_note += 30
                waited = time.perf_counter() - started
                needs = self.registered[0].batching.batch_size if self.registered else None
                logger.warning(
                    "no batch for %.0fs at step %d: %s",
                    waited,
                    step - 1,
                    waiting_cause(self.status(), needs),
                )
            if not self.waits:  # an API that cannot wait for a batch is polled with back-off
                time.sleep(delay)
                delay = min(delay * 2, poll_s)

    def status(self) -> dict[str, Any] | str:
        """The API's /status, or why it could not be read (for "still waiting" notes)."""
        try:
            return self.http.get("/status").json()
        except (httpx.HTTPError, ValueError) as exc:
            return f"unreachable ({exc})"


def waiting_cause(status: dict[str, Any] | str, batch_size: int | None = None) -> str:
    """Why no batch comes, in words, from the API's /status: what it holds, and each
    environment's counters (`env_progress`), so that one whose every rollout fails is
    named with its cause instead of a status dict to decode."""
    if isinstance(status, str):
        return f"the API is {status}"
    need = f" of the {batch_size} a batch needs" if batch_size else ""
    parts = []
    for name, counts in (status.get("env_progress") or {}).items():
        sent, failed = counts.get("groups_sent", 0), counts.get("rollout_errors", 0)
        refused = counts.get("context_refusals", 0)
        said = f"{name} sent {sent} groups"
        if failed and refused == failed:
            said += (
                f", and the engine refused all {refused} of its failed rollouts for the "
                "model's context length (its log says what to change)"
            )
        elif failed:
            said += f", and {failed} of its rollouts failed (its log has the first traceback)"
        parts.append(said)
    held = status.get("queued_sequences", 0)
    parts.append(f"the API holds {held} sequences{need}")
    for key, what in (("store_error", "its store failed"), ("blocked_reason", "batch blocked")):
        if status.get(key):
            parts.append(f"{what}: {status[key]}")
    if not status.get("env_progress"):
        parts.append("no environment reports its progress (none polls, or they are upstream's)")
    return "; ".join(parts)
