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

Everything else is run-api's guard (`atroposlib.utils.request_guard.RequestGuard`), so
vLLM's listener answers the same attacks as every other listener of a run, in the same
error shape: a POST must be JSON (the trainer's bodiless `/pause` says so too), a
browser's cross-site request is refused, bodies are bounded in bytes, values and depth
before vLLM parses them, and with no engine key the sampling routes answer only
requests addressed to localhost or an IP address (DNS rebinding).

This module and the guard import only what vLLM itself depends on (starlette, pydantic):
they run inside vLLM's interpreter, which has nothing else of atroposlib's
(`guard_launch_extras` puts the project on its PYTHONPATH).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from typing import Any

from atroposlib.utils.request_guard import CHAT_MAX_BODY_BYTES, CHAT_MAX_BODY_VALUES, RequestGuard

KEY_VARIABLES = ("ATROPOS_WEIGHT_SYNC_KEY",)
SAMPLING_KEY_VARIABLES = ("VLLM_API_KEY", "ATROPOS_ENGINE_API_KEY")
SYNC_KEY_HEADER = "X-Weight-Sync-Key"
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics", "/tokenize", "/detokenize"})
VLLM_GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")  # vLLM's --api-key covers them
WEIGHT_ROUTES_UNDER_V1 = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")
MIDDLEWARE = f"{__name__}.WeightRouteGuard"
UNAUTHORIZED = (
    "missing or wrong key: vLLM's weight routes need the engine's weight-sync key "
    "(Authorization: Bearer KEY, or X-Weight-Sync-Key: KEY), its sampling routes its API key"
)

Scope = dict[str, Any]


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
    """Two RequestGuards on vLLM's app: keyed by the sync key (and, on the sampling
    routes, the engine key), and, when there is no engine key, a keyless one for the
    sampling routes, which vLLM then leaves open."""

    def __init__(self, app: Any) -> None:
        sync_digests = _digests(KEY_VARIABLES)
        sampling_digests = _digests(SAMPLING_KEY_VARIABLES)

        def opens(path: str, headers: dict[bytes, bytes]) -> bool:
            scheme, _, bearer = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            if scheme.lower() != "bearer":
                bearer = ""
            offered = (bearer, headers.get(SYNC_KEY_HEADER.lower().encode(), b"").decode("latin-1"))
            if any(_known(key, sync_digests) for key in offered):
                return True
            return sampling(path) and _known(bearer, sampling_digests)

        def guard(key: str | None) -> RequestGuard:
            return RequestGuard(
                app,
                key,
                max_body_bytes=CHAT_MAX_BODY_BYTES,
                max_body_values=CHAT_MAX_BODY_VALUES,
                open_paths=OPEN_PATHS,
                listener="vLLM",
                also_authorized=opens,
                unauthorized_message=UNAUTHORIZED,
            )

        # with no sync key every guarded route stays closed: a key nobody holds
        self.keyed = guard(os.environ.get(KEY_VARIABLES[0]) or secrets.token_urlsafe(32))
        self.keyless_sampling = None if sampling_digests else guard(None)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        if self.keyless_sampling is not None and sampling(path):
            return await self.keyless_sampling(scope, receive, send)
        return await self.keyed(scope, receive, send)


def _digests(variables: tuple[str, ...]) -> list[bytes]:
    keys = [os.environ.get(name) for name in variables]
    return [hashlib.sha256(key.encode()).digest() for key in keys if key]


def _known(key: str, digests: list[bytes]) -> bool:
    if not key:
        return False
    digest = hashlib.sha256(key.encode()).digest()
    return any(hmac.compare_digest(digest, known) for known in digests)
