"""OpenAI-compatible HTTP server over `GenerationEngine` (`atropos-inference-server`).

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
without a model; the route handlers here only parse, submit to the scheduler
and build the answer, so every route samples through the same batches.

Every request passes run-api's guard (`atroposlib.utils.request_guard`): JSON posts,
bounded bodies, no other site's page, and without a key only a local Host. With an
`api_key`, every route but `/health` needs `Authorization: Bearer <key>` (stricter than
vLLM, whose key guards only `/v1`): `/generate`, `/tokenize` and `/metrics` cost or
reveal as much as the OpenAI routes. The weight routes
(hot reload, `weight_info`) are in `atroposlib.weight_sync.disk_routes`; every choice carries vLLM's
`weight_versions` once the engine has a version.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from atroposlib.inference.engine import GenerationEngine, GenerationJob, Sample, SamplingParams
from atroposlib.inference.generate_requests import (
    GenerateRequest,
    generate_body,
    generate_prompt_ids,
    generate_sampling,
)
from atroposlib.inference.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    OpenAIError,
    TokenizeRequest,
    chat_prompt_ids,
    chat_sampling,
    check_model,
    check_token_ids,
    completion_prompts,
    completion_sampling,
    error_body,
    tokenize_ids,
    validation_error_body,
)
from atroposlib.inference.scheduler import BatchScheduler
from atroposlib.utils.openai_shapes import (
    chat_choice,
    chat_logprobs,
    completion_body,
    completion_logprobs,
    text_choice,
    token_text,
    usage_body,
)
from atroposlib.utils.request_guard import (
    CHAT_MAX_BODY_BYTES,
    CHAT_MAX_BODY_VALUES,
    RequestGuard,
)
from atroposlib.weight_sync.disk_routes import install_weight_routes, sync_key_opens_reload


def with_weight_versions(choice: dict[str, Any], sample: Sample) -> dict[str, Any]:
    """vLLM's extra choice field; absent when the engine was given no version."""
    spans = sample.weight_version_spans()
    if spans is not None:
        choice["weight_versions"] = spans
    return choice


def chat_choices(
    samples: list[Sample], logprobs: bool, spell: Callable[[int], str]
) -> list[dict[str, Any]]:
    """One chat choice per sample, in order; logprobs only when the request asked for them."""
    return [
        with_weight_versions(
            chat_choice(
                index,
                sample.text,
                sample.finish_reason,
                chat_logprobs(sample.token_ids, sample.logprobs, sample.top_logprobs, spell)
                if logprobs
                else None,
            ),
            sample,
        )
        for index, sample in enumerate(samples)
    ]


def text_choices(
    samples: list[Sample], logprobs: int | None, spell: Callable[[int], str]
) -> list[dict[str, Any]]:
    """Text choices are numbered across all prompts; `logprobs=0` still returns token logprobs."""
    return [
        with_weight_versions(
            text_choice(
                index,
                sample.text,
                sample.finish_reason,
                completion_logprobs(
                    sample.token_ids, sample.logprobs, sample.top_logprobs, spell, bool(logprobs)
                )
                if logprobs is not None
                else None,
            ),
            sample,
        )
        for index, sample in enumerate(samples)
    ]


def _models_body(served_model_name: str, max_model_len: int) -> dict[str, Any]:
    """vLLM adds `max_model_len`, which clients read to size their prompts."""
    model = {
        "id": served_model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "atroposlib",
        "max_model_len": max_model_len,
    }
    return {"object": "list", "data": [model]}


def _completion_tokens(jobs: list[GenerationJob]) -> int:
    """`usage.completion_tokens` counts every sample of every prompt, EOS included."""
    return sum(len(s.token_ids) for job in jobs for s in job.samples)


def _metrics_text(scheduler: BatchScheduler) -> str:
    """Prometheus text, so tests and operators can see how requests were batched."""
    lines = [
        "# TYPE atropos_inference_rounds_total counter",
        f"atropos_inference_rounds_total {scheduler.rounds}",
        "# TYPE atropos_inference_requests_total counter",
        f"atropos_inference_requests_total {scheduler.jobs}",
        "# TYPE atropos_inference_generated_tokens_total counter",
        f"atropos_inference_generated_tokens_total {scheduler.generated_tokens}",
    ]
    return "\n".join(lines) + "\n"


def _install_error_handlers(app: FastAPI) -> None:
    """Every refusal, ours or pydantic's, must reach the client in OpenAI's error body."""

    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.message, exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error_body(exc.errors()), status_code=400)


def _started(scheduler: BatchScheduler | None) -> BatchScheduler:
    """The scheduler, which the app's lifespan starts before any request is served."""
    if scheduler is None:
        raise RuntimeError("the inference app's lifespan has not started its scheduler")
    return scheduler


OPEN_PATHS = frozenset({"/health"})
"""What a launcher or load balancer may poll without the key."""


def create_inference_app(
    engine: GenerationEngine,
    served_model_name: str,
    max_batch_rows: int = 64,
    api_key: str | None = None,
    weight_sync_key: str | None = None,
    allowed_hosts: frozenset[str] = frozenset(),
) -> FastAPI:
    scheduler: BatchScheduler | None = None

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        nonlocal scheduler
        scheduler = BatchScheduler(engine, max_rows=max_batch_rows)
        try:
            yield
        finally:
            scheduler.close()

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
    tokenizer = engine.tokenizer

    def spelling(as_ids: bool) -> Callable[[int], str]:
        return partial(token_text, as_ids=as_ids, decode=tokenizer.decode)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health_generate")
    async def health_generate() -> JSONResponse:
        """Healthy only if the engine can still produce a token (upstream's node watcher)."""
        try:
            await _started(scheduler).submit(
                GenerationJob([0], SamplingParams(max_tokens=1, temperature=0))
            )
        except Exception as exc:  # the engine's failure is the answer, not a crash
            return JSONResponse({"status": "error", "message": str(exc)}, status_code=500)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(_metrics_text(_started(scheduler)))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return _models_body(served_model_name, engine.max_model_len)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest) -> dict[str, Any]:
        check_model(request.model, served_model_name)
        prompt_ids = chat_prompt_ids(tokenizer, request.messages, request.add_generation_prompt)
        job = GenerationJob(
            prompt_ids, chat_sampling(request, len(prompt_ids), engine.max_model_len)
        )
        await _started(scheduler).submit(job)
        spell = spelling(request.return_tokens_as_token_ids)
        choices = chat_choices(job.samples, request.logprobs, spell)
        usage = usage_body(len(prompt_ids), _completion_tokens([job]))
        return completion_body("chat", served_model_name, choices, usage)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> dict[str, Any]:
        check_model(request.model, served_model_name)
        if request.echo:
            raise OpenAIError(400, "echo is not supported by this server", "echo")
        prompts = completion_prompts(tokenizer, request.prompt)
        jobs = [
            GenerationJob(ids, completion_sampling(request, len(ids), engine.max_model_len))
            for ids in prompts
        ]
        batch_scheduler = _started(scheduler)
        await asyncio.gather(*(batch_scheduler.submit(job) for job in jobs))
        spell = spelling(request.return_tokens_as_token_ids)
        samples = [sample for job in jobs for sample in job.samples]
        choices = text_choices(samples, request.logprobs, spell)
        usage = usage_body(sum(len(p) for p in prompts), _completion_tokens(jobs))
        return completion_body("text", served_model_name, choices, usage)

    @app.post("/generate")
    async def generate(request: GenerateRequest) -> JSONResponse:
        prompt_ids = generate_prompt_ids(tokenizer, request.prompt)
        params = generate_sampling(request, len(prompt_ids), engine.max_model_len, len(tokenizer))
        job = await _started(scheduler).submit(GenerationJob(prompt_ids, params))
        return JSONResponse(generate_body(request, job, tokenizer.decode))

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest) -> dict[str, Any]:
        ids = tokenize_ids(tokenizer, request)
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: DetokenizeRequest) -> dict[str, str]:
        check_token_ids(request.tokens, len(tokenizer), "tokens")
        return {"prompt": tokenizer.decode(request.tokens)}

    return app
