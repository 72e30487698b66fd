"""The environment's side of the ManagedServer proxy (upstream's module and names).

`ServerManager(proxy_url=...)` (or ATROPOS_PROXY_URL) makes `managed_server()` yield
a `ProxyManagedServer`: one session on the proxy, with ManagedServer's interface
(`chat_completion`, `get_state`, `reset`) plus `get_url()`, the base URL to hand an
agent that only speaks OpenAI. Its nodes come back from the proxy as JSON and are
rebuilt as `SequenceNode`s, so `scored_data_group_from_nodes` (or an env's own code)
reads them exactly as it reads an in-process ManagedServer's.

    async with self.server.managed_server() as managed:
        agent = MyAgent(base_url=managed.get_url(), api_key=managed.api_key)  # any OpenAI client
        await agent.run(task)
        nodes = (await managed.fetch_state())["nodes"]

On leaving the block the nodes are fetched one last time (so `get_state()` still has
them) and the session is deleted. The environment's requests carry the proxy's key
(ATROPOS_PROXY_API_KEY) when one is set; the agent gets `api_key`, its session's own
key (a keyed proxy hands one out per session), which opens that session's completions
and nothing else.

A proxy that this process serves itself (`serve_in_process`) is listed in
`IN_PROCESS_PROXIES`: a session on it is opened, read and deleted by a call to its
service, not by an HTTP round trip out of this process and back into it (three of an
agent rollout's five requests, a quarter of the environment's CPU). The agent's own
requests still come over HTTP: the agent is the black box.
"""

from __future__ import annotations

import logging
import os
import time
import uuid as uuid_lib
from collections.abc import Awaitable
from typing import Any

import httpx
from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

from atroposlib.envs.server_handling.sequence_node import SequenceNode
from atroposlib.utils.http_client import shared_async_http_client

logger = logging.getLogger("atroposlib.proxy")

# the ProxyService of each proxy served by this process, by its URL (serve_in_process)
IN_PROCESS_PROXIES: dict[str, Any] = {}

PROXY_KEY_ENVIRONMENT = "ATROPOS_PROXY_API_KEY"


class ProxyError(RuntimeError):
    """The proxy refused a request or could not be reached; the message says which."""


def _headers(key: str | None = None) -> dict[str, str]:
    """`key`, else the proxy's key from the environment, as a bearer header."""
    key = key or os.environ.get(PROXY_KEY_ENVIRONMENT)
    return {"Authorization": f"Bearer {key}"} if key else {}


async def _call_in_process(call: Awaitable[Any]) -> dict[str, Any]:
    """An in-process ProxyService's answer, refused as its HTTP route would refuse it."""
    from starlette.exceptions import HTTPException

    try:
        answer = await call
    except HTTPException as exc:
        raise ProxyError(f"Proxy request failed ({exc.status_code}): {exc.detail}") from exc
    return answer.model_dump(mode="json") if hasattr(answer, "model_dump") else answer


async def _request(
    method: str, url: str, timeout: float, json: Any = None, key: str | None = None
) -> dict[str, Any]:
    client = shared_async_http_client()
    try:
        response = await client.request(
            method, url, json=json, headers=_headers(key), timeout=timeout
        )
    except httpx.HTTPError as exc:
        raise ProxyError(f"cannot reach the proxy at {url}: {exc}") from exc
    try:
        data = response.json()
    except ValueError:
        data = {"error": {"message": response.text[:300]}}
    if response.status_code != 200:
        error = data.get("error", {}) if isinstance(data, dict) else {}
        message = error.get("message", str(data)) if isinstance(error, dict) else str(data)
        raise ProxyError(f"Proxy request failed ({response.status_code}): {message}")
    return data


class ProxyManagedServer:
    """One proxy session, used like a ManagedServer (see the module docstring)."""

    def __init__(
        self,
        proxy_url: str,
        session_uuid: str,
        model_name: str = "unknown",
        base_url: str | None = None,
        timeout_s: float = 300.0,
        api_key: str | None = None,
    ) -> None:
        self.proxy_url = proxy_url.rstrip("/")
        self.session_uuid = session_uuid
        self.model_name = model_name
        self.base_url = base_url
        """The backend the proxy pinned this session to."""
        self.api_key = api_key or "none"
        """The key to hand the agent: its session's own (a keyless proxy wants none)."""
        self._session_key = api_key
        self.timeout_s = timeout_s
        self._cached_nodes: list[SequenceNode] | None = None
        self._service = IN_PROCESS_PROXIES.get(self.proxy_url)

    def get_url(self) -> str:
        """The OpenAI base URL of this session: `<proxy>/<uuid>/v1`."""
        return f"{self.proxy_url}/{self.session_uuid}/v1"

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        """ManagedServer's `chat_completion`, sent through the proxy."""
        messages = [m if isinstance(m, dict) else dict(m) for m in kwargs.get("messages", [])]
        body: dict[str, Any] = {
            "messages": messages,
            "max_tokens": kwargs.get("max_tokens", 1024),
            "temperature": kwargs.get("temperature", 1.0),
            "n": kwargs.get("n", 1),
        }
        for name in ("stop", "tools", "tool_choice", "top_p", "seed"):
            if kwargs.get(name) is not None:
                body[name] = kwargs[name]
        url = f"{self.proxy_url}/{self.session_uuid}/v1/chat/completions"
        data = await _request("POST", url, self.timeout_s, json=body, key=self._session_key)
        data.setdefault("id", f"chatcmpl-{uuid_lib.uuid4().hex[:12]}")
        data.setdefault("created", int(time.time()))
        data.setdefault("model", self.model_name)
        data["object"] = "chat.completion"
        return ChatCompletion.model_validate(data)

    async def completion(self, **kwargs: Any) -> Completion:
        raise NotImplementedError(
            "ProxyManagedServer.completion() is not supported: the proxy serves "
            "chat/completions and renders the prompt itself; use chat_completion()"
        )

    def get_state(self) -> dict[str, Any]:
        """The nodes last fetched (`fetch_state`), as `{"nodes": [...]}`."""
        return {"nodes": list(self._cached_nodes or [])}

    async def fetch_state(self) -> dict[str, Any]:
        """The session's nodes, fetched from the proxy now."""
        if self._service is not None:
            data = await _call_in_process(self._service.get_nodes(self.session_uuid))
        else:
            data = await _request("GET", f"{self.proxy_url}/{self.session_uuid}/nodes", 30.0)
        self._cached_nodes = [SequenceNode(**node) for node in data.get("nodes", [])]
        return {"nodes": list(self._cached_nodes)}

    def reset(self) -> None:
        self._cached_nodes = None

    async def cleanup(self) -> None:
        """Delete the session on the proxy (a failure is logged, not raised)."""
        try:
            if self._service is not None:
                await _call_in_process(self._service.delete_session(self.session_uuid))
            else:
                await _request("DELETE", f"{self.proxy_url}/{self.session_uuid}", 30.0)
        except ProxyError as exc:
            logger.warning("could not delete proxy session %s: %s", self.session_uuid, exc)

    async def __aenter__(self) -> ProxyManagedServer:
        return self

    async def __aexit__(self, *_: Any) -> None:
        try:
            await self.fetch_state()
        except ProxyError as exc:
            logger.warning("could not fetch proxy session %s: %s", self.session_uuid, exc)
        await self.cleanup()


async def create_proxy_session(
    proxy_url: str,
    base_url: str | None = None,
    tool_parser: str = "hermes",
    track_tree: bool = False,
    model_name: str = "unknown",
) -> ProxyManagedServer:
    """A new session on the proxy at `proxy_url` (pinned to `base_url` when given)."""
    body: dict[str, Any] = {"tool_parser": tool_parser, "track_tree": track_tree}
    if base_url:
        body["base_url"] = base_url
    service = IN_PROCESS_PROXIES.get(proxy_url.rstrip("/"))
    if service is not None:
        from atroposlib.envs.server_handling.proxy_models import SessionCreateRequest

        request = SessionCreateRequest.model_validate(body)
        data = await _call_in_process(service.create_session(request))
    else:
        url = f"{proxy_url.rstrip('/')}/sessions/create"
        data = await _request("POST", url, 30.0, json=body)
    return ProxyManagedServer(
        proxy_url=proxy_url,
        session_uuid=data["uuid"],
        model_name=data.get("model_name", model_name),
        base_url=data.get("base_url"),
        api_key=data.get("api_key"),
    )
