"""The CPU engine's weight routes: hot reload from disk and the served weight version.

Design decisions:
- `POST /update_weights_from_disk` takes SGLang's body (`model_path`,
  `weight_version`) and answers `{"success", "message", ...}` like SGLang;
  `GET /weight_info` answers `{"weight_version"}` like vLLM's RL routes. A
  trainer that already drives either engine drives this one unchanged.
- Replacing the weights is the one route that can ruin a run, so it has a key
  of its own (`--weight-sync-key`, $ATROPOS_WEIGHT_SYNC_KEY): the trainer that
  owns the engine holds it and environments, which only sample, never see it.
  The engine's `--api-key`, which every environment holds, never opens it (keys by
  role, ENG-A of the security review): without a sync key the route refuses (403)
  rather than let anyone who can sample swap the model.
- The load runs on a worker thread and waits for the round in flight
  (`TransformersSampler.load_weights`), so no request fails or mixes weights; the
  event loop keeps answering meanwhile.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable
from typing import Literal, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atroposlib.utils.request_guard import bears
from atroposlib.weight_sync.disk_reload import WeightLoadError


class ReloadableEngine(Protocol):
    """What the routes need of an engine: its weights' label, and a reload that waits
    for the round in flight (the CPU engine's `TransformersSampler`)."""

    weight_version: str | None

    def load_weights(self, path: str, weight_version: str | None = None) -> None: ...


RELOAD_PATH = "/update_weights_from_disk"
WEIGHT_SYNC_KEY_ENVIRONMENT = "ATROPOS_WEIGHT_SYNC_KEY"
"""Where atropos-inference-server reads its weight sync key (the trainer sets it)."""
WEIGHT_VERSION_ENVIRONMENT = "ATROPOS_WEIGHT_VERSION"
"""Where it reads the label of the weights it starts on (the trainer sets the step)."""
DISABLED_MESSAGE = (
    "weight reload is off on this engine: start it with --weight-sync-key "
    "(or $ATROPOS_WEIGHT_SYNC_KEY); its --api-key opens sampling only"
)


class UpdateWeightsFromDisk(BaseModel):
    """SGLang's request body, minus what this engine cannot honour."""

    model_config = ConfigDict(extra="forbid")

    model_path: str = Field(..., min_length=1, description="save_pretrained directory to load.")
    weight_version: str | None = Field(None, description="Label the new weights carry.")
    load_format: Literal["auto", "safetensors", "pt"] | None = Field(
        None, description="Accepted for SGLang clients; the files found decide."
    )
    abort_all_requests: Literal[False] = Field(
        False, description="Requests in flight always finish on the old weights here."
    )


RELOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": UpdateWeightsFromDisk.model_json_schema()}},
    }
}


def _refusal(status: int, message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message}, status_code=status)


def sync_key_opens_reload(sync_key: str | None) -> Callable[[str, dict[bytes, bytes]], bool]:
    """For the engine's request guard: the sync key gets a request to RELOAD_PATH past
    the api-key check (the route checks it again, and the api key there is refused)."""

    def opens(path: str, headers: dict[bytes, bytes]) -> bool:
        return path == RELOAD_PATH and bears(headers, sync_key)

    return opens


def install_weight_routes(app: FastAPI, engine: ReloadableEngine, sync_key: str | None) -> None:
    """Add the routes; the reload takes `sync_key` alone (none: the reload is off)."""
    expected = f"Bearer {sync_key}".encode() if sync_key else None

    @app.get("/weight_info")
    async def weight_info() -> dict[str, str | None]:
        return {"weight_version": engine.weight_version}

    @app.post(RELOAD_PATH, openapi_extra=RELOAD_BODY)
    async def update_weights_from_disk(request: Request) -> JSONResponse:
        # the key first, then the body: an unauthenticated caller learns nothing of its
        # schema (a FastAPI body parameter would be parsed before this function runs)
        if expected is None:
            return _refusal(403, DISABLED_MESSAGE)
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return _refusal(401, "missing or wrong weight sync key")
        try:
            body = UpdateWeightsFromDisk.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError(
                [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
            ) from None
        started = time.perf_counter()
        try:
            await asyncio.to_thread(engine.load_weights, body.model_path, body.weight_version)
        except WeightLoadError as exc:
            return _refusal(400, f"weights not loaded, the old ones still serve: {exc}")
        return JSONResponse(
            {
                "success": True,
                "message": f"loaded {body.model_path}",
                "weight_version": engine.weight_version,
                "seconds": time.perf_counter() - started,
            }
        )
