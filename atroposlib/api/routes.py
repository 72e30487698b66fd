"""The API's routes, one router per area, each a thin handler over `RunState`.

Handlers parse, call one `RunState` method and answer. Scored data is parsed and
validated straight from bytes by pydantic (in Rust), and batches go out as the stored,
pre-serialised group JSON joined together, so neither direction builds Python objects
for tokens. Refusals are exceptions that `errors.REFUSALS` answers.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError

from atroposlib.api.errors import validation_answer
from atroposlib.api.intake import read_groups_json
from atroposlib.api.long_poll import NO_BATCH, requested_wait
from atroposlib.api.models import (
    INVALID,
    INVALID_ON_PLAIN_TEXT,
    STORE_FAILED,
    Responses,
    group_schema,
    json_body,
    refusal,
)
from atroposlib.api.service import ApiService
from atroposlib.protocol import ENV_PROGRESS_FIELDS, EnvIdentifier, RegisterEnv, Registration

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


ENVIRONMENT_PATHS = frozenset(
    {
        "/register-env",
        "/disconnect-env",
        "/scored_data",
        "/scored_data_list",
        "/status-env",
        "/info",
        "/wandb_info",
    }
)
"""What an environment calls: all that run-api's environment key (`--env-api-key`)
opens. Taking batches, registering a trainer and wiping the run need the run's key."""


def json_answer(answer: bytes | dict[str, Any]) -> Response:
    """Pre-serialised group JSON goes out as is; small dicts through JSONResponse."""
    if isinstance(answer, bytes):
        return Response(answer, media_type=JSON)
    return JSONResponse(answer)


def registration_routes(service: ApiService) -> APIRouter:
    router = APIRouter()

    @router.get("/")
    async def root() -> dict[str, str]:
        return {"message": "AtroposLib API"}

    @router.get("/health")
    async def health() -> dict[str, Any]:
        s = service.state
        return {"status": "ok", "store": s.store.kind, "registered": s.registration is not None}

    conflict = refusal("Another run owns this API's state; the message says what to do.")

    @router.post("/register", responses={**INVALID, 409: conflict, **STORE_FAILED})
    async def register(registration: Registration) -> dict[str, int]:
        return service.state.register(registration)

    @router.post("/register-env", responses={**INVALID, **STORE_FAILED})
    async def register_env(request: RegisterEnv) -> dict[str, Any]:
        return service.state.register_env(request)

    @router.post("/disconnect-env", responses={**INVALID, **STORE_FAILED})
    async def disconnect_env(env: EnvIdentifier) -> dict[str, str]:
        return service.state.disconnect_env(env.env_id)

    return router


def intake_routes(service: ApiService) -> APIRouter:
    router = APIRouter()

    async def accept(request: Request, as_list: bool) -> Response:
        body = await request.body()
        try:
            groups, verbatim = read_groups_json(body, as_list)
        except ValidationError as exc:
            service.reject("invalid")
            return validation_answer(exc)
        answer = service.state.accept(
            groups,
            as_list=as_list,
            idempotency_key=request.headers.get("idempotency-key"),
            raw=body if verbatim and not as_list else None,
        )
        service.arrivals.notify()
        return Response(answer, media_type=JSON)

    posted: Responses = {
        200: {"description": "Queued, or held in its env's buffer until a full group."},
        **INVALID,
        503: refusal(
            "The queue is full (--max-queued-sequences) or the store failed; retry later.",
            headers=STORE_FAILED[503]["headers"],
        ),
    }

    @router.post("/scored_data", responses=posted, openapi_extra=json_body(group_schema()))
    async def scored_data(request: Request) -> Response:
        return await accept(request, as_list=False)

    @router.post(
        "/scored_data_list",
        responses=posted,
        openapi_extra=json_body({"type": "array", "items": group_schema()}),
    )
    async def scored_data_list(request: Request) -> Response:
        return await accept(request, as_list=True)

    return router


def batch_routes(service: ApiService) -> APIRouter:
    router = APIRouter()
    step_conflict = refusal("No batch can be served for that step; the message says why.")

    @router.get("/batch", responses={**INVALID, 409: step_conflict, **STORE_FAILED})
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
        answer = service.state.next_batch(step, committed)
        while answer == NO_BATCH and time.monotonic() < deadline:
            await service.arrivals.wait(deadline - time.monotonic())
            answer = service.state.next_batch(step, committed)
        if answer != NO_BATCH:
            service.departures.notify()  # envs held waiting for room (status_env)
        response = json_answer(answer)
        if wait_s:
            response.headers["Preference-Applied"] = f"wait={wait_s:g}"
        return response

    @router.get("/latest_example")
    async def latest_example() -> Response:
        return json_answer(service.state.latest_example())

    return router


def status_routes(service: ApiService) -> APIRouter:
    router = APIRouter()

    @router.get("/status")
    async def status() -> dict[str, Any]:
        return service.state.status()

    @router.get(
        "/status-env",
        responses={**INVALID, 404: refusal("No env has that env_id.")},
        openapi_extra=ENV_ID_QUERY,
    )
    async def status_env(
        request: Request,
        env_id: Annotated[int | None, Query(ge=0, include_in_schema=False)] = None,
        after_step: Annotated[int | None, Query(ge=0, include_in_schema=False)] = None,
        groups_sent: Annotated[int | None, Query(ge=0, include_in_schema=False)] = None,
        rollout_errors: Annotated[int | None, Query(ge=0, include_in_schema=False)] = None,
        context_refusals: Annotated[int | None, Query(ge=0, include_in_schema=False)] = None,
    ) -> Response:
        """`after_step` with `Prefer: wait=N`: answer once the trainer has taken a batch
        past that step, or after N seconds (see `long_poll`). The env's counters
        (`protocol.ENV_PROGRESS_FIELDS`) go to `/status`."""
        if env_id is None:
            try:
                env_id = EnvIdentifier.model_validate_json(await request.body() or b"{}").env_id
            except ValidationError as exc:
                return validation_answer(exc)
        given = (groups_sent, rollout_errors, context_refusals)
        progress = {
            name: n for name, n in zip(ENV_PROGRESS_FIELDS, given, strict=True) if n is not None
        }
        service.state.heard_from(env_id, progress)
        status = service.state.status_env(env_id)
        wait_s = requested_wait(request.headers.get("prefer")) if after_step is not None else 0
        deadline = time.monotonic() + wait_s
        while status["current_step"] <= (after_step or 0) and time.monotonic() < deadline:
            await service.departures.wait(deadline - time.monotonic())
            status = service.state.status_env(env_id)
        response = JSONResponse(status)
        if wait_s:
            response.headers["Preference-Applied"] = f"wait={wait_s:g}"
        return response

    @router.get("/info")
    async def info() -> dict[str, int]:
        return service.state.info()

    @router.get("/wandb_info")
    async def wandb_info() -> dict[str, str | None]:
        return service.state.wandb_info()

    return router


def reset_routes(service: ApiService) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/reset_data",
        response_class=PlainTextResponse,
        responses={**INVALID_ON_PLAIN_TEXT, **STORE_FAILED},
    )
    async def reset_data(
        _: Annotated[dict[str, Any], Body(description="A JSON object, not read; send {}.")],
    ) -> PlainTextResponse:
        """Wipe the run: queue, kept batches, registrations. The body is not read; its JSON
        content type is what a web page cannot send (atroposlib/utils/request_guard.py)."""
        service.state.reset()
        return PlainTextResponse("Reset successful", status_code=200)

    @router.get(
        "/reset_data",
        response_class=PlainTextResponse,
        responses={**STORE_FAILED, 403: refusal("A keyed API wipes a run only on POST.")},
    )
    async def reset_data_by_get() -> Response:
        """Upstream's form. A GET is what any web page can make a browser send (an image,
        a link), so an API with a key refuses it; one without a key, as upstream's, still
        wipes the run, with a warning."""
        if service.settings.api_key:
            return JSONResponse(
                {"detail": "GET /reset_data is refused on an API with a key: POST it"},
                status_code=403,
            )
        logger.warning("GET /reset_data wiped the run; POST /reset_data is the safe form")
        return await reset_data({})

    return router


def metrics_routes(service: ApiService) -> APIRouter:
    router = APIRouter()

    @router.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        assert service.metrics is not None
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    return router


ROUTERS = (
    registration_routes,
    intake_routes,
    batch_routes,
    status_routes,
    reset_routes,
    metrics_routes,
)
"""Every area's router, in the order the OpenAPI document lists them."""
