"""HTTP layer of the trajectory API: routes of PROTOCOL.md over a `RunState`.

Handlers stay thin: parse, call one `RunState` method, answer. Scored data is
parsed and validated straight from bytes by pydantic (in Rust), and batches are
answered with pre-serialised group JSON joined together, so neither direction
builds Python objects for tokens.

The module-level `app` (upstream's `uvicorn atroposlib.api.server:app`) is built on
first access, from `settings_from_environment()`, so importing `create_app` builds
nothing; the store itself opens only when an app starts serving.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Body, FastAPI, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from atroposlib.api.long_poll import NO_BATCH, Arrivals, requested_wait
from atroposlib.api.metrics import ApiMetrics
from atroposlib.api.middleware import RequestGuard, document_guard
from atroposlib.api.models import (
    INVALID,
    INVALID_ON_PLAIN_TEXT,
    STORE_FAILED,
    group_schema,
    json_body,
    refusal,
)
from atroposlib.api.settings import APISettings, settings_from_environment
from atroposlib.api.state import (
    InvalidGroups,
    QueueFull,
    RunConflict,
    RunState,
    StepConflict,
    StoreWriteError,
    UnknownEnv,
)
from atroposlib.api.store import open_store
from atroposlib.protocol import EnvIdentifier, RegisterEnv, Registration, read_groups_json

logger = logging.getLogger("atroposlib.api")

JSON = "application/json"

ENV_ID_QUERY = {
    "parameters": [
        {
            "name": "env_id",
            "in": "query",
            "required": True,
            "schema": {"type": "integer", "minimum": 0},
            "description": "The id /register-env gave. (Atropos's own env client sends it as "
            'a JSON body {"env_id": N} on this GET instead; that is read when the query '
            "has none.)",
        }
    ]
}
"""`/status-env`'s documented parameter; the route itself also reads the body form."""


class ApiService:
    """What the routes share: settings, the run state and its metrics (set at start-up)."""

    def __init__(self, settings: APISettings) -> None:
        self.settings = settings
        self.state: RunState | None = None
        self.metrics: ApiMetrics | None = None

    def start(self) -> None:
        store = open_store(self.settings.state_dir, self.settings.ephemeral)
        self.state = RunState(
            store,
            max_queued_sequences=self.settings.max_queued_sequences,
            idempotency_ttl_s=self.settings.idempotency_ttl_s,
            env_timeout_s=self.settings.env_timeout_s,
        )
        self.metrics = ApiMetrics(self.state)
        where = "memory (ephemeral)" if store.kind == "memory" else self.settings.state_dir
        logger.info("trajectory API store: %s", where)

    def stop(self) -> None:
        if self.state is not None:
            self.state.store.close()

    def observe(self, path: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.latency.labels(path).observe(seconds)


def _validation_answer(exc: ValidationError, prefix: tuple = ("body",)) -> JSONResponse:
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    detail = [{**e, "loc": [*prefix, *e["loc"]]} for e in errors]
    return JSONResponse({"detail": detail}, status_code=422)


def create_app(settings: APISettings | None = None) -> FastAPI:
    """The API over `settings` (default: `run-api`'s); its store opens at start-up."""
    settings = (settings or APISettings()).resolved()
    service = ApiService(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.start()
        try:
            yield
        finally:
            service.stop()

    app = FastAPI(title="AtroposLib API", lifespan=lifespan)

    def state() -> RunState:
        assert service.state is not None, "the API has not started"
        return service.state

    def reject(reason: str) -> None:
        state().counters[f"rejected_{reason}"] += 1

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = jsonable_encoder(exc.errors())
        try:
            return JSONResponse({"detail": detail}, status_code=422)
        except ValueError:  # the echoed input was NaN or Infinity, which JSON cannot carry
            drop = ("input", "ctx")
            stripped = [{k: v for k, v in e.items() if k not in drop} for e in detail]
            return JSONResponse({"detail": stripped}, status_code=422)

    @app.exception_handler(InvalidGroups)
    async def _invalid(_: Request, exc: InvalidGroups) -> JSONResponse:
        reject("invalid")
        return JSONResponse({"detail": exc.errors}, status_code=422)

    @app.exception_handler(QueueFull)
    async def _full(_: Request, exc: QueueFull) -> JSONResponse:
        reject("queue_full")
        headers = {"Retry-After": str(settings.retry_after_s)}
        return JSONResponse({"detail": str(exc)}, status_code=503, headers=headers)

    @app.exception_handler(UnknownEnv)
    async def _unknown_env(_: Request, exc: UnknownEnv) -> JSONResponse:
        reject("unknown_env")
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(StepConflict)
    @app.exception_handler(RunConflict)
    async def _conflict(_: Request, exc: Exception) -> JSONResponse:
        reject("conflict")
        logger.error("refused: %s", exc)
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(StoreWriteError)
    async def _store_write_failed(_: Request, exc: StoreWriteError) -> JSONResponse:
        reject("store_error")  # logged by RunState, once per distinct cause
        headers = {"Retry-After": str(settings.retry_after_s)}
        return JSONResponse({"detail": str(exc)}, status_code=503, headers=headers)

    @app.exception_handler(sqlite3.Error)
    @app.exception_handler(OSError)
    async def _store_error(_: Request, exc: Exception) -> JSONResponse:
        logger.error("store error: %s", exc)
        reject("store_error")
        headers = {"Retry-After": str(settings.retry_after_s)}
        return JSONResponse(
            {"detail": f"the durable store failed: {exc}"}, status_code=503, headers=headers
        )

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"message": "AtroposLib API"}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        s = state()
        return {"status": "ok", "store": s.store.kind, "registered": s.registration is not None}

    conflict = refusal("Another run owns this API's state; the message says what to do.")

    @app.post("/register", responses={**INVALID, 409: conflict, **STORE_FAILED})
    async def register(registration: Registration) -> dict[str, int]:
        return state().register(registration)

    @app.post("/register-env", responses={**INVALID, **STORE_FAILED})
    async def register_env(request: RegisterEnv) -> dict[str, Any]:
        return state().register_env(request)

    @app.post("/disconnect-env", responses={**INVALID, **STORE_FAILED})
    async def disconnect_env(env: EnvIdentifier) -> dict[str, str]:
        return state().disconnect_env(env.env_id)

    async def accept(request: Request, as_list: bool) -> Response:
        body = await request.body()
        try:
            groups, verbatim = read_groups_json(body, as_list)
        except ValidationError as exc:
            reject("invalid")
            return _validation_answer(exc)
        answer = state().accept(
            groups,
            as_list=as_list,
            idempotency_key=request.headers.get("idempotency-key"),
            raw=body if verbatim and not as_list else None,
        )
        arrivals.notify()
        return Response(answer, media_type=JSON)

    posted = {
        200: {"description": "Queued, or held in its env's buffer until a full group."},
        **INVALID,
        503: refusal(
            "The queue is full (--max-queued-sequences) or the store failed; retry later.",
            headers=STORE_FAILED[503]["headers"],
        ),
    }

    @app.post("/scored_data", responses=posted, openapi_extra=json_body(group_schema()))
    async def scored_data(request: Request) -> Response:
        return await accept(request, as_list=False)

    @app.post(
        "/scored_data_list",
        responses=posted,
        openapi_extra=json_body({"type": "array", "items": group_schema()}),
    )
    async def scored_data_list(request: Request) -> Response:
        return await accept(request, as_list=True)

    def json_answer(answer: bytes | dict[str, Any]) -> Response:
        """Pre-serialised group JSON goes out as is; small dicts through JSONResponse."""
        if isinstance(answer, bytes):
            return Response(answer, media_type=JSON)
        return JSONResponse(answer)

    arrivals = Arrivals()
    step_conflict = refusal("No batch can be served for that step; the message says why.")

    @app.get("/batch", responses={**INVALID, 409: step_conflict, **STORE_FAILED})
    async def batch(
        request: Request,
        step: Annotated[int | None, Query(ge=1)] = None,
        committed: Annotated[int | None, Query(ge=0)] = None,
    ) -> Response:
        """`step`: lease the batch of that step (asked again, it is served again);
        `committed`: the trainer's checkpoint holds every step up to this one.
        `Prefer: wait=N` waits up to N seconds for a batch (see `long_poll`)."""
        wait_s = requested_wait(request.headers.get("prefer"))
        deadline = time.monotonic() + wait_s
        answer = state().next_batch(step, committed)
        while answer == NO_BATCH and time.monotonic() < deadline:
            await arrivals.wait(deadline - time.monotonic())
            answer = state().next_batch(step, committed)
        response = json_answer(answer)
        if wait_s:
            response.headers["Preference-Applied"] = f"wait={wait_s:g}"
        return response

    @app.get("/latest_example")
    async def latest_example() -> Response:
        return json_answer(state().latest_example())

    @app.get("/status")
    async def status() -> dict[str, Any]:
        return state().status()

    @app.get(
        "/status-env",
        responses={**INVALID, 404: refusal("No env has that env_id.")},
        openapi_extra=ENV_ID_QUERY,
    )
    async def status_env(
        request: Request,
        env_id: Annotated[int | None, Query(ge=0, include_in_schema=False)] = None,
    ) -> Response:
        if env_id is None:
            try:
                env_id = EnvIdentifier.model_validate_json(await request.body() or b"{}").env_id
            except ValidationError as exc:
                return _validation_answer(exc)
        state().heard_from(env_id)
        return JSONResponse(state().status_env(env_id))

    @app.get("/info")
    async def info() -> dict[str, int]:
        return state().info()

    @app.get("/wandb_info")
    async def wandb_info() -> dict[str, str | None]:
        return state().wandb_info()

    @app.post(
        "/reset_data",
        response_class=PlainTextResponse,
        responses={**INVALID_ON_PLAIN_TEXT, **STORE_FAILED},
    )
    async def reset_data(
        _: Annotated[dict[str, Any], Body(description="A JSON object, not read; send {}.")],
    ) -> PlainTextResponse:
        """Wipe the run: queue, kept batches, registrations. The body is not read; its JSON
        content type is what a web page cannot send (atroposlib/api/middleware.py)."""
        state().reset()
        return PlainTextResponse("Reset successful", status_code=200)

    @app.get(
        "/reset_data",
        response_class=PlainTextResponse,
        responses={**STORE_FAILED, 403: refusal("A keyed API wipes a run only on POST.")},
    )
    async def reset_data_by_get() -> Response:
        """Upstream's form. A GET is what any web page can make a browser send (an image,
        a link), so an API with a key refuses it; one without a key, as upstream's, still
        wipes the run, with a warning."""
        if settings.api_key:
            return JSONResponse(
                {"detail": "GET /reset_data is refused on an API with a key: POST it"},
                status_code=403,
            )
        logger.warning("GET /reset_data wiped the run; POST /reset_data is the safe form")
        return await reset_data({})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """Starlette's 405 names the methods of the first route on the path only; a path
        served by two routes (GET and POST /reset_data) must list both in Allow."""
        if exc.status_code == 405:
            allowed = sorted(
                {
                    m
                    for r in app.routes
                    if getattr(r, "path", None) == request.url.path
                    for m in getattr(r, "methods", None) or ()
                }
            )
            return JSONResponse(
                {"detail": exc.detail}, status_code=405, headers={"Allow": ", ".join(allowed)}
            )
        return await http_exception_handler(request, exc)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        assert service.metrics is not None
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    known = frozenset(route.path for route in app.routes if hasattr(route, "methods"))
    document_guard(app, api_key_required=bool(settings.api_key))
    if settings.gzip_responses:
        from starlette.middleware.gzip import GZipMiddleware

        app.add_middleware(GZipMiddleware, minimum_size=1000)
    app.add_middleware(
        RequestGuard,
        api_key=settings.api_key,
        max_body_bytes=settings.max_body_bytes,
        max_body_values=settings.max_body_values,
        observe=service.observe,
        known_paths=known,
        json_paths=frozenset(
            route.path for route in app.routes if "POST" in getattr(route, "methods", ())
        ),
        allowed_hosts=frozenset(name.lower() for name in settings.allowed_hosts),
    )
    return app


_app: FastAPI | None = None


def __getattr__(name: str) -> Any:
    global _app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _app is None:
        _app = create_app(settings_from_environment())
    return _app
