"""A stand-in for upstream Atropos' `run-api`, to test our clients against its dialect.

Written from reading upstream's `atroposlib/api/server.py`: the same paths, lax
pydantic request models and answers, an in-memory state, `/status-env` that reads
`env_id` only from a JSON body (anything else is FastAPI's 422), and `/batch` that
builds every ready batch at once, advances the step by their number and serves the
newest first. Unknown query parameters and headers are ignored, as upstream's are;
`strict_query=True` turns it into a server that refuses them with a 422, to test
how our clients cope with a 4xx for something a server does not know. Every request
is recorded (`requests`) so tests can check what our clients actually sent.

It runs in a thread of the test process on a free 127.0.0.1 port (real HTTP).
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, field_validator

from atroposlib.api.utils import (
    find_groups_summing_to_target,
    grab_batch_with_minimum_allocations,
    grab_exact_from_heterogeneous_queue,
)
from atroposlib.utils.ports import free_port
from tests.support.waiting import wait_until

MIN_ENV_WEIGHT = 0.01


class Registration(BaseModel):
    wandb_group: str
    wandb_project: str
    batch_size: int
    max_token_len: int
    checkpoint_dir: str
    save_checkpoint_interval: int
    starting_step: int
    num_steps: int


class RegisterEnv(BaseModel):
    max_token_length: int
    desired_name: str
    weight: float
    group_size: int
    min_batch_allocation: float | None = None


class EnvIdentifier(BaseModel):
    env_id: int


class ScoredData(BaseModel):
    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: list[list[float]] | None = None
    ref_logprobs: list[list[float]] | None = None
    messages: list[list[dict[str, Any]]] | None = None
    generation_params: dict[str, Any] | None = None
    inference_logprobs: list[list[float]] | None = None
    overrides: list[dict] | None = None
    group_overrides: dict | None = None
    images: Any | None = None
    env_id: int | None = None
    distill_token_ids: list[list[list[int]]] | None = None
    distill_logprobs: list[list[list[float]]] | None = None

    @field_validator("messages", mode="before")
    @classmethod
    def _role_and_content(cls, value: Any) -> Any:
        for conversation in value or []:
            for message in conversation:
                if "role" not in message or "content" not in message:
                    raise ValueError("Message must have 'role' and 'content' fields")
        return value


@dataclass
class Recorded:
    """One request as the stand-in saw it, with its answer's status."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    status: int = 0


@dataclass
class UpstreamState:
    """Upstream keeps these on `app.state`; `registered` is its `hasattr(queue)`."""

    registered: bool = False
    started: bool = False
    queue: list[dict[str, Any]] = field(default_factory=list)
    buffer: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    envs: list[dict[str, Any]] = field(default_factory=list)
    curr_batch: list[list[dict[str, Any]]] = field(default_factory=list)
    step: int = 0
    registration: Registration | None = None
    latest: dict[str, Any] | None = None


def _accept(state: UpstreamState, group: ScoredData) -> dict[str, Any]:
    """Upstream's `_process_scored_data`: off-size groups wait in a per-env buffer."""
    data = group.model_dump()
    env_id = data["env_id"]
    if env_id is not None and env_id < len(state.envs):
        expected = state.envs[env_id]["group_size"]
        if len(group.tokens) != expected:
            buffer = state.buffer.setdefault(env_id, [])
            buffer.append(data)
            indices = find_groups_summing_to_target(buffer, expected)
            taken = [buffer.pop(i) for i in sorted(indices, reverse=True)]
            for ready in reversed(taken):
                state.queue.append(ready)
                state.latest = ready
            return {"status": "buffered", "buffer_size": sum(len(g["tokens"]) for g in buffer)}
    state.queue.append(data)
    state.latest = data
    return {"status": "received"}


def _grab(state: UpstreamState) -> list[dict[str, Any]] | None:
    batch_size = state.registration.batch_size
    if any(env.get("min_batch_allocation") is not None for env in state.envs):
        batch, state.queue = grab_batch_with_minimum_allocations(
            state.queue, batch_size, state.envs
        )
    else:
        batch, state.queue = grab_exact_from_heterogeneous_queue(state.queue, batch_size)
    return batch


def _status_env(state: UpstreamState, env_id: int) -> dict[str, Any]:
    """Upstream's queue accounting for one env (an unknown id raises, i.e. HTTP 500)."""
    envs = state.envs
    total = sum(e["max_context_len"] * max(0.0, e["weight"]) for e in envs if e["connected"])
    me = envs[env_id]
    weight = max(MIN_ENV_WEIGHT, me["max_context_len"] * me["weight"] / total)
    min_total = sum(
        e["min_batch_allocation"]
        for e in envs
        if e["connected"] and e["min_batch_allocation"] is not None
    )
    group_size, max_group, own_sequences = me["group_size"], 1, 0
    others: dict[Any, int] = {}
    for item in state.queue:
        size = len(item["tokens"])
        max_group = max(max_group, size)
        if item["env_id"] == env_id:
            group_size = max(group_size, size)
            own_sequences += size
        else:
            others[item["env_id"]] = others.get(item["env_id"], 0) + size
    me["group_size"] = group_size
    batch_size = state.registration.batch_size if state.registration else 0
    minimums = {
        e["registered_id"]: int(batch_size * e["min_batch_allocation"])
        for e in envs
        if e["connected"] and e["min_batch_allocation"] is not None
    }
    available = 0
    if max_group > 1:
        for other, sequences in others.items():
            packed = -(-sequences // max_group) * max_group
            available += max(0, packed - minimums.get(other, 0))
    return {
        "current_step": state.step,
        "queue_size": (own_sequences + available) // group_size,
        "unallocated_fraction": 1.0 - min(min_total, 1.0),
        "self_queue_size": own_sequences // group_size,
        "max_group_size": max_group,
        "env_weight": weight,
    }


def build_app(strict_query: bool = False) -> tuple[FastAPI, UpstreamState, list[Recorded]]:
    """The stand-in app, its state and its request log."""
    app = FastAPI(title="AtroposLib API")
    state = UpstreamState()
    log: list[Recorded] = []
    known_query = {"/status-env": set(), "/batch": set()}

    @app.middleware("http")
    async def record_and_gunzip(request: Request, call_next):
        body = await request.body()
        if "gzip" in request.headers.get("content-encoding", "").lower() and body:
            body = gzip.decompress(body)
            request._body = body  # what upstream's GZipRequestMiddleware hands on
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body
        entry = Recorded(
            request.method,
            request.url.path,
            dict(request.query_params),
            {k.lower(): v for k, v in request.headers.items()},
            parsed,
        )
        log.append(entry)
        unknown = set(request.query_params) - known_query.get(request.url.path, set())
        if strict_query and unknown:
            response = JSONResponse(
                {"detail": f"unknown query parameters {sorted(unknown)}"}, status_code=422
            )
        else:
            response = await call_next(request)
        entry.status = response.status_code
        return response

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"message": "AtroposLib API"}

    @app.post("/register")
    async def register(registration: Registration) -> dict[str, int]:
        if not state.registered:
            state.registered = True
            state.registration = registration
            state.step = registration.starting_step
        return {"uuid": uuid.uuid4().int}

    @app.post("/register-env")
    async def register_env(env: RegisterEnv) -> dict[str, Any]:
        if not state.started:
            return {"status": "wait for trainer to start"}
        same_name = [e for e in state.envs if e["desired_name"] == env.desired_name]
        real_name = f"{env.desired_name}_{len(same_name)}"
        env_id = len(state.envs)
        state.envs.append(
            {
                "max_context_len": env.max_token_length,
                "weight": env.weight,
                "desired_name": env.desired_name,
                "real_name": real_name,
                "registered_id": env_id,
                "last_update": time.time(),
                "connected": True,
                "min_batch_allocation": env.min_batch_allocation,
                "group_size": env.group_size,
            }
        )
        reg = state.registration
        return {
            "status": "success",
            "env_id": env_id,
            "wandb_name": real_name,
            "checkpoint_dir": reg.checkpoint_dir if reg else "",
            "starting_step": state.step,
            "checkpoint_interval": reg.save_checkpoint_interval if reg else -1,
            "num_steps": reg.num_steps if reg else -1,
        }

    @app.post("/disconnect-env")
    async def disconnect_env(env: EnvIdentifier) -> dict[str, str]:
        if env.env_id >= len(state.envs):
            return {"status": "failure", "error": "list index out of range"}
        state.envs[env.env_id]["connected"] = False
        return {"status": "success"}

    @app.get("/wandb_info")
    async def wandb_info() -> dict[str, str | None]:
        reg = state.registration
        return {"group": reg and reg.wandb_group, "project": reg and reg.wandb_project}

    @app.get("/info")
    async def info() -> dict[str, int]:
        reg = state.registration
        if reg is None:
            return {"batch_size": -1, "max_token_len": -1}
        return {"batch_size": reg.batch_size, "max_token_len": reg.max_token_len}

    @app.get("/batch")
    async def batch() -> dict[str, Any]:
        if not state.registered:
            return {
                "status": "error",
                "message": "Trainer not registered. Call /register first.",
                "batch": [],
            }
        state.started = True
        if state.curr_batch:
            return {"batch": state.curr_batch.pop()}
        ready = []
        while (grabbed := _grab(state)) is not None:
            ready.append(grabbed)
        if not ready:
            return {"batch": None}
        state.step += len(ready)
        state.curr_batch.extend(ready)
        return {"batch": state.curr_batch.pop()}

    @app.get("/latest_example")
    async def latest_example() -> dict[str, Any]:
        return state.latest or {key: [] for key in ("tokens", "masks", "scores", "messages")}

    @app.post("/scored_data")
    async def scored_data(group: ScoredData) -> dict[str, Any]:
        return _accept(state, group)

    @app.post("/scored_data_list")
    async def scored_data_list(groups: list[ScoredData]) -> dict[str, Any]:
        answers = [_accept(state, group) for group in groups]
        buffered = [a for a in answers if a["status"] == "buffered"]
        answer: dict[str, Any] = {"status": "received", "groups_processed": len(groups)}
        if buffered:
            answer["buffered"] = len(buffered)
            answer["last_buffer_size"] = buffered[-1]["buffer_size"]
        return answer

    @app.get("/status")
    async def status() -> dict[str, int]:
        return {"current_step": state.step, "queue_size": len(state.queue)}

    @app.get("/status-env")
    async def status_env(env: EnvIdentifier) -> dict[str, Any]:
        return _status_env(state, env.env_id)

    @app.get("/reset_data")
    async def reset_data() -> PlainTextResponse:
        fresh = UpstreamState()
        for name in fresh.__dataclass_fields__:
            setattr(state, name, getattr(fresh, name))
        return PlainTextResponse("Reset successful")

    return app, state, log


class UpstreamAPI:
    """The stand-in served by uvicorn in a background thread; use as a context manager."""

    def __init__(self, strict_query: bool = False) -> None:
        self.app, self.state, self.requests = build_app(strict_query)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> UpstreamAPI:
        self.thread.start()
        wait_until(lambda: self.server.started, 20, "the upstream stand-in did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)

    def seen(self, method: str, path: str) -> list[Recorded]:
        """The recorded requests to `method path`, oldest first."""
        return [r for r in self.requests if r.method == method and r.path == path]
