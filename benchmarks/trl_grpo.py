"""TRL's GRPOTrainer on the CPU quickstart's workload: the yardstick for `weight_sync.py`.

The same tiny model, the same mod-10 questions (system line and wording from
`atroposlib.utils.tiny_model_training`), the same reward (1 for exactly the
right digit), and the quickstart's shape: `--steps` steps of 8 prompts x 8
samples, at most 4 new tokens at temperature 1, lr 5e-4 with 5 warm-up steps,
no KL term, in fp32 as the quickstart trains (TRL's GRPOConfig defaults to bf16,
which a CPU without native bf16 emulates about 7x slower, and one with it runs
faster: the figure would measure the CPU's bf16 support, not the trainer).
`--threads` sets torch's threads (the quickstart gives its trainer one core and
its engine the other). TRL generates in-process with transformers and alternates
generation and training; Atropos runs them side by side in separate processes.

TRL is not a dependency of this project. Run it from a venv that has it:

    python3 -m venv /tmp/trl && /tmp/trl/bin/pip install torch==2.13.0 trl \\
        transformers==5.23.0 -c scripts/constraints.txt
    /tmp/trl/bin/python benchmarks/trl_grpo.py --model ~/.cache/atroposlib/tiny-v3-...

(`atropos-make-tiny-model DIR` builds the model; `python -c "from
atroposlib.utils.tiny_model import ensure_tiny_model; print(ensure_tiny_model())"`
prints the cached one.) It prints the training wall time of `trainer.train()`,
the seconds until the mean reward of the last 10 steps first reached 0.5, the
mean reward over the first and the last 10 steps, and whether the machine was
quiet meanwhile (`cpu_share.py`); `--json FILE` also writes them with each
step's time and reward (`trl_pair.py` reads that). The last line reads
`trl-grpo: training s T, to 0.5 S, reward first10 A last10 B`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # for the question wording only; atroposlib need not be installed

from cpu_share import CpuWatch  # noqa: E402
from learning_curve import Curve  # noqa: E402

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


def train(model: str, steps: int, seed: int, threads: int) -> dict:
    """TRL's GRPOTrainer on the workload: its timing, each step's reward and when."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    dataset = Dataset.from_list(problems(steps * PROMPTS_PER_STEP, seed))
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-"),
        max_steps=steps,
        per_device_train_batch_size=PROMPTS_PER_STEP * SAMPLES_PER_PROMPT,
        num_generations=SAMPLES_PER_PROMPT,
        max_completion_length=4,
        temperature=1.0,
        learning_rate=5e-4,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=5,
        beta=0.0,
        bf16=False,  # fp32, as the quickstart's trainer (see the docstring)
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=seed,
        disable_tqdm=True,
    )
    curve = Curve()

    class StepTimes(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                curve.add(time.perf_counter() - started, logs["reward"])

    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model),
        processing_class=AutoTokenizer.from_pretrained(model),
        reward_funcs=right_digit,
        args=config,
        train_dataset=dataset,
        callbacks=[StepTimes()],
    )
    with CpuWatch() as watch:
        started = time.perf_counter()
        trainer.train()
    return {
        "system": f"trl {__import__('trl').__version__}, {threads} threads",
        "training_s": watch.wall_s,
        **curve.summary(),
        "others_share": watch.others_share,
        "quiet": not watch.busy,
        "cpu": watch.verdict(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the tiny model's directory")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = train(args.model, args.steps, args.seed, args.threads)
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    print(f"{result['system']}: {len(result['scores'])} steps; {result['cpu']}")
    print(
        f"trl-grpo: training s {result['training_s']:.1f}, to 0.5 {result['to_target_s']}, "
        f"reward first10 {result['first10']:.3f} last10 {result['last10']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
