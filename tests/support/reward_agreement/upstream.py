"""Seeded adversarial cases for the upstream-named rewards, and upstream's verdicts on them.

The reference is upstream Atropos itself, `atroposlib` 0.4.0 from PyPI, which
`scripts/install_venv.sh` puts in `.venv/reference` (pins in
`scripts/constraints-reference.txt`). Every case runs there, in one subprocess, and
here, in-process, through the same `upstream_runner.outcome`.

A case is one call: a module of `reward_fns`, a class (its `compute`) or function in it,
constructor arguments, a batch of completions and the keyword arguments. Completions are
composed from think-block shapes, answers and tails that hit each reward's edges
(unclosed and repeated tags, `\\boxed` spam, thousands separators, regex metacharacters
in tag names, repeated sentences), wrapped in every completion form `get_content`
accepts and some it does not.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

REFERENCE_DIR = Path(sys.prefix) / "reference"
RUNNER = Path(__file__).with_name("upstream_runner.py")
NOT_INSTALLED = (
    f"upstream atroposlib 0.4.0 is not in {REFERENCE_DIR}: run `bash scripts/install_venv.sh dev`"
)

THINK = [
    "",
    "<think>Let me add: 40 + 2.</think>",
    "<think>\nstep one\nstep two\n</think>\n",
    "<think></think>",
    "<think>   </think>",
    "<think>a</think><think>b</think>",
    "<think>never closed ",
    "</think>",
    "<THINK>upper</THINK>",
    "<think>a<think>b</think></think>",
    " \n<think>lead</think>",
]
ANSWERS = [
    "42",
    "\\boxed{42}",
    "The answer is \\boxed{42}.",
    "#### 42",
    "#### 1,234",
    "\\boxed{1,234}",
    "\\boxed{1234}",
    "\\boxed{\\frac{1}{2}}",
    "\\boxed{0.5}",
    "$\\frac{1}{2}$",
    "1/2",
    "\\boxed{x^2+1}",
    "\\boxed{",
    "\\boxed{42} and \\boxed{41}",
    "\\boxed{41} then \\boxed{42}",
    "\\boxed{42}" * 7,
    "<answer>42</answer>",
    "<answer>\n42\n</answer>",
    "<Answer>42</ANSWER>",
    "The answer is CAT.",
    "cat",
    "",
    "   ",
    "1-Across: CAT\n2-Down: DOG",
    "1-Across: CAT, 2-Down: DOG",
    "3-across: c4t",
    "12-Down: HELLO WORLD",
    "1-Across: CAT\nbut also some prose",
    "<b>bold</b> 42",
    "<axb>42</axb>",
    "<xx>42</xx>",
    "<x+>42</x+>",
    "1-Across:CAT",
    "x12-Across: AB",
    "1-Across: CAT,\n2-Down: DOG,",
    "1-Across: CAT 2-Down: DOG",
    "42 </think> 43",
]
TAILS = [
    "",
    "\n",
    " Done.",
    "\nStep 1: read. Step 2: add. Step 3: check.",
    "\n1. first\n2. second\n3. third",
    "\n- a point\n* another\n• third",
    "\nFirst we add, then we check, and finally we answer.",
    " To begin, analyze and compute; to solve it, apply the rule.",
    " The cat sat on the mat. The cat sat on the mat. The cat sat on the mat.",
    " word word word word word word word word word word word word.",
    " Alpha beta gamma delta. Epsilon zeta eta theta. Iota kappa lambda mu.",
    " We went to the shop. We went to the park. We went to the zoo. We went home.",
]
SOLUTIONS: list[Any] = [
    "42",
    "\\boxed{42}",
    "#### 42",
    42,
    0.5,
    "0.5",
    "\\frac{1}{2}",
    "1,234",
    1234,
    "CAT",
    "cat",
    "x^2+1",
    "",
]


def completion(rng: random.Random) -> Any:
    """One completion: a composed text in one of the forms a reward may be given."""
    text = rng.choice(THINK) + rng.choice(ANSWERS) + rng.choice(TAILS)
    if rng.random() < 0.2:
        text = text.upper() if rng.random() < 0.5 else " " + text + " \n"
    form = rng.random()
    if form < 0.7:
        return text
    if form < 0.8:
        return {"role": "assistant", "content": text}
    if form < 0.85:
        return {"message": {"role": "assistant", "content": text}}
    if form < 0.93:
        return [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": text}]
    return rng.choice([{"role": "assistant", "content": None}, [], {}, "", {"content": text}])


def batch(rng: random.Random) -> list[Any]:
    return [completion(rng) for _ in range(rng.choice([1, 1, 2, 3]))]


def solution_for(rng: random.Random, completions: list[Any]) -> Any:
    if rng.random() < 0.15:
        return [rng.choice(SOLUTIONS) for _ in completions]
    return rng.choice(SOLUTIONS)


def case(module: str, target: str, completions: list[Any], init=None, **kwargs) -> dict:
    return {
        "module": module,
        "target": target,
        "init": init or {},
        "completions": completions,
        "kwargs": kwargs,
    }


def r1_cases(rng: random.Random, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        completions = batch(rng)
        which = rng.choice(["R1Reward", "FormatReasoningReward", "AccuracyXReward"])
        if which == "FormatReasoningReward":
            init = {
                "require_thinking": rng.random() < 0.8,
                "require_response": rng.random() < 0.8,
                "allow_multiple_thinking": rng.random() < 0.2,
            }
            out.append(case("r1_reward", which, completions, init))
            continue
        init = {"exact_match": rng.random() < 0.3, "case_sensitive": rng.random() < 0.3}
        if which == "R1Reward":
            init = {"format_weight": rng.choice([0.5, 1.0]), "accuracy_weight": 1.0}
        solution = solution_for(rng, completions)
        if isinstance(solution, (int, float)):
            solution = str(solution)
        out.append(case("r1_reward", which, completions, init, solution=solution))
    return out


def format_cases(rng: random.Random, n: int) -> list[dict]:
    tags = [["think", "answer"], ["answer"], ["think"], ["b"], ["ANSWER"], ["a.b"], ["x+"], ["x("]]
    out = []
    for _ in range(n):
        init = {
            "preferred_tags": rng.choice(tags),
            "require_all_tags": rng.random() < 0.4,
            "case_sensitive": rng.random() < 0.3,
        }
        out.append(case("format_reward", "FormatReward", batch(rng), init))
    return out


def reasoning_steps_cases(rng: random.Random, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        init = {}
        if rng.random() < 0.3:
            init = {"min_words": rng.choice([0, 5, 30]), "min_steps": rng.choice([1, 2, 5])}
        if rng.random() < 0.2:
            init["pattern_weights"] = {"bullet_points": 1.0, "unknown_kind": 0.5}
        out.append(case("reasoning_steps_reward", "ReasoningStepsReward", batch(rng), init))
    return out


def repetition_cases(rng: random.Random, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        init = {}
        if rng.random() < 0.3:
            init = {"threshold": rng.choice([0.0, 0.05, 0.5]), "min_words": rng.choice([3, 10])}
        completions = batch(rng)
        # longer texts, so the rates (not only the short-text penalty) are exercised
        completions = [
            c + rng.choice(TAILS) + rng.choice(TAILS) if isinstance(c, str) else c
            for c in completions
        ]
        out.append(case("repetition_penalty_reward", "RepetitionPenaltyReward", completions, init))
    return out


def crossword_cases(rng: random.Random, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        init = {}
        if rng.random() < 0.3:
            init = {"penalize_invalid_chars": rng.random() < 0.5, "valid_chars": "catdog"}
        out.append(case("crossword_format_reward", "CrosswordFormatReward", batch(rng), init))
    return out


def accuracy_cases(rng: random.Random, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        completions = batch(rng)
        init = {}
        if rng.random() < 0.3:
            init = {"split_on_think_tag": rng.random() < 0.5, "max_boxed_threshold": 2}
        gold = solution_for(rng, completions)
        key = "ground_truth" if rng.random() < 0.3 else "solution"
        out.append(case("accuracy_reward", "AccuracyReward", completions, init, **{key: gold}))
    return out


def cascading_cases(rng: random.Random, n: int) -> list[dict]:
    return [
        case(
            "cascading_r1_math_reward",
            "cascading_r1_math_reward",
            completions := batch(rng),
            solution=solution_for(rng, completions),
        )
        for _ in range(n)
    ]


def cosine_cases(rng: random.Random, n: int, model_path: str) -> list[dict]:
    out = []
    for _ in range(n):
        init = {"model_name": model_path}
        if rng.random() < 0.3:
            init |= {"scale_factor": rng.choice([0.5, 2.0]), "min_reward": 0.0}
        completions = batch(rng)
        solution = rng.choice(["The answer is 42.", "cat", "", None, 42])
        out.append(
            case("cosine_scaled_reward", "CosineScaledReward", completions, init, solution=solution)
        )
    return out


def combined_cases(rng: random.Random, n: int) -> list[dict]:
    parts = [
        ["format", "reasoning_steps"],
        ["crossword_format"],
        [{"type": "format", "weight": 2.0}],
    ]
    return [
        case(
            "combined_reward",
            "CombinedReward",
            batch(rng),
            {"rewards": rng.choice(parts), "normalization": rng.choice(["none", "sum", "minmax"])},
        )
        for _ in range(n)
    ]


def cases(n: int, seed: int, model_path: str | None) -> list[dict]:
    """About `n` cases per reward; the cosine ones only with a model to embed with."""
    rng = random.Random(seed)
    built = (
        r1_cases(rng, n)
        + format_cases(rng, n)
        + reasoning_steps_cases(rng, n)
        + repetition_cases(rng, n)
        + crossword_cases(rng, n)
        + accuracy_cases(rng, n)
        + cascading_cases(rng, n)
        + combined_cases(rng, n // 4)
    )
    if model_path:
        built += cosine_cases(rng, n // 4, model_path)
    return built


ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""The cosine cases run the tiny model on tiny inputs: a second OpenMP thread only spins,
and on a busy machine that spinning took half of the runner's CPU (20 s against 9 s)."""


def upstream_outcomes(built: list[dict], timeout_s: float = 600) -> list[dict[str, Any]]:
    """Each case's outcome under upstream's rewards (one subprocess for all)."""
    if not (REFERENCE_DIR / "atroposlib").is_dir():
        raise FileNotFoundError(NOT_INSTALLED)
    done = subprocess.run(
        [sys.executable, "-c", RUNNER.read_text(), str(REFERENCE_DIR)],
        input=json.dumps(built),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REFERENCE_DIR,
        env={**os.environ, **ONE_THREAD},
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the upstream runner failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
