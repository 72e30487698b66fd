"""`ManagedServerAdapter`: a `ManagedServer` behind the `AsyncOpenAI` calls libraries use.

Libraries such as `verifiers` take an OpenAI client; handing them this adapter routes
their `chat.completions.create` / `completions.create` through the managed server, so
every sample is still tracked with token ids, masks and logprobs. Only that subset of
the client exists: anything else (`post`, `copy`) is a clear NotImplementedError
rather than a request that would bypass tracking.
"""

from __future__ import annotations

from typing import Any


class _Create:
    def __init__(self, call: Any) -> None:
        self._call = call

    async def create(self, **kwargs: Any) -> Any:
        return await self._call(**kwargs)


class _Chat:
    def __init__(self, managed: Any) -> None:
        self.completions = _Create(managed.chat_completion)


class ManagedServerAdapter:
    def __init__(self, managed_server: Any, base_url: str) -> None:
        """`base_url` is only exposed (`adapter.base_url`) for libraries that read it."""
        self._managed = managed_server
        self.base_url = base_url
        self.chat = _Chat(managed_server)
        self.completions = _Create(managed_server.completion)

    async def post(self, path: str, body: dict, cast_to: type) -> Any:
        raise NotImplementedError(
            f"ManagedServerAdapter has no post() (asked for {path!r}): raw endpoint calls "
            "such as vLLM's interleaved rollouts bypass tracking; use chat completions"
        )

    def copy(self, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "ManagedServerAdapter cannot be copied (libraries copy the client to reach "
            "vLLM's tokenize endpoints, which bypass tracking)"
        )
