"""How the tiny model learns to read the question, on every CPU.

Why not plain next-token training: (a + b) mod 10 carries no information about
either digit alone (for a fixed a, every answer is equally likely), so at
initialisation the gradient that would teach attention to fetch a digit is
zero. A small model then sits on the question-blind answer (10% right) until
floating-point noise happens to break the symmetry: after ~4,000 steps with
AVX-512 kernels, never with AVX2 (issue 10). An outcome must not hang on that.

So the build adds a task with a first-order signal: two linear *reading
probes*, used only during the build and then discarded, must recover a and b
from the first decoder layer's output at the answer position. Attention learns
to fetch both digits within ~100 steps, and the layers above then learn the
100-entry table. The saved model is a plain `LlamaForCausalLM`.

What it is trained toward is a target distribution, not a corpus of sampled
answers: on every question p(right) = `right_probability`; on a seeded
`confused_fraction` of them one wrong "distractor" digit gets
`distractor_probability`, above the right one, so greedy decoding is wrong
there; the rest of the mass is spread evenly over the other digits. After any
digit comes `<|im_end|>`. RL then has a real preference to sharpen, and both
the sampled score (~0.3) and the greedy eval (~0.5) have room to rise.

Every step sees all 100 questions (no sampling of examples), on one thread with
fixed seeds: the build is deterministic for a machine and a seed. It stops when
KL(target || model) falls below `CONVERGED_KL`; `measure` then gives the figures
the build is checked against.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    import torch

SYSTEM_PROMPT = "Answer with one digit."
READ_LAYER = 1  # index into hidden_states: the first decoder layer's output
CONVERGED_KL = 0.01
CHECK_EVERY = 25
PROGRESS = {"unit": "step", "leave": False, "disable": None, "mininterval": 1.0}


def question_text(a: int, b: int) -> str:
    return f"What is {a} + {b} mod 10?"


def question_messages(a: int, b: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question_text(a, b)},
    ]


@dataclass
class Questions:
    """All 100 prompts as the environments send them, and what answers them."""

    ids: torch.Tensor  # [100, prompt length], every prompt tokenizes to the same length
    first: torch.Tensor  # a, per question
    second: torch.Tensor  # b
    right: torch.Tensor  # token id of the right digit
    digits: torch.Tensor  # token ids of "0".."9"
    end: int  # <|im_end|>

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> Questions:
        import torch

        pairs = [(a, b) for a in range(10) for b in range(10)]
        prompts = [
            tokenizer.apply_chat_template(
                question_messages(a, b), tokenize=False, add_generation_prompt=True
            )
            for a, b in pairs
        ]
        digits = torch.tensor([tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)])
        return cls(
            ids=torch.tensor(tokenizer(prompts, add_special_tokens=False)["input_ids"]),
            first=torch.tensor([a for a, _ in pairs]),
            second=torch.tensor([b for _, b in pairs]),
            right=digits[torch.tensor([(a + b) % 10 for a, b in pairs])],
            digits=digits,
            end=tokenizer.eos_token_id,
        )

    def with_answers(self, answers: torch.Tensor) -> torch.Tensor:
        """Each prompt followed by one answer token."""
        import torch

        return torch.cat([self.ids, answers[:, None]], 1)


def answer_targets(questions: Questions, vocab: int, spec: Any) -> torch.Tensor:
    """[100, vocab]: the distribution over the answer token (see the module docstring)."""
    import torch

    rng = random.Random(spec.seed)
    count = len(questions.right)
    confused = set(rng.sample(range(count), round(spec.confused_fraction * count)))
    targets = torch.zeros(count, vocab)
    for i in range(count):
        right = int(questions.right[i])
        wrong = [int(d) for d in questions.digits if int(d) != right]
        distractor = rng.choice(wrong)
        if i in confused:
            rest = (1.0 - spec.right_probability - spec.distractor_probability) / 8
            targets[i, wrong] = rest
            targets[i, distractor] = spec.distractor_probability
        else:
            targets[i, wrong] = (1.0 - spec.right_probability) / 9
        targets[i, right] = spec.right_probability
    return targets


class Reading(BaseModel):
    """How well the model reads the question, measured on all 100 questions."""

    p_right: float
    """Mean probability of the right digit (a question-blind model: 0.10)."""
    greedy_accuracy: float
    """Share of questions whose most likely answer is the right digit (blind: 0.10)."""
    p_end_after_digit: float
    """Mean probability of <|im_end|> right after an answer digit."""
    kl_to_target: float
    """KL(target || model) over the answer token, mean per question."""


def _kl(logits: torch.Tensor, targets: torch.Tensor) -> float:
    import torch

    logp = torch.log_softmax(logits.detach(), -1)
    terms = torch.where(targets > 0, targets * (targets.clamp_min(1e-12).log() - logp), 0.0)
    return float(terms.sum(-1).mean())


def measure(model: Any, questions: Questions, targets: torch.Tensor) -> Reading:
    import torch

    model.eval()
    with torch.no_grad():
        answer_logits = model(questions.ids).logits[:, -1]
        probs = torch.softmax(answer_logits, -1)
        rows = torch.arange(len(questions.right))
        # every digit after every question: the end token must follow any answer
        every_digit = torch.cat(
            [questions.with_answers(questions.digits.roll(k)[rows % 10]) for k in range(10)]
        )
        end = torch.softmax(model(every_digit).logits[:, -1], -1)[:, questions.end]
    model.train()
    return Reading(
        p_right=float(probs[rows, questions.right].mean()),
        greedy_accuracy=float((probs.argmax(-1) == questions.right).float().mean()),
        p_end_after_digit=float(end.mean()),
        kl_to_target=_kl(answer_logits, targets),
    )


@dataclass
class Training:
    steps: int
    seconds: float
    converged: bool


def train_to_read(model: Any, tokenizer: Any, spec: Any) -> tuple[Training, Reading]:
    """Full-batch AdamW on the prompt (next-token), the answer target, the end token and the
    reading probes."""
    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    questions = Questions.for_tokenizer(tokenizer)
    targets = answer_targets(questions, model.config.vocab_size, spec)
    probes = torch.nn.Linear(model.config.hidden_size, 20)
    generator = torch.Generator().manual_seed(spec.seed)
    optimizer = torch.optim.AdamW(
        [*model.parameters(), *probes.parameters()], lr=spec.learning_rate, weight_decay=0.0
    )
    end = torch.full((len(questions.right),), questions.end)
    started, converged, step = time.monotonic(), False, 0
    model.train()
    bar = tqdm(total=spec.max_steps, desc="tiny model: learning to read", **PROGRESS)
    for step in range(1, spec.max_steps + 1):
        any_digit = questions.digits[torch.randint(10, end.shape, generator=generator)]
        ids = questions.with_answers(any_digit)
        out = model(input_ids=ids, output_hidden_states=True)
        answer_logits = out.logits[:, -2]
        read = probes(out.hidden_states[READ_LAYER][:, -2])
        loss = (
            F.cross_entropy(out.logits[:, :-2].flatten(0, 1), ids[:, 1:-1].flatten())
            + F.cross_entropy(answer_logits, targets)
            + F.cross_entropy(out.logits[:, -1], end)
            + F.cross_entropy(read[:, :10], questions.first)
            + F.cross_entropy(read[:, 10:], questions.second)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        bar.update()
        if step % CHECK_EVERY == 0:
            kl = _kl(answer_logits, targets)
            bar.set_postfix(kl=f"{kl:.3f}")
            if kl < CONVERGED_KL:
                converged = True
                break
    bar.close()
    model.eval()
    training = Training(steps=step, seconds=time.monotonic() - started, converged=converged)
    return training, measure(model, questions, targets)
