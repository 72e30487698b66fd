"""Batched sampling with a Hugging Face causal LM: the core of the CPU inference server.

Design decisions:
- Static batching per round: every request waiting when a round starts joins
  it (each of its `n` samples is one row); rows are left-padded, share one KV
  cache, and stop independently. Simple, and on a CPU the batched forward pass
  is what buys throughput.
- A prompt is prefilled once, however many samples it has: its KV cache is then
  copied to each of its `n` rows, as vLLM shares a prompt's blocks. A GRPO group
  asks for 8 samples of one prompt, so this cuts the prefill, most of a round's
  cost for short completions, eightfold.
- Logprobs are those of the raw model distribution (log_softmax of the logits,
  before temperature or top-p), as vLLM reports them by default, so a trainer
  re-scoring the completion with a forward pass gets the same numbers. With
  `logprobs_mode="processed_logprobs"` (vLLM's `--logprobs-mode`) they are those of the
  distribution each token was drawn from (temperature, min-p, top-k and top-p applied,
  renormalised): what an importance-sampling correction needs of its behaviour policy
  (IS-1 of the trainer review).
- Each request with a `seed` samples from its own generator, so its output does
  not depend on what else shares the batch.
- The EOS token is part of the returned token ids and logprobs (the trainer
  must learn to stop) but not of the text.
- Prompt logprobs (vLLM's `prompt_logprobs`) are read from the same batched
  prefill pass that starts sampling, so scoring a prompt costs no extra forward
  pass and goes through the same batching as every other request.
- `device` places the model (cpu, cuda, cuda:N); sampling stays on the CPU. Each
  step moves one row of last-position logits per sequence off the device, which is
  small next to the forward pass, and keeps seeded generators reproducible and the
  per-row top-p/top-k code the same on every device.
- New weights (`load_weights`) wait for the round in flight: a round runs
  wholly on one weight version, which every sample records (`weight_version`),
  so a trainer can tell how stale each sample is.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from atroposlib.utils.tokenizers import end_token_ids

logger = logging.getLogger(__name__)

LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
"""What the reported logprobs are of: vLLM's names (`--logprobs-mode`)."""


def device_problem(name: str) -> str | None:
    """Why `name` (cpu, cuda, cuda:N) cannot hold the model here, or None."""
    device = torch.device(name)
    if device.type == "cpu":
        return None
    if not torch.cuda.is_available():
        return f"--device {name}: this torch sees no CUDA device"
    if device.index is not None and device.index >= torch.cuda.device_count():
        return f"--device {name}: there are {torch.cuda.device_count()} CUDA devices"
    return None


def refuse_computed_positions(model: Any) -> None:
    """This engine gives every row plain position ids (left padding, one KV cache); a
    model that computes its own from the pictures (Qwen2-VL's M-RoPE) needs vLLM."""
    text = getattr(model.config, "text_config", None) or model.config
    rope = getattr(text, "rope_scaling", None) or getattr(text, "rope_parameters", None) or {}
    if isinstance(rope, dict) and "mrope_section" in rope:
        raise ValueError(
            f"{type(model).__name__} computes multimodal rotary positions (M-RoPE), which "
            "this engine does not: serve it with vLLM (--engine vllm)"
        )


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    top_logprobs: int = 0
    ignore_eos: bool = False
    top_k: int = 0  # 0: no limit
    min_p: float = 0.0
    stop_token_ids: list[int] = field(default_factory=list)
    prompt_logprobs: int | None = None  # None: not computed; k: the prompt token's and top k


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    text: str
    finish_reason: str
    weight_version: str | None = None

    def weight_version_spans(self) -> list[dict[str, object]] | None:
        """vLLM's per-choice `weight_versions`: which weights sampled tokens [start, end)."""
        if self.weight_version is None:
            return None
        return [{"version": self.weight_version, "start": 0, "end": len(self.token_ids)}]


@dataclass
class GenerationJob:
    prompt_ids: list[int]
    params: SamplingParams
    pictures: list[Any] = field(default_factory=list)
    """PIL images whose image tokens `prompt_ids` holds (a vision-language model's)."""
    samples: list[Sample] = field(default_factory=list)
    # positions 1.. of the prompt (position 0 has no context); set when params.prompt_logprobs
    prompt_logprobs: list[float] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]]] | None = None


class TransformersSampler:
    """Samples completions for concurrent requests in batched rounds on one HF model.

    Thread-safe: requests queue, and a round takes every request waiting when it starts.
    `load_weights` swaps the weights between rounds, labelled with `weight_version`.
    """

    def __init__(
        self,
        model,
        tokenizer,
        max_model_len: int,
        weight_version: str | None = None,
        seed: int | None = None,
        logprobs_mode: str = "raw_logprobs",
        processor: Any = None,
    ) -> None:
        """`processor`: a vision-language model's (None for a text model): it makes the
        pixel inputs of prompts with pictures.
        `seed`: of the stream requests without a seed of their own draw from; None, a
        fresh one (logged), so no two starts draw alike (RNG-1 of the trainer review).
        `logprobs_mode`: `raw_logprobs` or `processed_logprobs` (the module docstring)."""
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode {logprobs_mode!r}: one of {', '.join(LOGPROBS_MODES)}")
        self.processed_logprobs = logprobs_mode == "processed_logprobs"
        self.model = model
        self.processor = processor
        # a VLM never samples a picture's placeholder: it is a prompt's, not a reply's
        self.unsampled_ids: list[int] = []
        if processor is not None:
            from atroposlib.utils.image_messages import picture_token_ids

            self.unsampled_ids = picture_token_ids(processor)
        self.device = next(model.parameters()).device
        self.weight_version = weight_version
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.eos_ids = end_token_ids(model, tokenizer)
        self._lock = threading.Lock()
        self.seed = secrets.randbits(63) if seed is None else seed
        logger.info("sampling seed %d (requests without a seed of their own)", self.seed)
        self._shared_generator = torch.Generator().manual_seed(self.seed)

    @classmethod
    def load(
        cls,
        path: str,
        dtype: str = "float32",
        max_model_len: int | None = None,
        weight_version: str | None = None,
        device: str = "cpu",
        seed: int | None = None,
        logprobs_mode: str = "raw_logprobs",
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from atroposlib.utils.image_messages import vision_processor

        torch_dtype = {
            "float32": torch.float32,
            "bfloat16": torch.bfloat16,
            "float16": torch.float16,
            "auto": torch.float32,
        }[dtype]
        processor = vision_processor(path)
        if processor is not None:
            from transformers import AutoModelForImageTextToText

            tokenizer = processor.tokenizer
            model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch_dtype)
            refuse_computed_positions(model)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
        model.to(torch.device(device))
        model.eval()
        # a config without the field, or with it None, gets the same 2048 default
        limit = max_model_len or getattr(model.config, "max_position_embeddings", None) or 2048
        return cls(model, tokenizer, limit, weight_version, seed, logprobs_mode, processor)

    def load_weights(self, path: str, weight_version: str | None = None) -> None:
        """Serve the weights at `path` from the next round on (`weight_sync.disk_reload`).

        Raises `WeightLoadError` and keeps the old weights when they do not fit.
        """
        from atroposlib.weight_sync.disk_reload import check_compatible, copy_into, read_checkpoint

        tensors = read_checkpoint(path)  # read outside the lock: rounds go on meanwhile
        check_compatible(self.model, tensors)
        with self._lock:
            copy_into(self.model, tensors)
            if weight_version is not None:  # as SGLang: no new label keeps the old one
                self.weight_version = weight_version

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    @torch.inference_mode()
    def run(self, jobs: list[GenerationJob]) -> None:
        """Generate every sample of every job; fills `job.samples`."""
        with self._lock:
            self._run(jobs)

    def _run(self, jobs: list[GenerationJob]) -> None:
        rows = [(job, k) for job in jobs for k in range(job.params.n)]
        generators = {
            id(job): torch.Generator().manual_seed(job.params.seed)
            if job.params.seed is not None
            else self._shared_generator
            for job in jobs
        }
        # one prefill row per prompt; its KV cache is then copied to each of its n samples
        width = max(len(job.prompt_ids) for job in jobs)
        input_ids = torch.full((len(jobs), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(jobs), width), dtype=torch.long)
        for j, job in enumerate(jobs):
            input_ids[j, width - len(job.prompt_ids) :] = torch.tensor(job.prompt_ids)
            attention[j, width - len(job.prompt_ids) :] = 1
        device = self.device
        attention = attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        output = self.model(
            input_ids=input_ids.to(device),
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            **self._pixels(jobs),
        )
        for j, job in enumerate(jobs):
            if job.params.prompt_logprobs is not None:
                self._score_prompt(job, output.logits[j, width - len(job.prompt_ids) :].cpu())
        count = len(rows)
        cache = output.past_key_values
        logits = output.logits[:, -1, :].float().cpu()
        if count != len(jobs):
            prompt_of_row = [j for j, job in enumerate(jobs) for _ in range(job.params.n)]
            logits = logits[prompt_of_row]
            on_device = torch.tensor(prompt_of_row, device=device)
            cache.reorder_cache(on_device)
            attention, positions = attention[on_device], positions[on_device]
        tokens: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        tops: list[list[list[tuple[int, float]]]] = [[] for _ in rows]
        finish: list[str | None] = [None] * count
        texts = [""] * count
        longest = max(job.params.max_tokens for job, _ in rows)
        for _ in range(longest):
            raw = torch.log_softmax(logits, dim=-1)
            chosen, drawn_from = self._choose(logits, rows, finish, generators)
            for i, (job, _) in enumerate(rows):
                if finish[i] is not None:
                    continue
                token = chosen[i]
                tokens[i].append(token)
                reported = drawn_from[i] if self.processed_logprobs else None
                reported = raw[i] if reported is None else reported
                logprobs[i].append(reported[token].item())
                if job.params.top_logprobs:
                    values, ids = reported.topk(job.params.top_logprobs)
                    tops[i].append(list(zip(ids.tolist(), values.tolist(), strict=True)))
                finish[i], texts[i] = self._check_stop(job.params, tokens[i])
            if all(reason is not None for reason in finish):
                break
            step_ids = torch.tensor([[t[-1] if t else self.pad_id] for t in tokens])
            attention = torch.cat([attention, attention.new_ones((count, 1))], dim=1)
            positions = positions[:, -1:] + 1
            output = self.model(
                input_ids=step_ids.to(device),
                attention_mask=attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
            )
            cache = output.past_key_values
            logits = output.logits[:, -1, :].float().cpu()
        for i, (job, _) in enumerate(rows):
            job.samples.append(
                Sample(
                    tokens[i],
                    logprobs[i],
                    tops[i],
                    texts[i],
                    finish[i] or "length",
                    self.weight_version,
                )
            )

    def _pixels(self, jobs: list[GenerationJob]) -> dict[str, torch.Tensor]:
        """The processor's picture inputs for the prefill's rows (a row without pictures
        gets none: the processor pads), or nothing when no prompt has a picture."""
        if self.processor is None or not any(job.pictures for job in jobs):
            return {}
        from atroposlib.utils.image_messages import pixel_inputs

        dtype = next(self.model.parameters()).dtype
        made = pixel_inputs(self.processor, [job.pictures for job in jobs], dtype)
        return {name: value.to(self.device) for name, value in made.items()}

    def _score_prompt(self, job: GenerationJob, logits: torch.Tensor) -> None:
        """Logits at position p predict prompt token p + 1; the last one starts sampling."""
        raw = torch.log_softmax(logits[:-1].float(), dim=-1)
        targets = torch.tensor(job.prompt_ids[1:], dtype=torch.long)
        job.prompt_logprobs = raw.gather(1, targets[:, None]).squeeze(1).tolist()
        top = min(job.params.prompt_logprobs or 0, raw.shape[-1])
        if top:
            values, ids = raw.topk(top, dim=-1)
            job.prompt_top_logprobs = [
                list(zip(row_ids, row_values, strict=True))
                for row_ids, row_values in zip(ids.tolist(), values.tolist(), strict=True)
            ]
        else:
            job.prompt_top_logprobs = [[] for _ in job.prompt_logprobs]

    def _choose(
        self, logits, rows, finish, generators
    ) -> tuple[list[int], list[torch.Tensor | None]]:
        """Each row's token, and the log-probabilities of the distribution it was drawn
        from (None for greedy rows, which draw nothing)."""
        chosen = [0] * len(rows)
        drawn_from: list[torch.Tensor | None] = [None] * len(rows)
        for i, (job, _) in enumerate(rows):
            if finish[i] is not None:
                continue
            params = job.params
            row = logits[i]
            if self.unsampled_ids:  # drawn without them; the raw logprobs keep them
                row = row.clone()
                row[self.unsampled_ids] = -math.inf
            if params.temperature <= 0:
                chosen[i] = int(row.argmax())
                continue
            probs = torch.softmax(row / params.temperature, dim=-1)
            if params.min_p > 0:
                probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
            if 0 < params.top_k < probs.shape[-1]:
                kth = probs.topk(params.top_k).values[-1]
                probs = probs.masked_fill(probs < kth, 0.0)
            if params.top_p < 1.0:
                ordered, order = probs.sort(descending=True)
                keep = ordered.cumsum(0) - ordered < params.top_p
                probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
            chosen[i] = int(torch.multinomial(probs, 1, generator=generators[id(job)]))
            if self.processed_logprobs:
                drawn_from[i] = torch.log(probs / probs.sum())
        return chosen, drawn_from

    def _check_stop(self, params: SamplingParams, tokens: list[int]) -> tuple[str | None, str]:
        text = self.decode(tokens)
        if tokens[-1] in self.eos_ids and not params.ignore_eos:
            return "stop", text
        if tokens[-1] in params.stop_token_ids:
            return "stop", self.decode(tokens[:-1])
        for stop in params.stop:
            at = text.find(stop)
            if at >= 0:
                return "stop", text[:at]
        if len(tokens) >= params.max_tokens:
            return "length", text
        return None, text
