"""The inference server's routes, one router per area, as run-api's (`api/routes.py`).

Each handler only parses, submits to the batch scheduler and builds the answer, so
every route samples through the same batches; `EngineService` is what they share.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

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
    chat_prompt,
    chat_sampling,
    check_model,
    check_token_ids,
    completion_prompts,
    completion_sampling,
    tokenize_ids,
)
from atroposlib.inference.sampler import GenerationJob, Sample, SamplingParams, TransformersSampler
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


class EngineService:
    """The engine, the name it serves, and the scheduler the app's lifespan starts."""

    def __init__(
        self, engine: TransformersSampler, served_model_name: str, max_batch_rows: int
    ) -> None:
        self.engine, self.served_model_name = engine, served_model_name
        self.max_batch_rows = max_batch_rows
        self._scheduler: BatchScheduler | None = None

    def start(self) -> None:
        self._scheduler = BatchScheduler(self.engine, max_rows=self.max_batch_rows)

    def close(self) -> None:
        if self._scheduler is not None:
            self._scheduler.close()

    @property
    def scheduler(self) -> BatchScheduler:
        if self._scheduler is None:
            raise RuntimeError("the inference app's lifespan has not started its scheduler")
        return self._scheduler

    def spelling(self, as_ids: bool) -> Callable[[int], str]:
        return partial(token_text, as_ids=as_ids, decode=self.engine.tokenizer.decode)


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


def models_body(served_model_name: str, max_model_len: int) -> dict[str, Any]:
    """vLLM adds `max_model_len`, which clients read to size their prompts."""
    model = {
        "id": served_model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "atroposlib",
        "max_model_len": max_model_len,
    }
    return {"object": "list", "data": [model]}


def completion_tokens(jobs: list[GenerationJob]) -> int:
    """`usage.completion_tokens` counts every sample of every prompt, EOS included."""
    return sum(len(s.token_ids) for job in jobs for s in job.samples)


def metrics_text(scheduler: BatchScheduler) -> str:
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


def health_routes(service: EngineService) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/health_generate")
    async def health_generate() -> JSONResponse:
        """Healthy only if the engine can still produce a token (upstream's node watcher)."""
        try:
            await service.scheduler.submit(
                GenerationJob([0], SamplingParams(max_tokens=1, temperature=0))
            )
        except Exception as exc:  # the engine's failure is the answer, not a crash
            return JSONResponse({"status": "error", "message": str(exc)}, status_code=500)
        return JSONResponse({"status": "ok"})

    @router.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(metrics_text(service.scheduler))

    return router


def openai_routes(service: EngineService) -> APIRouter:
    router = APIRouter()
    engine, served = service.engine, service.served_model_name
    tokenizer = engine.tokenizer

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        return models_body(served, engine.max_model_len)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest) -> dict[str, Any]:
        check_model(request.model, served)
        prompt_ids, pictures = chat_prompt(
            tokenizer, engine.processor, request.messages, request.add_generation_prompt
        )
        job = GenerationJob(
            prompt_ids, chat_sampling(request, len(prompt_ids), engine.max_model_len), pictures
        )
        await service.scheduler.submit(job)
        spell = service.spelling(request.return_tokens_as_token_ids)
        choices = chat_choices(job.samples, request.logprobs, spell)
        usage = usage_body(len(prompt_ids), completion_tokens([job]))
        return completion_body("chat", served, choices, usage)

    @router.post("/v1/completions")
    async def completions(request: CompletionRequest) -> dict[str, Any]:
        check_model(request.model, served)
        if request.echo:
            raise OpenAIError(400, "echo is not supported by this server", "echo")
        prompts = completion_prompts(tokenizer, request.prompt)
        jobs = [
            GenerationJob(ids, completion_sampling(request, len(ids), engine.max_model_len))
            for ids in prompts
        ]
        scheduler = service.scheduler
        await asyncio.gather(*(scheduler.submit(job) for job in jobs))
        spell = service.spelling(request.return_tokens_as_token_ids)
        samples = [sample for job in jobs for sample in job.samples]
        choices = text_choices(samples, request.logprobs, spell)
        usage = usage_body(sum(len(p) for p in prompts), completion_tokens(jobs))
        return completion_body("text", served, choices, usage)

    return router


def native_routes(service: EngineService) -> APIRouter:
    """vLLM's own: `/generate` (Atropos's `VLLMServer` client), `/tokenize`, `/detokenize`."""
    router = APIRouter()
    engine = service.engine
    tokenizer = engine.tokenizer

    @router.post("/generate")
    async def generate(request: GenerateRequest) -> JSONResponse:
        prompt_ids = generate_prompt_ids(tokenizer, request.prompt)
        params = generate_sampling(request, len(prompt_ids), engine.max_model_len, len(tokenizer))
        job = await service.scheduler.submit(GenerationJob(prompt_ids, params))
        return JSONResponse(generate_body(request, job, tokenizer.decode))

    @router.post("/tokenize")
    async def tokenize(request: TokenizeRequest) -> dict[str, Any]:
        ids = tokenize_ids(tokenizer, request, engine.processor)
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids}

    @router.post("/detokenize")
    async def detokenize(request: DetokenizeRequest) -> dict[str, str]:
        check_token_ids(request.tokens, len(tokenizer), "tokens")
        return {"prompt": tokenizer.decode(request.tokens)}

    return router


ROUTERS = (health_routes, openai_routes, native_routes)
"""Every area's router; the weight routes are `weight_sync.disk_routes`'."""
