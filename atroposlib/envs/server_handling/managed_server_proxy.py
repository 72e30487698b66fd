"""OpenAI-compatible chat completions proxy over ManagedServer (upstream's module).

An agent written against any OpenAI client can be trained without knowing Atropos:
each rollout gets a session, the agent is handed `<proxy>/<uuid>/v1` as its base URL
and calls `chat/completions` (tools included) as usual, and the session's
`ManagedServer` records the exact tokens, masks and logprobs of every turn, which the
environment reads back from `/<uuid>/nodes` (`proxy_client.py`).

Upstream's endpoints, request and response models and error shape:

    POST   /sessions/create                      -> SessionCreateResponse
    POST   /{uuid}/v1/chat/completions           -> chat.completion
    POST   /{uuid}/v1/chat/completions/render    -> RenderResponse
    GET    /{uuid}/nodes                         -> {"nodes": [SequenceNode]}
    DELETE /{uuid}                               -> {"status": "deleted", "uuid"}
    GET    /sessions, /servers, /v1/models, /health;  POST /setup

Errors are OpenAI's `{"error": {"message", "type", "code"}}`, so the SDK raises its
usual exceptions (an unknown or deleted session: 404). Design decisions beyond
upstream:

- Sessions are bounded (`proxy_sessions.py`): an idle timeout, a token budget per
  session and a session cap, so an agent that crashes does not leak for ever.
- A session is pinned at creation to one backend of the `ServerManager`, the one with
  the most free slots (or the `base_url` asked for), as upstream does; a backend that
  cannot be reached answers a 503 at once instead of a hang.
- Tool calls are parsed on the wire by the project's parser (`tool_call_translator`),
  while the recorded text stays what the model wrote.
- Loopback by default, behind the listeners' one guard (`utils/request_guard.py`):
  JSON posts only, bounded bodies, and without a key only requests addressed to this
  machine (a DNS-rebinding page or a cross-site form gets nothing). Upstream binds
  0.0.0.0 with no key.
- Keys by role (docs/security.md). With an API key, that key opens every route but
  /health, and each session gets a bearer of its own (`api_key` in the answer of
  /sessions/create) that opens its `/{uuid}/v1/...` routes and nothing else: an agent
  holds its session's key, never the key that lists, reads or rewires every session.
  `serve_in_process` always has a key, which never leaves the process.
- Servers that POST /setup names get only the keys its body gives: the engine key of
  the environment is never sent to a `base_url` learnt at run time.

Run it with `atropos-proxy --config servers.json --port 9100` (or upstream's
`python -m atroposlib.envs.server_handling.managed_server_proxy ...`), or mount
`create_app(server_manager, tokenizer, model_name)` in an existing FastAPI app, or serve
it inside an environment's event loop with `serve_in_process` (proxy_serving.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
import uuid as uuid_lib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from atroposlib.envs.server_handling.dummy_managed_server import DummyManagedServer
from atroposlib.envs.server_handling.managed_server import ManagedServer, TokenBudgetSpent
from atroposlib.envs.server_handling.proxy_models import (
    ChatCompletionProxyRequest,
    ChatMessage,
    RenderResponse,
    SessionCreateRequest,
    SessionCreateResponse,
    openai_error,
)
from atroposlib.envs.server_handling.proxy_serving import reap_idle_sessions, serve_in_process
from atroposlib.envs.server_handling.proxy_sessions import (
    SessionLimits,
    SessionsFull,
    SessionState,
    SessionTable,
)
from atroposlib.envs.server_handling.server_baseline import APIServerConfig, is_unreachable
from atroposlib.envs.server_handling.tool_call_translator import ToolCallTranslator
from atroposlib.utils.request_guard import (
    CHAT_MAX_BODY_BYTES,
    CHAT_MAX_BODY_VALUES,
    RequestGuard,
    bears,
)

__all__ = [
    "ChatCompletionProxyRequest",
    "ChatMessage",
    "ProxyService",
    "RenderResponse",
    "SessionCreateRequest",
    "SessionCreateResponse",
    "create_app",
    "openai_error",
    "serve_in_process",
]

logger = logging.getLogger("atroposlib.proxy")

SESSION_PATH = re.compile(r"^/([^/]+)/v1/")


def servers_from_config(config: dict[str, Any]) -> list[APIServerConfig]:
    """The backends of a proxy config (`--config` JSON or a POST /setup body):
    `{"model_name", "tokenizer_name"?, "servers": [{"base_url", "server_type"?, ...}]}`."""
    model_name = config.get("model_name", "unknown")
    configs = []
    for server in config.get("servers", []):
        configs.append(
            APIServerConfig(
                model_name=model_name,
                base_url=server["base_url"],
                api_key=server.get("api_key", ""),
                server_type=server.get("server_type", "vllm"),
                num_max_requests_at_once=server.get("num_max_requests_at_once", 512),
                num_requests_for_eval=server.get("num_requests_for_eval", 64),
                timeout=server.get("timeout", 1200),
                tokenizer_name=config.get("tokenizer_name", "none"),
            )
        )
    return configs


def _base_url(server: Any) -> str | None:
    config = getattr(server, "config", None)
    return getattr(config, "base_url", None) or None


# ------------------------------------------------------------------ the app
class ProxyService:
    """The proxy's state and one method per endpoint (`create_app` routes them)."""

    def __init__(
        self,
        server_manager: Any,
        tokenizer: Any,
        model_name: str,
        limits: SessionLimits,
        api_key: str | None = None,
    ) -> None:
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.limits = limits
        self.sessions = SessionTable(limits)
        self.api_key = api_key
        """The key that opens every route; with one, each session gets its own too."""

    def session_key_opens(self, path: str, headers: dict[bytes, bytes]) -> bool:
        """Whether the request's bearer is that of the session whose routes `path` is."""
        found = SESSION_PATH.match(path)
        session = self.sessions.peek(found.group(1)) if found else None
        return session is not None and bears(headers, session.api_key)

    # -- helpers
    def session_of(self, session_uuid: str) -> SessionState:
        session = self.sessions.get(session_uuid)
        if session is None:
            raise HTTPException(404, f"Session {session_uuid} not found")
        return session

    def select_server(self, base_url: str | None) -> Any:
        """The backend `base_url` names, else the healthy one with the most free slots."""
        servers = list(self.server_manager.servers)
        if base_url is not None:
            for server in servers:
                url = _base_url(server)
                if url and url.rstrip("/") == base_url.rstrip("/"):
                    return server
            raise HTTPException(
                404, f"No server with base_url '{base_url}' (GET /servers lists them)"
            )
        healthy = [s for s in servers if getattr(s, "server_healthy", True)] or servers
        return max(healthy, key=lambda s: s.free_slots("train") if hasattr(s, "free_slots") else 0)

    def managed_for(self, server: Any, request: SessionCreateRequest, session_uuid: str) -> Any:
        if getattr(server, "token_ids_supported", True):
            try:
                return ManagedServer(
                    server,
                    self.tokenizer,
                    track_tree=request.track_tree,
                    tool_parser=request.tool_parser,
                    token_budget=self.limits.session_token_budget,
                )
            except ValueError as exc:  # an unknown tool parser names the known ones
                raise HTTPException(400, str(exc)) from exc
        logger.info(
            "session %s: %s gives no token ids or logprobs; its nodes hold placeholders",
            session_uuid,
            _base_url(server),
        )
        return DummyManagedServer(server=server, tokenizer=self.tokenizer)

    # -- endpoints
    async def health(self) -> dict[str, Any]:
        servers = list(self.server_manager.servers)
        return {
            "status": "ok",
            "model": self.model_name,
            "sessions": len(self.sessions),
            "servers": len(servers),
            "healthy_servers": sum(bool(getattr(s, "server_healthy", True)) for s in servers),
        }

    async def list_models(self) -> dict[str, Any]:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "atropos",
        }
        return {"object": "list", "data": [card]}

    async def setup(self, request: Request) -> dict[str, Any]:
        """Replace the backends, as upstream: the body is the --config JSON's shape. A
        server it names gets the key the body gives it, never one of this process's."""
        try:
            config = await request.json()
            configs = servers_from_config(config)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise HTTPException(400, f"invalid setup body: {exc}") from exc
        if configs:
            from atroposlib.envs.server_handling.server_manager import ServerManager

            servers = ServerManager(configs=configs).servers
            for server in servers:
                server.inherits_environment_keys = False
            self.server_manager.servers = servers
            logger.info("setup: %d backends", len(configs))
        return {
            "status": "ok",
            "servers": len(self.server_manager.servers),
            "model_name": config.get("model_name", self.model_name),
        }

    async def list_servers(self) -> dict[str, Any]:
        listed = []
        for index, server in enumerate(self.server_manager.servers):
            config = getattr(server, "config", None)
            listed.append(
                {
                    "index": index,
                    "base_url": _base_url(server),
                    "healthy": getattr(server, "server_healthy", True),
                    "model_name": getattr(config, "model_name", self.model_name),
                    "server_type": getattr(config, "server_type", "unknown"),
                }
            )
        return {"servers": listed}

    async def create_session(self, request: SessionCreateRequest) -> dict[str, Any]:
        """Upstream's SessionCreateResponse, plus `api_key` (the session's own bearer)
        when the proxy has a key."""
        session_uuid = str(uuid_lib.uuid4())
        server = self.select_server(request.base_url)
        session = SessionState(
            uuid=session_uuid,
            managed_server=self.managed_for(server, request, session_uuid),
            translator=ToolCallTranslator(self.tokenizer, request.tool_parser),
            model_name=self.model_name,
            base_url=_base_url(server),
            api_key=secrets.token_urlsafe(32) if self.api_key else None,
        )
        try:
            self.sessions.add(session)
        except SessionsFull as exc:
            raise HTTPException(429, str(exc)) from exc
        answer = SessionCreateResponse(
            uuid=session_uuid,
            model_name=self.model_name,
            tool_parser=request.tool_parser,
            base_url=session.base_url,
            created_at=session.created_at,
        ).model_dump()
        if session.api_key is not None:
            answer["api_key"] = session.api_key
        return answer

    async def list_sessions(self) -> dict[str, Any]:
        return {
            "sessions": [
                {
                    "uuid": s.uuid,
                    "model_name": s.model_name,
                    "base_url": s.base_url,
                    "created_at": s.created_at,
                    "last_accessed": s.last_accessed,
                    "num_nodes": len(_nodes(s.managed_server)),
                }
                for s in self.sessions
            ]
        }

    async def chat_completions(
        self, session_uuid: str, request: ChatCompletionProxyRequest
    ) -> dict[str, Any] | JSONResponse:
        session = self.session_of(session_uuid)
        if not request.messages:
            return openai_error(400, "messages must not be empty")
        if request.stream:
            return openai_error(400, "stream is not supported by the proxy; send stream=false")
        async with session.lock:
            left = self.sessions.tokens_left(session)
            if left <= 0:
                return openai_error(
                    400,
                    f"session {session_uuid} has spent its budget of "
                    f"{self.limits.session_token_budget} tokens (--session-token-budget)",
                )
            try:
                result = await session.managed_server.chat_completion(
                    **completion_kwargs(request, left)
                )
            except TokenBudgetSpent as exc:
                return openai_error(
                    400,
                    f"session {session_uuid} has too little left of its budget of "
                    f"{self.limits.session_token_budget} tokens (--session-token-budget) "
                    f"for this request: {exc}",
                )
            except Exception as exc:
                # the details (backend addresses, its own words) go to the log, not to
                # the agent, which holds no more than its session's key (PRX-5)
                return backend_failure(session_uuid, session.base_url, exc)
        return {
            "id": f"chatcmpl-{uuid_lib.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice_body(choice) for choice in result.choices],
        }

    async def render(
        self, session_uuid: str, request: ChatCompletionProxyRequest
    ) -> RenderResponse | JSONResponse:
        """The prompt the session's next request would send, and its token ids."""
        managed = self.session_of(session_uuid).managed_server
        try:
            messages = [m.as_dict() for m in request.messages]
            prompt = managed._convert_messages_to_prompt(messages, request.tools)
        except Exception as exc:
            return openai_error(400, f"Failed to render prompt: {exc}")
        token_ids = (
            managed._encode(prompt, fresh=True)
            if hasattr(managed, "_encode")
            else list(self.tokenizer.encode(prompt, add_special_tokens=False))
        )
        return RenderResponse(prompt_text=prompt, token_ids=token_ids, num_tokens=len(token_ids))

    async def get_nodes(self, session_uuid: str) -> dict[str, Any]:
        session = self.session_of(session_uuid)
        return {"nodes": [node.model_dump() for node in _nodes(session.managed_server)]}

    async def delete_session(self, session_uuid: str) -> dict[str, str]:
        session = self.sessions.pop(session_uuid)
        if session is None:
            raise HTTPException(404, f"Session {session_uuid} not found")
        session.managed_server.reset()
        return {"status": "deleted", "uuid": session_uuid}


def backend_failure(session_uuid: str, base_url: str | None, exc: Exception) -> JSONResponse:
    """The agent's answer when the backend failed; what failed is logged."""
    if is_unreachable(exc):
        logger.warning("session %s: %s cannot be reached: %s", session_uuid, base_url, exc)
        return openai_error(
            503, "the inference server cannot be reached", error_type="server_error"
        )
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status < 500:
        logger.warning("session %s: %s refused a request: %s", session_uuid, base_url, exc)
        return openai_error(status, f"the inference server refused the request ({status})")
    logger.exception("completion failed in session %s", session_uuid)
    return openai_error(
        500, "the completion failed; the proxy's log says why", error_type="server_error"
    )


def completion_kwargs(request: ChatCompletionProxyRequest, tokens_left: int) -> dict[str, Any]:
    """ManagedServer.chat_completion's arguments; max_tokens cut to the session's budget."""
    n = max(request.n, 1)
    kwargs: dict[str, Any] = {
        "messages": [m.as_dict() for m in request.messages],
        "n": request.n,
        "max_tokens": max(1, min(request.token_limit(), tokens_left // n)),
        "temperature": request.temperature,
    }
    optional = {
        "stop": [request.stop] if isinstance(request.stop, str) else request.stop,
        "tools": request.tools,
        "tool_choice": request.tool_choice,
        "top_p": request.top_p,
        "seed": request.seed,
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    return kwargs


def choice_body(choice: Any) -> dict[str, Any]:
    """One choice as upstream answers it (tool calls as plain dicts)."""
    message: dict[str, Any] = {"role": choice.message.role, "content": choice.message.content}
    if choice.message.tool_calls:
        message["tool_calls"] = [dict(call) for call in choice.message.tool_calls]
    return {"index": choice.index, "message": message, "finish_reason": choice.finish_reason}


def create_app(
    server_manager: Any,
    tokenizer: Any,
    model_name: str = "unknown",
    limits: SessionLimits | None = None,
    api_key: str | None = None,
    allowed_hosts: frozenset[str] = frozenset(),
) -> FastAPI:
    """The proxy's FastAPI app over `server_manager`'s backends (see the module docstring).
    `allowed_hosts`: Host names, besides localhost and IP addresses, a keyless proxy
    answers."""
    service = ProxyService(
        server_manager, tokenizer, model_name, limits or SessionLimits(), api_key
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.get_running_loop().create_task(reap_idle_sessions(service.sessions))
        try:
            yield
        finally:
            reaper.cancel()

    app = FastAPI(title="ManagedServer OpenAI Proxy", lifespan=lifespan)
    app.state.proxy = service
    app.add_middleware(
        RequestGuard,
        api_key=api_key,
        max_body_bytes=CHAT_MAX_BODY_BYTES,
        max_body_values=CHAT_MAX_BODY_VALUES,
        allowed_hosts=allowed_hosts,
        open_paths=frozenset({"/health"}),
        listener="atropos-proxy",
        also_authorized=service.session_key_opens,
    )
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    routes: list[tuple[str, str, Callable[..., Any]]] = [
        ("GET", "/health", service.health),
        ("GET", "/v1/models", service.list_models),
        ("POST", "/setup", service.setup),
        ("GET", "/servers", service.list_servers),
        ("POST", "/sessions/create", service.create_session),
        ("GET", "/sessions", service.list_sessions),
        ("POST", "/{session_uuid}/v1/chat/completions", service.chat_completions),
        ("POST", "/{session_uuid}/v1/chat/completions/render", service.render),
        ("GET", "/{session_uuid}/nodes", service.get_nodes),
        ("DELETE", "/{session_uuid}", service.delete_session),
    ]
    for method, path, endpoint in routes:
        app.add_api_route(path, endpoint, methods=[method], response_model=None)
    return app


async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
    return openai_error(exc.status_code, str(exc.detail))


async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
        for e in exc.errors()
    )
    return openai_error(400, f"invalid request: {problems}")


def _nodes(managed: Any) -> list[Any]:
    """A session's recorded nodes: its sequences in tree mode, its nodes otherwise."""
    state = managed.get_state()
    return list(state["sequences"].values()) if "sequences" in state else list(state["nodes"])


def main(argv: list[str] | None = None) -> int:
    """Upstream's `python -m` entry point: `atropos-proxy`'s flags."""
    from atroposlib.envs.server_handling.proxy_cli import main as run

    return run(argv)


if __name__ == "__main__":
    raise SystemExit(main())
