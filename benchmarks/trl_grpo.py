"""TRL's GRPOTrainer on the CPU quickstart's workload: the yardstick for `weight_sync.py`.

The same tiny model, the same mod-10 questions (system line and wording from
`atroposlib.utils.tiny_model_training`), the same reward (1 for exactly the
right digit), and the quickstart's shape: `--steps` steps of 8 prompts x 8
samples, at most 4 new tokens at temperature 1, lr 5e-4 with 5 warm-up steps,
no KL term, one torch thread (the quickstart gives its trainer one core and its
engine the other). TRL generates in-process with transformers and alternates
generation and training; Atropos runs them side by side in separate processes.

TRL is not a dependency of this project. Run it from a venv that has it:

    python3 -m venv /tmp/trl && /tmp/trl/bin/pip install torch==2.13.0 trl \\
        transformers==5.23.0 -c scripts/constraints.txt
    /tmp/trl/bin/python benchmarks/trl_grpo.py --model ~/.cache/atroposlib/tiny-v3-...

(`atropos-make-tiny-model DIR` builds the model; `python -c "from
atroposlib.utils.tiny_model import ensure_tiny_model; print(ensure_tiny_model())"`
prints the cached one.) It prints the training wall time of `trainer.train()`
and the mean reward over the first and the last 10 steps; the last line reads
`trl-grpo: training s T, reward first10 A last10 B`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # for the question wording only; atroposlib need not be installed

from atroposlib.utils.tiny_model_training import SYSTEM_PROMPT, question_text  # noqa: E402

PROMPTS_PER_STEP = 8
SAMPLES_PER_PROMPT = 8


def problems(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": question_text(a, b)},
                ],
                "answer": str((a + b) % 10),
            }
        )
    return rows


def right_digit(completions, answer, **_) -> list[float]:
    """The quickstart's reward: 1.0 for exactly the right digit."""
    return [
        1.0 if completion[0]["content"].strip() == expected else 0.0
        for completion, expected in zip(completions, answer, strict=True)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the tiny model's directory")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    dataset = Dataset.from_list(problems(args.steps * PROMPTS_PER_STEP, args.seed))
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-"),
        max_steps=args.steps,
        per_device_train_batch_size=PROMPTS_PER_STEP * SAMPLES_PER_PROMPT,
        num_generations=SAMPLES_PER_PROMPT,
        max_completion_length=4,
        temperature=1.0,
        learning_rate=5e-4,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=5,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=args.seed,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(args.model),
        processing_class=AutoTokenizer.from_pretrained(args.model),
        reward_funcs=right_digit,
        args=config,
        train_dataset=dataset,
    )
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    first, last = statistics.mean(rewards[:10]), statistics.mean(rewards[-10:])
    print(f"trl {__import__('trl').__version__}: {len(rewards)} steps in {seconds:.1f}s")
    print(f"trl-grpo: training s {seconds:.1f}, reward first10 {first:.3f} last10 {last:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
