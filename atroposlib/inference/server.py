"""OpenAI-compatible HTTP server over `TransformersSampler` (`atropos-inference-server`).

It answers the subset of the OpenAI and vLLM APIs that environments and
trainers use, in the shapes the `openai` SDK parses: chat and text completions
with n, temperature, top_p, max_tokens, stop, seed, logprobs/top_logprobs and
vLLM's `return_tokens_as_token_ids`, token-id prompts, usage and finish
reasons, plus vLLM's `/tokenize` and `/detokenize`, and the native `/generate`
(token ids, per-token and prompt logprobs) and `/health_generate` that Atropos's
`VLLMServer` client and node watcher call. Errors use OpenAI's error body,
`{"error": {"message", "type", "param", "code"}}`.

Request parsing lives in `openai_requests` and `generate_requests`, answer
shapes there and in `atroposlib.utils.openai_shapes`, all pure and tested
without a model; the route handlers (`routes`, one router per area) only parse,
submit to the scheduler and build the answer, so every route samples through the
same batches. `create_inference_app` assembles them, as run-api's `create_app` does.

Every request passes run-api's guard (`atroposlib.utils.request_guard`): JSON posts,
bounded bodies, no other site's page, and without a key only a local Host. With an
`api_key`, every route but `/health` needs `Authorization: Bearer <key>` (stricter than
vLLM, whose key guards only `/v1`): `/generate`, `/tokenize` and `/metrics` cost or
reveal as much as the OpenAI routes. The weight routes
(hot reload, `weight_info`) are in `atroposlib.weight_sync.disk_routes`; every choice carries vLLM's
`weight_versions` once the engine has a version.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from atroposlib.inference.openai_requests import OpenAIError, error_body, validation_error_body
from atroposlib.inference.routes import ROUTERS, EngineService
from atroposlib.inference.sampler import TransformersSampler
from atroposlib.utils.request_guard import (
    CHAT_MAX_BODY_BYTES,
    CHAT_MAX_BODY_VALUES,
    RequestGuard,
)
from atroposlib.weight_sync.disk_routes import install_weight_routes, sync_key_opens_reload

OPEN_PATHS = frozenset({"/health"})
"""What a launcher or load balancer may poll without the key."""


def _install_error_handlers(app: FastAPI) -> None:
    """Every refusal, ours or pydantic's, must reach the client in OpenAI's error body."""

    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.message, exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error_body(exc.errors()), status_code=400)


def create_inference_app(
    engine: TransformersSampler,
    served_model_name: str,
    max_batch_rows: int = 64,
    api_key: str | None = None,
    weight_sync_key: str | None = None,
    allowed_hosts: frozenset[str] = frozenset(),
) -> FastAPI:
    """The engine's app: its routers (`routes.ROUTERS`) and the weight routes, behind
    run-api's guard; the batch scheduler starts with the app."""
    service = EngineService(engine, served_model_name, max_batch_rows)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.start()
        try:
            yield
        finally:
            service.close()

    app = FastAPI(title="atroposlib inference server", lifespan=lifespan)
    _install_error_handlers(app)
    app.add_middleware(
        RequestGuard,
        api_key=api_key,
        max_body_bytes=CHAT_MAX_BODY_BYTES,
        max_body_values=CHAT_MAX_BODY_VALUES,
        open_paths=OPEN_PATHS,
        also_authorized=sync_key_opens_reload(weight_sync_key),
        allowed_hosts=allowed_hosts,
        listener="the engine",
    )
    install_weight_routes(app, engine, weight_sync_key)
    for router in ROUTERS:
        app.include_router(router(service))
    return app
