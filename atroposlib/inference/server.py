"""OpenAI-compatible HTTP server over `GenerationEngine` (`atropos-inference-server`).

It answers the subset of the OpenAI and vLLM APIs that environments and
trainers use, in the shapes the `openai` SDK parses: chat and text completions
with n, temperature, top_p, max_tokens, stop, seed, logprobs/top_logprobs and
vLLM's `return_tokens_as_token_ids`, token-id prompts, usage and finish
reasons, plus vLLM's `/tokenize` and `/detokenize`. Errors use OpenAI's error
body, `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from atroposlib.inference.engine import GenerationEngine, GenerationJob, SamplingParams
from atroposlib.inference.scheduler import BatchScheduler
from atroposlib.utils.openai_shapes import chat_choice, completion_body, text_choice


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    n: int = Field(1, ge=1, le=128)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    ignore_eos: bool = False
    return_tokens_as_token_ids: bool = False


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    add_generation_prompt: bool = True


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    tokens: list[int]


def create_inference_app(
    engine: GenerationEngine, served_model_name: str, max_batch_rows: int = 64
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
    tokenizer = engine.tokenizer

    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(exc.status, "InvalidRequestError")
        body = {"message": exc.message, "type": kind, "param": exc.param, "code": exc.status}
        return JSONResponse({"error": body}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"] if p != "body") or None
        message = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body')}: {e['msg']}" for e in exc.errors()
        )
        body = {"message": message, "type": "BadRequestError", "param": param, "code": 400}
        return JSONResponse({"error": body}, status_code=400)

    def check_model(name: str) -> None:
        if name != served_model_name:
            raise OpenAIError(404, f"The model `{name}` does not exist.", "model")

    def sampling(
        request: _Sampling, prompt_len: int, max_tokens: int | None, top: int
    ) -> SamplingParams:
        if request.stream:
            raise OpenAIError(400, "streaming is not supported by this server", "stream")
        room = engine.max_model_len - prompt_len
        if room < 1:
            raise OpenAIError(
                400,
                f"prompt has {prompt_len} tokens; this model's maximum context length is "
                f"{engine.max_model_len}",
                "messages" if isinstance(request, ChatCompletionRequest) else "prompt",
            )
        if max_tokens is not None and max_tokens > room:
            raise OpenAIError(
                400,
                f"max_tokens {max_tokens} + prompt {prompt_len} tokens exceeds the maximum "
                f"context length {engine.max_model_len}",
                "max_tokens",
            )
        stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        return SamplingParams(
            max_tokens=max_tokens or room,
            temperature=request.temperature,
            top_p=request.top_p,
            n=request.n,
            stop=stop,
            seed=request.seed,
            top_logprobs=top,
            ignore_eos=request.ignore_eos,
        )

    def token_text(token_id: int, as_ids: bool) -> str:
        return f"token_id:{token_id}" if as_ids else tokenizer.decode([token_id])

    def usage(prompt_tokens: int, jobs: list[GenerationJob]) -> dict[str, int]:
        completion = sum(len(s.token_ids) for job in jobs for s in job.samples)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        lines = [
            "# TYPE atropos_inference_rounds_total counter",
            f"atropos_inference_rounds_total {scheduler.rounds}",
            "# TYPE atropos_inference_requests_total counter",
            f"atropos_inference_requests_total {scheduler.jobs}",
            "# TYPE atropos_inference_generated_tokens_total counter",
            f"atropos_inference_generated_tokens_total {scheduler.generated_tokens}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": served_model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "atroposlib",
                    "max_model_len": engine.max_model_len,
                }
            ],
        }

    def chat_prompt_ids(messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
        flat = []
        for message in messages:
            if "role" not in message:
                raise OpenAIError(400, "every message needs a 'role'", "messages")
            content = message.get("content") or ""
            if isinstance(content, list):  # OpenAI content parts
                content = "".join(
                    part.get("text", "") for part in content if isinstance(part, dict)
                )
            flat.append({**message, "content": content})
        text = tokenizer.apply_chat_template(
            flat, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest) -> dict[str, Any]:
        check_model(request.model)
        prompt_ids = chat_prompt_ids(request.messages, request.add_generation_prompt)
        top = request.top_logprobs or 0
        limit = request.max_completion_tokens or request.max_tokens
        job = GenerationJob(prompt_ids, sampling(request, len(prompt_ids), limit, top))
        await scheduler.submit(job)
        choices = []
        for index, sample in enumerate(job.samples):
            logprobs = None
            if request.logprobs:
                content = []
                for position, (token, value) in enumerate(
                    zip(sample.token_ids, sample.logprobs, strict=True)
                ):
                    text = token_text(token, request.return_tokens_as_token_ids)
                    alternatives = sample.top_logprobs[position] if sample.top_logprobs else []
                    content.append(
                        {
                            "token": text,
                            "logprob": value,
                            "bytes": list(text.encode()),
                            "top_logprobs": [
                                {
                                    "token": token_text(alt, request.return_tokens_as_token_ids),
                                    "logprob": alt_value,
                                    "bytes": list(
                                        token_text(alt, request.return_tokens_as_token_ids).encode()
                                    ),
                                }
                                for alt, alt_value in alternatives
                            ],
                        }
                    )
                logprobs = {"content": content}
            choices.append(chat_choice(index, sample.text, sample.finish_reason, logprobs))
        return completion_body("chat", served_model_name, choices, usage(len(prompt_ids), [job]))

    def completion_prompts(prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompts = [tokenizer(prompt)["input_ids"]]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [list(prompt)]
        else:
            prompts = [
                tokenizer(item)["input_ids"] if isinstance(item, str) else list(item)
                for item in prompt
            ]
        if not prompts or any(not p for p in prompts):
            raise OpenAIError(400, "prompt must not be empty", "prompt")
        vocab = len(tokenizer)
        if any(not 0 <= t < vocab for ids in prompts for t in ids):
            raise OpenAIError(400, f"token ids must be in [0, {vocab})", "prompt")
        return prompts

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> dict[str, Any]:
        check_model(request.model)
        if request.echo:
            raise OpenAIError(400, "echo is not supported by this server", "echo")
        prompts = completion_prompts(request.prompt)
        top = request.logprobs or 0
        jobs = [
            GenerationJob(ids, sampling(request, len(ids), request.max_tokens, top))
            for ids in prompts
        ]
        await asyncio.gather(*(scheduler.submit(job) for job in jobs))
        choices = []
        for job in jobs:
            for sample in job.samples:
                logprobs = None
                if request.logprobs is not None:
                    as_ids = request.return_tokens_as_token_ids
                    texts = [token_text(t, as_ids) for t in sample.token_ids]
                    offsets, at = [], 0
                    for text in texts:
                        offsets.append(at)
                        at += len(text)
                    logprobs = {
                        "tokens": texts,
                        "token_logprobs": sample.logprobs,
                        "top_logprobs": [
                            {token_text(alt, as_ids): value for alt, value in alternatives}
                            for alternatives in sample.top_logprobs
                        ]
                        if top
                        else None,
                        "text_offset": offsets,
                    }
                choices.append(
                    text_choice(len(choices), sample.text, sample.finish_reason, logprobs)
                )
        prompt_tokens = sum(len(p) for p in prompts)
        return completion_body("text", served_model_name, choices, usage(prompt_tokens, jobs))

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest) -> dict[str, Any]:
        if request.messages is not None:
            ids = chat_prompt_ids(request.messages, request.add_generation_prompt)
        elif request.prompt is not None:
            ids = tokenizer(request.prompt, add_special_tokens=request.add_special_tokens)[
                "input_ids"
            ]
        else:
            raise OpenAIError(400, "give either 'prompt' or 'messages'", "prompt")
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: DetokenizeRequest) -> dict[str, str]:
        vocab = len(tokenizer)
        if any(not 0 <= t < vocab for t in request.tokens):
            raise OpenAIError(400, f"token ids must be in [0, {vocab})", "tokens")
        return {"prompt": tokenizer.decode(request.tokens)}

    return app
