"""A tiny real model and tokenizer, built locally, for tests and the CPU quickstart.

Nothing can be downloaded here, yet the whole stack (tokenizer, chat template,
inference server, vLLM, trainer) must run on a real Hugging Face model. This
kit builds one from scratch in about a minute:

- a byte-level BPE tokenizer (the `tokenizers` library) with ChatML special
  tokens and chat template, wrapped as a `PreTrainedTokenizerFast`;
- a Llama-architecture causal LM of ~0.25M parameters (head_dim 32, which vLLM's
  CPU attention supports; not Qwen2, whose model_type makes transformers swap
  in a different tokenizer class);
- trained to read "What is a + b mod 10?" and answer with a digit, right about
  30% of the time when sampled (`tiny_model_training` says how, and why the
  method cannot depend on floating-point luck).

The build checks the result before anything is written (`check_reading`): a
model that does not read the question raises `TinyModelCheckFailed` naming
the measured figures, and is never cached. What was measured, and on which
CPU and library versions, is saved beside the weights (`BUILD_RECORD`).

Both reload offline with `AutoTokenizer` / `AutoModelForCausalLM`. The build
is deterministic for a machine and a seed (one CPU thread, fixed seeds) and
cached, so a test session builds it once.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator

from atroposlib.utils.cache_dir import default_cache_dir
from atroposlib.utils.machine import machine_facts
from atroposlib.utils.tiny_model_training import (
    Reading,
    question_messages,
    train_to_read,
)
from atroposlib.utils.torch_threads import one_torch_thread

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
# 3: trained to read the question with reading probes, checked before caching
KIT_VERSION = 3
BUILD_RECORD = "atropos_tiny_model.json"
# How far the measured figures may stray from what the spec trains toward.
P_RIGHT_TOLERANCE = 0.05
GREEDY_TOLERANCE = 0.1
MIN_GREEDY_ACCURACY = 0.3  # a question-blind model gets 0.1
MIN_P_END = 0.9


class TinyModelSpec(BaseModel):
    """What to build; every field changes the result, so all of them key the cache."""

    seed: int = Field(0, description="Seed for the corpus, the initial weights and training.")
    vocab_size: int = Field(512, ge=300, description="BPE vocabulary size (incl. 256 bytes).")
    hidden_size: int = Field(96, description="Model width (head_dim is fixed at 32).")
    num_layers: int = Field(
        2, ge=2, description="Decoder layers (the first reads the digits, the rest add them)."
    )
    intermediate_size: int = Field(256, description="MLP width.")
    max_position_embeddings: int = Field(512, description="Longest sequence the model accepts.")
    corpus_size: int = Field(
        4000, ge=10, description="Generated conversations the tokenizer is trained on."
    )
    max_steps: int = Field(
        1500, ge=0, description="Most training steps (it usually converges in 300-450)."
    )
    learning_rate: float = Field(3e-3, gt=0, description="AdamW learning rate.")
    right_probability: float = Field(
        0.3, gt=0.0, lt=1.0, description="p(right digit) the model is trained to, per question."
    )
    distractor_probability: float = Field(
        0.4,
        ge=0.0,
        lt=1.0,
        description="p(one wrong digit) on the confused questions, where greedy decoding is wrong "
        "if it exceeds right_probability.",
    )
    confused_fraction: float = Field(
        0.5, ge=0.0, le=1.0, description="Share of questions with a distractor."
    )

    @model_validator(mode="after")
    def _probabilities_fit(self) -> TinyModelSpec:
        if self.right_probability + self.distractor_probability > 1.0:
            raise ValueError("right_probability + distractor_probability must be at most 1")
        return self

    def cache_key(self) -> str:
        fields = "-".join(f"{v}" for v in self.model_dump().values())
        return f"tiny-v{KIT_VERSION}-{fields}"

    def expected_greedy_accuracy(self) -> float:
        confused = self.distractor_probability > self.right_probability
        return 1.0 - self.confused_fraction if confused else 1.0


TEACHER_SPEC = TinyModelSpec(right_probability=0.9, distractor_probability=0.05)
"""The tiny model trained to be right 90% of the time: the distillation teacher of the
CPU recipe (configs/distill_cpu.yaml). Same corpus and seed, so the same tokenizer."""
NAMED_TINY_MODELS = {"tiny": TinyModelSpec(), "tiny-teacher": TEACHER_SPEC}
"""The names a launch config may give for a locally built tiny text model."""
TINY_VLM_NAME = "tiny-vl"
"""The locally built tiny vision-language model's name (`atroposlib.utils.tiny_vlm`)."""
TINY_MODEL_NAMES = (*NAMED_TINY_MODELS, TINY_VLM_NAME)


class TinyModelCheckFailed(RuntimeError):
    """The build produced a model that does not read the question; nothing was saved."""


def generate_corpus(spec: TinyModelSpec) -> Iterator[list[dict[str, str]]]:
    """ChatML conversations (system line, question, right digit): the tokenizer's corpus."""
    rng = random.Random(spec.seed)
    for _ in range(spec.corpus_size):
        a, b = rng.randrange(10), rng.randrange(10)
        yield [*question_messages(a, b), {"role": "assistant", "content": str((a + b) % 10)}]


def build_tokenizer(texts: list[str], spec: TinyModelSpec):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
        model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def check_reading(reading: Reading, spec: TinyModelSpec) -> list[str]:
    """What is wrong with a build's figures, one sentence each; empty when it passes."""
    least = max(MIN_GREEDY_ACCURACY, spec.expected_greedy_accuracy() - GREEDY_TOLERANCE)
    return figure_problems(
        reading.p_right,
        spec.right_probability,
        P_RIGHT_TOLERANCE,
        reading.greedy_accuracy,
        least,
        "a question-blind model gets 0.10",
        reading.p_end_after_digit,
    )


def figure_problems(
    p_right: float,
    right_probability: float,
    p_right_tolerance: float,
    greedy_accuracy: float,
    least_greedy: float,
    blind: str,
    p_end: float,
) -> list[str]:
    """A tiny model's build figures against their marks (the text kit's and the VLM's)."""
    problems = []
    low, high = right_probability - p_right_tolerance, right_probability + p_right_tolerance
    if not low <= p_right <= high:
        problems.append(f"p(right) is {p_right:.3f}, outside {low:.2f}-{high:.2f}")
    if greedy_accuracy < least_greedy:
        problems.append(
            f"greedy accuracy is {greedy_accuracy:.2f}, below {least_greedy:.2f} ({blind})"
        )
    if p_end < MIN_P_END:
        problems.append(f"p(<|im_end|> after the digit) is {p_end:.3f}, below {MIN_P_END}")
    return problems


def build_tiny_model(
    out_dir: str | os.PathLike[str], spec: TinyModelSpec | None = None, verify: bool = True
) -> Path:
    """Build tokenizer + model into `out_dir` (created; must not hold another model).

    With `verify` (always, for the cache) a model that fails `check_reading`
    raises `TinyModelCheckFailed` and nothing is written.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = spec or TinyModelSpec()
    started = time.monotonic()
    with one_torch_thread():
        tokenizer = build_tokenizer([render_chatml(conv) for conv in generate_corpus(spec)], spec)
        torch.manual_seed(spec.seed)
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_layers,
            num_attention_heads=spec.hidden_size // 32,
            num_key_value_heads=spec.hidden_size // 32,
            head_dim=32,
            max_position_embeddings=spec.max_position_embeddings,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            dtype="float32",  # transformers 5 name; `torch_dtype` is its deprecated alias
        )
        model = LlamaForCausalLM(config)
        training, reading = train_to_read(model, tokenizer, spec)
    record = {
        "kit_version": KIT_VERSION,
        "spec": spec.model_dump(),
        "steps": training.steps,
        "converged": training.converged,
        "seconds": round(training.seconds, 1),
        "build_seconds": round(time.monotonic() - started, 1),
        "reading": reading.model_dump(),
        "machine": machine_facts(),
    }
    problems = check_reading(reading, spec)
    if verify and problems:
        raise TinyModelCheckFailed(_failure_message(problems, record))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / BUILD_RECORD).write_text(json.dumps(record, indent=2))
    return out


def _failure_message(problems: list[str], record: dict[str, Any]) -> str:
    machine = record["machine"]
    return (
        f"the tiny model does not read the question after {record['steps']} steps: "
        + "; ".join(problems)
        + f". Nothing was saved. Built with seed {record['spec']['seed']} on {machine['cpu']} "
        f"(torch kernels {machine['torch_cpu_capability']}, torch {machine['torch_version']}, "
        f"transformers {machine['transformers_version']}, "
        f"tokenizers {machine['tokenizers_version']}); please report these figures."
    )


def read_build_record(model_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What a tiny-model build measured, or None for any other model."""
    try:
        return json.loads((Path(model_dir) / BUILD_RECORD).read_text())
    except (OSError, ValueError):
        return None


def parameter_count(model_dir: str | os.PathLike[str]) -> int:
    """Parameters in `model.safetensors`, read from its header alone (no torch import)."""
    with open(Path(model_dir) / "model.safetensors", "rb") as weights:
        header = json.loads(weights.read(int.from_bytes(weights.read(8), "little")))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def describe_tiny_model(model_dir: str | os.PathLike[str]) -> str:
    """Its figures in one line: parameters, vocabulary, context, and how its build went."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    text = config.get("text_config", config)  # a VLM's language model's
    line = (
        f"{parameter_count(model_dir):,} parameters, vocab {text['vocab_size']}, "
        f"context {text['max_position_embeddings']}"
    )
    record = read_build_record(model_dir)
    if record is not None:
        seconds = record.get("build_seconds", record["seconds"])  # builds before it: training
        greedy = record["reading"]["greedy_accuracy"]
        line += f" (build: {seconds:.0f} s, {record['steps']} steps, greedy accuracy {greedy:.2f})"
    return line


def render_chatml(conversation: list[dict[str, str]]) -> str:
    """A conversation as the kits' chat template writes it (the tokenizer's corpus)."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conversation)


def ensure_tiny_model(
    spec: TinyModelSpec | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Path of the cached tiny model for `spec`, building it on first use."""
    spec = spec or TinyModelSpec()
    return ensure_built(spec.cache_key(), lambda out: build_tiny_model(out, spec), cache_dir)


def ensure_built(
    key: str, build: Callable[[Path], Any], cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """`cache_dir/key`, made by `build(staging_dir)` on first use (the tiny models).

    Safe when several processes ask at once: one builds under a file lock into a
    temporary directory that is renamed into place when complete.
    """
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = root / key
    if (target / "config.json").exists():
        return target
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
            try:
                build(staging)
                staging.rename(target)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    return target
