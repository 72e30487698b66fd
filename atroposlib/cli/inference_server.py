"""`atropos-inference-server`: an OpenAI-compatible server for a local HF model on CPU.

Its core flags are vLLM's api_server flags, so the engine launcher can start
either one with the same arguments. Like vLLM, `--api-key` (or $VLLM_API_KEY) makes
it require `Authorization: Bearer <key>`; unlike vLLM it guards every route but
/health, and it refuses a non-loopback --host without a key unless --insecure
(atroposlib.utils.exposure, docs/security.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from atroposlib.utils.exposure import ENGINE_KEY_ENVIRONMENT, ExposureRule
from atroposlib.utils.flags import add_model_flags, parse_settings
from atroposlib.utils.listen import ListenError, listen_socket, serve
from atroposlib.utils.logging import configure_logging
from atroposlib.utils.model_files import local_model_problem
from atroposlib.utils.request_guard import ALLOWED_HOSTS_HELP, HostNames

KEY_ENVIRONMENT = ENGINE_KEY_ENVIRONMENT

"""Where the key comes from without --api-key, first set wins (VLLM_API_KEY is vLLM's)."""


class InferenceServerSettings(ExposureRule, BaseModel):
    KEY_ENVIRONMENT: ClassVar[tuple[str, ...]] = KEY_ENVIRONMENT
    EXPOSURE_RISK: ClassVar[str] = "generate with this model, read its metrics and tie up its CPU"

    model: str = Field(..., description="Path (or hub id) of the model and tokenizer to serve.")
    host: str = Field(
        "127.0.0.1", description="Address to bind. Non-loopback needs --api-key or --insecure."
    )
    port: int = Field(8000, ge=0, le=65535, description="TCP port.")
    served_model_name: str | None = Field(
        None, description="Name clients use in 'model' (default: the --model value)."
    )
    max_model_len: int | None = Field(
        None, ge=1, description="Longest prompt + completion (default: the model's limit)."
    )
    dtype: str = Field("float32", description="Weights dtype: float32, bfloat16, float16, auto.")
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|cuda(:\d+)?)$",
        description="Where the model runs: cpu, cuda or cuda:N (sampling stays on the CPU).",
    )
    max_batch_rows: int = Field(64, ge=1, description="Most sampled sequences per batch round.")
    num_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads (default: torch's choice)."
    )
    api_key: str | None = Field(
        None,
        description="Require 'Authorization: Bearer <key>' on every route but /health "
        "(default: $ATROPOS_ENGINE_API_KEY, else $VLLM_API_KEY, as vLLM's --api-key).",
    )
    weight_sync_key: str | None = Field(
        None,
        description="Key that POST /update_weights_from_disk needs (default: "
        "$ATROPOS_WEIGHT_SYNC_KEY; without either, hot reload is off: --api-key opens "
        "sampling only).",
    )
    seed: int | None = Field(
        None,
        ge=0,
        description="Seed of the sampling stream that requests without a seed of their own "
        "draw from, as vLLM's --seed (default: a fresh one at each start, logged, so that "
        "restarts and several engines never repeat a stream).",
    )
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = Field(
        "raw_logprobs",
        description="What reported logprobs are of, as vLLM's flag: the model's raw "
        "distribution, or the one each token was drawn from (temperature, top-k, top-p, "
        "min-p applied), which an importance-sampling correction needs.",
    )
    weight_version: str | None = Field(
        None,
        description="Version label of the weights loaded at start, e.g. the trainer step "
        "(default: $ATROPOS_WEIGHT_VERSION).",
    )
    insecure: bool = Field(
        False, description="Allow binding a non-loopback address without an API key."
    )
    allowed_hosts: HostNames = Field(default_factory=list, description=ALLOWED_HOSTS_HELP)
    log_level: str = Field("info", description="Logging level.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atropos-inference-server",
        description="OpenAI-compatible inference server (transformers, CPU-friendly).",
    )
    add_model_flags(parser, InferenceServerSettings)
    return parser


def main(argv: list[str] | None = None) -> int:
    settings, _ = parse_settings(build_parser(), InferenceServerSettings, argv)
    settings = settings.resolved()
    problem = settings.exposure_problem()
    if warning := settings.exposure_warning():
        print(f"atropos-inference-server: {warning}", file=sys.stderr)
    if problem:
        print(f"atropos-inference-server: {problem}", file=sys.stderr)
        return 2
    if problem := local_model_problem(settings.model):  # before seconds of imports
        print(f"atropos-inference-server: cannot load model: {problem}", file=sys.stderr)
        return 1
    try:  # before the model loads, so a busy port costs no time
        sock = listen_socket(settings.host, settings.port)
    except ListenError as error:
        print(f"atropos-inference-server: {error}", file=sys.stderr)
        return 2
    with sock:
        app = _load_app(settings)
        if isinstance(app, int):
            return app
        return serve(
            app,
            sock,
            "atropos-inference-server",
            host=settings.host,
            port=settings.port,
            access_log=False,
        )


def _load_app(settings: InferenceServerSettings) -> Any:
    """The server's app over the loaded model, or the exit code of a start that failed."""
    configure_logging(settings.log_level)
    import torch

    from atroposlib.inference.sampler import TransformersSampler, device_problem
    from atroposlib.inference.server import create_inference_app
    from atroposlib.weight_sync.disk_routes import (  # imports torch: not before the checks
        WEIGHT_SYNC_KEY_ENVIRONMENT,
        WEIGHT_VERSION_ENVIRONMENT,
    )

    if problem := device_problem(settings.device):
        print(f"atropos-inference-server: {problem}", file=sys.stderr)
        return 2
    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    try:
        engine = TransformersSampler.load(
            settings.model,
            settings.dtype,
            settings.max_model_len,
            settings.weight_version or os.environ.get(WEIGHT_VERSION_ENVIRONMENT) or None,
            settings.device,
            settings.seed,
            settings.logprobs_mode,
        )
    except (OSError, ValueError) as exc:
        print(
            f"atropos-inference-server: cannot load model {settings.model!r}: {exc}",
            file=sys.stderr,
        )
        return 1
    return create_inference_app(
        engine,
        settings.served_model_name or settings.model,
        settings.max_batch_rows,
        api_key=settings.api_key,
        weight_sync_key=settings.weight_sync_key or os.environ.get(WEIGHT_SYNC_KEY_ENVIRONMENT),
        allowed_hosts=frozenset(name.lower() for name in settings.allowed_hosts),
    )


if __name__ == "__main__":
    sys.exit(main())
