"""The answers of posts that carried an `Idempotency-Key`, so a retry is answered
instead of queued twice.

An answer is committed to the store with its post, before the client hears it, and
kept in memory for replays; with a TTL (`--idempotency-ttl-s`) old answers are pruned
now and then (none by default: a replay after any pause is answered, not trained
twice; DUR-3 of the durability review).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from atroposlib.api.refusals import StoreWriteError
from atroposlib.api.store import GroupStore

logger = logging.getLogger("atroposlib.api")

PRUNE_EVERY = 1000
"""Posts between two prunes of expired answers."""


class IdempotentAnswers:
    def __init__(
        self,
        answers: dict[str, tuple[bytes, float]],
        ttl_s: float | None,
        store: GroupStore,
        writing: Callable[[], AbstractContextManager[None]],
    ) -> None:
        """`answers`: key -> (answer, when made), as the store read them back."""
        self.answers, self.ttl_s = answers, ttl_s
        self.store, self.writing = store, writing
        self._since_prune = 0

    def replay(self, key: str) -> bytes | None:
        """The answer already given to `key`, unless it expired."""
        previous = self.answers.get(key)
        if previous is None or self._expired(previous[1]):
            return None
        return previous[0]

    def remember(self, key: str, answer: bytes) -> None:
        """An answer the store has committed; prune now and then."""
        self.answers[key] = (answer, time.time())
        self._since_prune += 1
        if self._since_prune < PRUNE_EVERY or self.ttl_s is None:
            return
        self._since_prune = 0
        cutoff = time.time() - self.ttl_s
        self.answers = {k: v for k, v in self.answers.items() if v[1] >= cutoff}
        try:  # housekeeping after a committed post: its failure must not fail the post
            with self.writing():
                self.store.prune_idempotency(cutoff)
        except StoreWriteError as exc:
            logger.warning("idempotency answers not pruned: %s", exc)

    def _expired(self, created: float) -> bool:
        return self.ttl_s is not None and time.time() - created >= self.ttl_s
