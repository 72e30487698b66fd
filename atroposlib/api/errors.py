"""How the API answers each refusal: one table from exception to status, counter and
headers, so every route refuses the same way and the table reads as the API's policy.

A refusal is counted under `rejected_<reason>` and answered `{"detail": ...}`; the ones
a client should retry (a full queue, a failed store) carry `Retry-After`.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from atroposlib.api.refusals import (
    InvalidGroups,
    QueueFull,
    RunConflict,
    StepConflict,
    StoreWriteError,
    UnknownEnv,
)
from atroposlib.api.service import ApiService

logger = logging.getLogger("atroposlib.api")


@dataclass(frozen=True)
class Refusal:
    """How one kind of exception is answered."""

    status: int
    reason: str  # the rejected_<reason> counter
    retry: bool = False  # send Retry-After (settings.retry_after_s)
    log: str | None = None  # log the exception at ERROR with this prefix
    detail: Callable[[Exception], object] = str


def store_failed(exc: Exception) -> str:
    return f"the durable store failed: {exc}"


def invalid_groups(exc: Exception) -> object:
    assert isinstance(exc, InvalidGroups)
    return exc.errors


REFUSALS: dict[type[Exception], Refusal] = {
    InvalidGroups: Refusal(422, "invalid", detail=invalid_groups),
    QueueFull: Refusal(503, "queue_full", retry=True),
    UnknownEnv: Refusal(404, "unknown_env"),
    StepConflict: Refusal(409, "conflict", log="refused"),
    RunConflict: Refusal(409, "conflict", log="refused"),
    StoreWriteError: Refusal(503, "store_error", retry=True),  # RunState logs it, once a cause
    sqlite3.Error: Refusal(503, "store_error", retry=True, log="store error", detail=store_failed),
    OSError: Refusal(503, "store_error", retry=True, log="store error", detail=store_failed),
}


def validation_answer(exc: ValidationError, prefix: tuple = ("body",)) -> JSONResponse:
    """A pydantic error on a body the route read itself, in FastAPI's 422 format."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    detail = [{**e, "loc": [*prefix, *e["loc"]]} for e in errors]
    return JSONResponse({"detail": detail}, status_code=422)


def refusal_handler(
    service: ApiService, refusal: Refusal
) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def answer(_: Request, exc: Exception) -> Response:
        service.reject(refusal.reason)
        if refusal.log:
            logger.error("%s: %s", refusal.log, exc)
        headers = {"Retry-After": str(service.settings.retry_after_s)} if refusal.retry else None
        return JSONResponse(
            {"detail": refusal.detail(exc)}, status_code=refusal.status, headers=headers
        )

    return answer


async def request_invalid(_: Request, exc: Exception) -> Response:
    """FastAPI's 422, also when the echoed input is NaN or Infinity (which JSON cannot
    carry): the error is then sent without its input."""
    assert isinstance(exc, RequestValidationError)
    detail = jsonable_encoder(exc.errors())
    try:
        return JSONResponse({"detail": detail}, status_code=422)
    except ValueError:
        stripped = [{k: v for k, v in e.items() if k not in ("input", "ctx")} for e in detail]
        return JSONResponse({"detail": stripped}, status_code=422)


def http_error_handler(routes: list[Route]) -> Callable[[Request, Exception], Awaitable[Response]]:
    """Starlette's 405 names the methods of the first route on the path only; a path
    served by two routes (GET and POST /reset_data) must list both in Allow."""

    async def answer(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code != 405:
            return await http_exception_handler(request, exc)
        path = request.url.path
        allowed = sorted({m for r in routes if r.path == path for m in r.methods or ()})
        headers = {"Allow": ", ".join(allowed)}
        return JSONResponse({"detail": exc.detail}, status_code=405, headers=headers)

    return answer


def install_error_handlers(app: FastAPI, service: ApiService, routes: list[Route]) -> None:
    app.add_exception_handler(RequestValidationError, request_invalid)
    for exception, refusal in REFUSALS.items():
        app.add_exception_handler(exception, refusal_handler(service, refusal))
    app.add_exception_handler(StarletteHTTPException, http_error_handler(routes))
