"""A key on vLLM's development routes: an ASGI middleware vLLM loads with `--middleware`.

Why: the hot weight modes need vLLM's development routes (`/collective_rpc`, `/pause`,
`/resume`, `/update_weights`, ...), and vLLM's `--api-key` guards only `/v1`, `/v2`,
`/inference` and `/cohere`. Any local user, or code in a weak sandbox, could otherwise
replace the weights, pause the engine or (in `shared_vllm`) make it unpickle posted
data. vLLM's own extension point, `--middleware module.Class`, lets us add the check
inside vLLM itself: no proxy, no extra port, no extra hop on the sampling path.

The rule: every path needs `Authorization: Bearer <key>` except the read-only probes
in `OPEN_PATHS`. The sampling prefixes vLLM's own `--api-key` guards (`/v1`, `/v2`,
`/inference`, `/cohere`) take the engine's key (`VLLM_API_KEY` or
`ATROPOS_ENGINE_API_KEY`) here too, so their guard does not depend on which of them a
given vLLM version checks (ENG-B of the security review); with no engine key they are
open, as vLLM leaves them. The LoRA load and unload routes under `/v1` change weights,
so they are weight routes. The one key is
the trainer's weight-sync key, read from the environment at start, sent as
`Authorization: Bearer KEY` or as `X-Weight-Sync-Key: KEY` (for the LoRA routes, where
vLLM's own check wants the engine key in `Authorization`); without it, every guarded
route is refused (closed, not open, by default). The engine's API key, which every
environment holds to sample, opens none of them (ENG-A of the security review).

This module imports only the standard library: it runs inside vLLM's interpreter,
which needs nothing of atroposlib's dependencies (`vllm_launch_extras` puts the
project on its PYTHONPATH).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

KEY_VARIABLES = ("ATROPOS_WEIGHT_SYNC_KEY",)
SAMPLING_KEY_VARIABLES = ("VLLM_API_KEY", "ATROPOS_ENGINE_API_KEY")
SYNC_KEY_HEADER = "X-Weight-Sync-Key"
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics", "/tokenize", "/detokenize"})
VLLM_GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")  # vLLM's --api-key covers them
WEIGHT_ROUTES_UNDER_V1 = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
MIDDLEWARE = f"{__name__}.WeightRouteGuard"

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]


def guard_launch_extras(sync_key: str) -> tuple[list[str], dict[str, str]]:
    """vLLM flags and environment that install the guard with `sync_key` as its key."""
    if not sync_key:
        raise ValueError("the weight-route guard needs a non-empty key")
    project = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    python_path = os.pathsep.join(p for p in (project, os.environ.get("PYTHONPATH")) if p)
    env = {KEY_VARIABLES[0]: sync_key, "PYTHONPATH": python_path}
    return ["--middleware", MIDDLEWARE], env


def sampling(path: str) -> bool:
    """Whether `path` is a sampling route, which the engine's key opens too."""
    return path.startswith(VLLM_GUARDED_PREFIXES) and not path.startswith(WEIGHT_ROUTES_UNDER_V1)


class WeightRouteGuard:
    """Refuses a guarded route without the weight-sync key."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.digests = _digests(KEY_VARIABLES)
        self.sampling_digests = _digests(SAMPLING_KEY_VARIABLES)

    def authorized(self, scope: Scope, path: str) -> bool:
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        bearer = token if scheme.lower() == "bearer" else ""
        offered = [bearer, headers.get(SYNC_KEY_HEADER.lower().encode(), b"").decode("latin-1")]
        if any(_known(key, self.digests) for key in offered if key):
            return True
        if sampling(path):
            return not self.sampling_digests or _known(bearer, self.sampling_digests)
        return False

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path in OPEN_PATHS or self.authorized(scope, path):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        reason = (
            "this route needs the engine's API key (Authorization: Bearer KEY)"
            if sampling(path)
            else "this route needs the engine's weight-sync key (Authorization: Bearer KEY)"
        )
        body = json.dumps({"error": "Unauthorized", "detail": reason}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _digests(variables: tuple[str, ...]) -> list[bytes]:
    keys = [os.environ.get(name) for name in variables]
    return [hashlib.sha256(key.encode()).digest() for key in keys if key]


def _known(key: str, digests: list[bytes]) -> bool:
    if not key:
        return False
    digest = hashlib.sha256(key.encode()).digest()
    return any(hmac.compare_digest(digest, known) for known in digests)
