"""Configuration of the trajectory API server (`run-api` flags map 1:1 onto these fields)."""

from __future__ import annotations

import os
from typing import ClassVar, Literal

from pydantic import BaseModel, Field

from atroposlib.utils.exposure import (
    API_KEY_ENVIRONMENT,
    ENV_KEY_ENVIRONMENT,
    ExposureRule,
    is_loopback,
)
from atroposlib.utils.request_guard import ALLOWED_HOSTS_HELP, HostNames

__all__ = ["SETTINGS_ENV", "APISettings", "is_loopback", "settings_from_environment"]

SETTINGS_ENV = "ATROPOS_API_SETTINGS"
"""Environment variable holding `APISettings` as JSON for an app that uvicorn imports
(`run-api --reload` sets it); unset, the module-level app uses run-api's defaults."""


class APISettings(ExposureRule, BaseModel):
    KEY_ENVIRONMENT: ClassVar[tuple[str, ...]] = (API_KEY_ENVIRONMENT,)
    EXPOSURE_RISK: ClassVar[str] = "read batches or wipe the run"

    host: str = Field(
        "127.0.0.1", description="Address to bind. Non-loopback needs --api-key or --insecure."
    )
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on.")
    reload: bool = Field(False, description="Restart on source changes (development only).")
    state_dir: str = Field(
        "./.atropos", description="Directory of the durable store (SQLite, WAL mode)."
    )
    ephemeral: bool = Field(
        False, description="Keep everything in memory; a restart loses the queue."
    )
    max_queued_sequences: int = Field(
        100_000,
        gt=0,
        description="Cap on queued plus buffered sequences; posts past it get 503 + Retry-After.",
    )
    max_body_mb: float = Field(
        128.0, gt=0, description="Largest request body accepted (after gunzip); larger gets 413."
    )
    max_body_values: int = Field(
        8_000_000,
        gt=0,
        description="Most JSON values one body may hold (counted by its commas and "
        "brackets before any parsing, so nested lists count too; more gets 413). Parsing "
        "builds a Python object per value, about 18 times the body's bytes: a 146 KB gzip "
        "post of 100 MB of token ids peaked at 1.8 GB before this. 8M is about 5 groups of "
        "64 sequences of 8k tokens.",
    )
    api_key: str | None = Field(
        None,
        description="Require 'Authorization: Bearer <key>' on every endpoint but / and /health "
        "(default: $ATROPOS_API_KEY).",
    )
    env_api_key: str | None = Field(
        default_factory=lambda: os.environ.get(ENV_KEY_ENVIRONMENT) or None,
        description="A second key, for environments: it opens only the routes an "
        "environment calls (registering, posting groups, /status-env, /info), never "
        "/batch or /reset_data (default: $ATROPOS_ENV_API_KEY; needs --api-key).",
    )
    insecure: bool = Field(
        False, description="Allow binding a non-loopback address without an API key."
    )
    allowed_hosts: HostNames = Field(default_factory=list, description=ALLOWED_HOSTS_HELP)
    idempotency_ttl_s: float | None = Field(
        None,
        gt=0,
        description="How long an Idempotency-Key answer is remembered (default: as long as "
        "the state dir, so a spooled post replayed after any pause is not queued twice; "
        "a value bounds the memory, about 250 bytes per post).",
    )
    retry_after_s: int = Field(2, ge=1, description="Retry-After seconds sent with 503 answers.")
    env_timeout_s: float = Field(
        120.0,
        gt=0,
        description="An env that has not polled /status-env for this long counts as gone: it "
        "stops diluting the others' weights and its min_batch_allocation stops holding batches "
        "(it counts again on its next poll).",
    )
    gzip_responses: bool = Field(
        False,
        description="Gzip responses over 1 KB for clients that accept it (saves bandwidth to a "
        "remote trainer, costs CPU per batch).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Logging level (debug, info, warning, error)."
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="Log format: text, or json for one object per line."
    )
    access_log: bool = Field(False, description="Log every HTTP request (uvicorn access log).")

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 2**20)


def settings_from_environment() -> APISettings:
    """`$ATROPOS_API_SETTINGS` if set, else the defaults `run-api` starts with."""
    raw = os.environ.get(SETTINGS_ENV)
    return APISettings.model_validate_json(raw) if raw else APISettings()
