"""The proxy's sessions: one `ManagedServer` per rollout, bounded in number, age and size.

Upstream keeps every session until it is deleted, so an agent that crashes leaks its
session and its tokens for the life of the proxy. Here a session

- expires after `idle_timeout_s` without a request (checked on every create, on a
  lookup of that session, and by the proxy's reaper every few seconds);
- records at most `token_budget` tokens: a request's `max_tokens` is cut to what is
  left, and a session that has spent it is refused with an OpenAI error;
- is one of at most `max_sessions`: creating one more first drops expired ones, then
  is refused (429) rather than letting memory grow.

So the proxy holds at most `max_sessions` x `token_budget` tokens: a request is sent
only if `n` x (its prompt + `max_tokens`) fits (ManagedServer's `token_budget`), and
the body that carries the prompt is bounded before it is parsed. A
session's requests run one at a time (its lock): ManagedServer extends nodes by
prefix, and two turns of one conversation sent at once would race.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field


class SessionLimits(BaseModel):
    """What one proxy lets sessions hold (the `atropos-proxy` flags of the same names)."""

    idle_timeout_s: float = Field(
        600.0, gt=0, description="Seconds without a request after which a session is dropped."
    )
    max_sessions: int = Field(
        1024, ge=1, description="Sessions held at once; one more is refused (429)."
    )
    session_token_budget: int = Field(
        32768,
        ge=1,
        description="Tokens a session's recorded sequences may hold: prompts and "
        "completions of every turn, times n; max_tokens is cut to what is left, and a "
        "request whose prompt does not fit is refused.",
    )


class SessionsFull(Exception):
    """No room for another session (after dropping the expired ones)."""


@dataclass
class SessionState:
    """Upstream's session record, plus the budget and the lock."""

    uuid: str
    managed_server: Any
    translator: Any
    model_name: str
    base_url: str | None = None
    api_key: str | None = None
    """The bearer that opens this session's own routes (a keyed proxy's sessions)."""
    created_at: float = field(default_factory=time.time)
    last_accessed: float = field(default_factory=time.time)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def recorded_tokens(self) -> int:
        """Tokens the session's nodes hold now (what its budget counts)."""
        state = self.managed_server.get_state()
        nodes = state["sequences"].values() if "sequences" in state else state["nodes"]
        return sum(len(node.tokens) for node in nodes)


class SessionTable:
    """The live sessions, by uuid (see the module docstring)."""

    def __init__(self, limits: SessionLimits) -> None:
        self.limits = limits
        self._sessions: dict[str, SessionState] = {}
        self.expired_total = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self) -> Iterator[SessionState]:
        return iter(list(self._sessions.values()))

    def add(self, session: SessionState) -> None:
        self.expire()
        if len(self._sessions) >= self.limits.max_sessions:
            raise SessionsFull(
                f"the proxy holds its limit of {self.limits.max_sessions} sessions; delete "
                "finished ones (DELETE /{uuid}) or raise --max-sessions"
            )
        self._sessions[session.uuid] = session

    def get(self, uuid: str) -> SessionState | None:
        """The live session `uuid`, now counted as used; None if unknown or expired.
        Only this session's age is checked (a request must not scan every session;
        the reaper and `add` sweep the rest)."""
        session = self._sessions.get(uuid)
        if session is None:
            return None
        now = time.time()
        idle = now - session.last_accessed >= self.limits.idle_timeout_s
        if idle and not session.lock.locked():
            self._sessions.pop(uuid).managed_server.reset()
            self.expired_total += 1
            return None
        session.last_accessed = now
        return session

    def peek(self, uuid: str) -> SessionState | None:
        """The session `uuid` as it is, without counting a use or expiring it."""
        return self._sessions.get(uuid)

    def pop(self, uuid: str) -> SessionState | None:
        return self._sessions.pop(uuid, None)

    def expire(self, now: float | None = None) -> list[str]:
        """Drop the sessions idle for `idle_timeout_s` or more (not one that is busy)."""
        now = time.time() if now is None else now
        stale = [
            s.uuid
            for s in self._sessions.values()
            if now - s.last_accessed >= self.limits.idle_timeout_s and not s.lock.locked()
        ]
        for uuid in stale:
            self._sessions.pop(uuid).managed_server.reset()
        self.expired_total += len(stale)
        return stale

    def tokens_left(self, session: SessionState) -> int:
        return self.limits.session_token_budget - session.recorded_tokens()
