"""The trajectory API's app: the routes of docs/api.md over a `RunState`.

`create_app` assembles, and reads like a table of contents: the service (settings, run
state, metrics) opened by the app's lifespan, one router per area (`routes`), the
refusal table (`errors`), then the request guard (`middleware`).

The module-level `app` (upstream's `uvicorn atroposlib.api.server:app`) is built on
first access, from `settings_from_environment()`, so importing `create_app` builds
nothing; the store itself opens only when an app starts serving.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.routing import Route

from atroposlib.api.errors import install_error_handlers
from atroposlib.api.middleware import OPEN_PATHS, document_guard
from atroposlib.api.routes import ENVIRONMENT_PATHS, ROUTERS
from atroposlib.api.service import ApiService
from atroposlib.api.settings import APISettings, settings_from_environment
from atroposlib.utils.request_guard import RequestGuard, bears


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
    routers = [routes(service) for routes in ROUTERS]
    for router in routers:
        app.include_router(router)
    # FastAPI keeps an included router whole, so the served routes are read from the
    # routers themselves (and the app's own: /openapi.json, /docs)
    served = [r for r in app.routes if isinstance(r, Route)]
    served += [r for router in routers for r in router.routes if isinstance(r, Route)]
    install_error_handlers(app, service, served)
    guard(app, service, served)
    return app


def guard(app: FastAPI, service: ApiService, routes: list[Route]) -> None:
    """The key, body limits, allowed hosts and content types (atroposlib/utils/request_guard.py)."""
    settings = service.settings
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
        known_paths=frozenset(route.path for route in routes),
        json_paths=frozenset(route.path for route in routes if "POST" in (route.methods or ())),
        allowed_hosts=frozenset(name.lower() for name in settings.allowed_hosts),
        open_paths=OPEN_PATHS,
        also_authorized=environment_key(settings.env_api_key),
    )


def environment_key(key: str | None) -> Callable[[str, dict[bytes, bytes]], bool] | None:
    """The environments' key, which opens ENVIRONMENT_PATHS only (keys by role)."""
    if not key:
        return None

    def opens(path: str, headers: dict[bytes, bytes]) -> bool:
        return path in ENVIRONMENT_PATHS and bears(headers, key)

    return opens


_app: FastAPI | None = None


def __getattr__(name: str) -> Any:
    global _app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _app is None:
        _app = create_app(settings_from_environment())
    return _app
