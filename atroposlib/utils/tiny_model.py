"""A tiny real model and tokenizer, built locally, for tests and the CPU quickstart.

Nothing can be downloaded here, yet the whole stack (tokenizer, chat template,
inference server, vLLM, trainer) must run on a real Hugging Face model. This
kit builds one from scratch in seconds:

- a byte-level BPE tokenizer (the `tokenizers` library) with ChatML special
  tokens and chat template, wrapped as a `PreTrainedTokenizerFast`;
- a Llama-architecture causal LM of ~0.25M parameters (head_dim 32, which vLLM's
  CPU attention supports; not Qwen2, whose model_type makes transformers swap
  in a different tokenizer class);
- training in two phases on generated ChatML conversations ("What is a + b
  mod 10?"). Plain next-token training on a corpus that is right 30% of the
  time never makes a model this small read the question: it learns the
  answer *format* and a question-blind guess (10% right). So phase 1
  (teach) trains on right answers, with an extra loss on the answer token,
  for `teach_steps` (or until p(right) > 0.9; with the defaults it ends near
  0.7); phase 2 (dilute) goes on at a
  low learning rate on the 30%-right corpus until p(right) falls to
  `start_accuracy`. The result reads the question, is right about a third of
  the time when sampled, and has a real, learnable preference left for RL to
  sharpen (the CPU quickstart takes it from ~0.3 to ~0.6 in 100 steps).

Both are saved with `save_pretrained` and reload offline with
`AutoTokenizer` / `AutoModelForCausalLM`. The build is deterministic for a seed
(one CPU thread, fixed seeds) and cached, so a test session builds it once.
"""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, Field

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
KIT_VERSION = 2
# progress on a terminal only: piped into a log, a bar is thousands of lines
PROGRESS = {"unit": "step", "leave": False, "disable": None, "mininterval": 1.0}


class TinyModelSpec(BaseModel):
    """What to build; every field changes the result, so all of them key the cache."""

    seed: int = Field(0, description="Seed for the corpus, the initial weights and training.")
    vocab_size: int = Field(512, ge=300, description="BPE vocabulary size (incl. 256 bytes).")
    hidden_size: int = Field(96, description="Model width (head_dim is fixed at 32).")
    num_layers: int = Field(2, ge=1, description="Decoder layers.")
    intermediate_size: int = Field(256, description="MLP width.")
    max_position_embeddings: int = Field(512, description="Longest sequence the model accepts.")
    teach_steps: int = Field(
        6000, ge=0, description="Most steps of phase 1 (right answers + answer-token loss)."
    )
    train_steps: int = Field(
        3000, ge=0, description="Most steps of phase 2 (the corpus, right correct_fraction of it)."
    )
    start_accuracy: float = Field(
        0.35, ge=0.0, le=1.0, description="Phase 2 stops once p(right answer) falls below this."
    )
    corpus_size: int = Field(4000, ge=10, description="Generated conversations.")
    correct_fraction: float = Field(
        0.3, ge=0.0, le=1.0, description="Share of corpus answers that are right."
    )

    def cache_key(self) -> str:
        fields = "-".join(f"{v}" for v in self.model_dump().values())
        return f"tiny-v{KIT_VERSION}-{fields}"


def arithmetic_question(rng: random.Random) -> tuple[str, str]:
    """A question whose answer is one digit: (a + b) mod 10."""
    a, b = rng.randrange(10), rng.randrange(10)
    return f"What is {a} + {b} mod 10?", str((a + b) % 10)


def generate_corpus(
    spec: TinyModelSpec, correct_fraction: float | None = None
) -> Iterator[list[dict[str, str]]]:
    """ChatML conversations: a system line, an arithmetic question, a one-digit answer."""
    rng = random.Random(spec.seed)
    right = spec.correct_fraction if correct_fraction is None else correct_fraction
    for _ in range(spec.corpus_size):
        question, answer = arithmetic_question(rng)
        if rng.random() >= right:
            answer = str(rng.randrange(10))
        yield [
            {"role": "system", "content": "Answer with one digit."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]


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


def build_tiny_model(out_dir: str | os.PathLike[str], spec: TinyModelSpec | None = None) -> Path:
    """Build tokenizer + model into `out_dir` (created; must not hold another model)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = spec or TinyModelSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    conversations = list(generate_corpus(spec))
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokenizer = build_tokenizer([_render(conv) for conv in conversations], spec)
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
            torch_dtype="float32",
        )
        model = LlamaForCausalLM(config)
        _train(model, tokenizer, conversations, spec)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        torch.set_num_threads(previous_threads)
    return out


def _render(conversation: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conversation)


def _encode(tokenizer, conversations: list[list[dict[str, str]]]):
    """Padded ids, LM labels, and the position of each answer digit."""
    import torch

    rows = [tokenizer(_render(conv))["input_ids"] for conv in conversations]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    answer_at = torch.tensor([len(r) - 3 for r in rows])  # digit, <|im_end|>, newline
    return ids, ids.masked_fill(ids == pad, -100), answer_at


class AnswerProbe:
    """Mean probability of the right digit over all 100 questions (no sampling)."""

    def __init__(self, tokenizer) -> None:
        import torch

        pairs = [(a, b) for a in range(10) for b in range(10)]
        prompts = [
            tokenizer.apply_chat_template(
                [
                    {"role": "system", "content": "Answer with one digit."},
                    {"role": "user", "content": f"What is {a} + {b} mod 10?"},
                ],
                tokenize=False,
                add_generation_prompt=True,
            )
            for a, b in pairs
        ]
        self.ids = torch.tensor(tokenizer(prompts, add_special_tokens=False)["input_ids"])
        digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
        self.right = torch.tensor([digits[(a + b) % 10] for a, b in pairs])

    def __call__(self, model) -> float:
        import torch

        model.eval()
        with torch.no_grad():
            probs = torch.softmax(model(self.ids).logits[:, -1], -1)
        model.train()
        return float(probs[torch.arange(len(self.right)), self.right].mean())


def _train(
    model, tokenizer, conversations: list[list[dict[str, str]]], spec: TinyModelSpec
) -> None:
    """Teach, then dilute (see the module docstring); a few minutes on one CPU thread."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(spec.seed)
    probe = AnswerProbe(tokenizer)
    model.train()
    ids, labels, answer_at = _encode(tokenizer, list(generate_corpus(spec, correct_fraction=1.0)))
    rows = torch.arange(32)

    def teach_loss(pick):
        out = model(input_ids=ids[pick], labels=labels[pick])
        answer_logits = out.logits[rows, answer_at[pick] - 1]
        return out.loss + F.cross_entropy(answer_logits, ids[pick, answer_at[pick]])

    _phase(
        model,
        "teach",
        spec.teach_steps,
        1e-3,
        teach_loss,
        len(ids),
        generator,
        probe,
        check_every=250,
        done=lambda right: right > 0.9,
    )
    diluted, diluted_labels, _ = _encode(tokenizer, conversations)
    _phase(
        model,
        "dilute",
        spec.train_steps,
        3e-4,
        lambda pick: model(input_ids=diluted[pick], labels=diluted_labels[pick]).loss,
        len(diluted),
        generator,
        probe,
        check_every=25,
        done=lambda right: right < spec.start_accuracy,
    )
    model.eval()


def _phase(model, name, steps, lr, batch_loss, rows, generator, probe, check_every, done) -> None:
    """AdamW on random batches of 32 rows, probing every `check_every` steps until `done`."""
    import torch
    from tqdm.auto import tqdm

    bar = tqdm(total=steps, desc=f"tiny model: {name}", **PROGRESS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for step in range(1, steps + 1):
        loss = batch_loss(torch.randint(rows, (32,), generator=generator))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        bar.update()
        if step % check_every == 0:
            right = probe(model)
            bar.set_postfix(p_right=f"{right:.2f}")
            if done(right):
                break
    bar.close()


def default_cache_dir() -> Path:
    base = os.environ.get("ATROPOS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "atroposlib"
    )
    return Path(base)


def ensure_tiny_model(
    spec: TinyModelSpec | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Path of the cached tiny model for `spec`, building it on first use.

    Safe when several processes ask at once: one builds under a file lock into a
    temporary directory that is renamed into place when complete.
    """
    spec = spec or TinyModelSpec()
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = root / spec.cache_key()
    if (target / "config.json").exists():
        return target
    with open(root / f"{spec.cache_key()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
            try:
                build_tiny_model(staging, spec)
                staging.rename(target)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    return target
