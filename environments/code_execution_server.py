"""Code execution: write a Python function; hidden tests run in the sandbox decide the reward.

Task: HumanEval-style. The prompt is a function signature with its docstring; the answer
is the whole function (in a ```` ```python ```` fence, the last fence wins, or bare) or
just its body, which is then appended to the prompt.

Reward: the fraction of the problem's hidden test cases the code passes, each case a
top-level assert of the dataset's `check(candidate)`. The program (answer + tests) runs
in `atroposlib.envs.sandbox` (time, memory, process and file limits, no network, no
view of the host's files beyond the interpreter's) through the harness in
`code_execution_harness.py`: the answer and the hidden tests run in two sandboxes joined
by a pipe, so the answer cannot read the tests or touch the tally; its docstring lists
what that stops. Without bubblewrap the env refuses to start unless `--env.sandbox
namespaces` opts in. Partial credit, rather than all-or-nothing, gives a group of
almost-right programs a gradient.

Data: the columns of openai/openai_humaneval (`task_id`, `prompt`, `canonical_solution`,
`test`, `entry_point`). HumanEval is an evaluation set (one split, "test"), so by default
both `--env.data_source hub` splits read it; point `--env.hub_dataset` /
`--env.hub_train_split` at a training set in the same columns for real training. The
shipped sample (environments/data/code_execution/) has 20 authored problems, 14 to train
and 6 to evaluate, with their canonical solutions (each passes its own tests).
Upstream's code_execution_server trains on NousResearch/RLVR_Coding_Problems
(stdin/stdout problems judged on a remote Modal endpoint); this env keeps the judge local.

Evaluate: greedy pass@1 (every case passed) and the mean fraction of cases, one sample
per problem with its case counts.

Offline, on the shipped sample and the tiny model (environments/README.md serves it). A
prompt here takes 280-400 of the tiny model's 512 tokens of context, so `max_tokens`
drops to 96; and as the tiny model knows only mod-10 arithmetic, the run checks the
pipeline (data, prompt, sampling, the sandboxed tests, the groups file and its viewer),
not the task:

    python environments/code_execution_server.py process --env.total_steps 2 \\
        --env.group_size 2 --env.max_tokens 96 --env.ensure_scores_are_not_same false \\
        --env.use_wandb false --env.tokenizer_name ./tiny-model \\
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name tiny
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.data_source import DataSourceConfig, load_rows
from atroposlib.envs.sandbox import SandboxLimits, require_isolation
from atroposlib.envs.single_turn import Sample, SingleTurnConfig, SingleTurnEnv
from environments.code_execution_harness import CodeRun, count_cases, run_tests

SAMPLE_DIR = Path(__file__).resolve().parent / "data" / "code_execution"
SYSTEM_PROMPT = (
    "You are an expert Python programmer. Complete the function the user gives you. "
    "Reply with the complete function in one ```python code block."
)
COLUMNS = ("task_id", "prompt", "test", "entry_point")


def item_from_row(row: dict[str, Any]) -> dict[str, Any]:
    """A HumanEval-shaped row as an item (the columns the harness needs, cases counted)."""
    missing = [c for c in COLUMNS if not row.get(c)]
    if missing:
        raise ValueError(f"row {row.get('task_id')!r} lacks {missing}")
    item = {c: row[c] for c in COLUMNS}
    item["cases"] = count_cases(row["test"])
    return item


class CodeExecutionConfig(SingleTurnConfig, DataSourceConfig):
    """`SingleTurnConfig`, where the problems come from, and the sandbox limits."""

    hub_dataset: str = Field("openai/openai_humaneval", description="Hub dataset (HumanEval).")
    hub_train_split: str = Field("test", description="Hub split for training problems.")
    hub_eval_split: str = Field("test", description="Hub split for evaluation problems.")
    max_tokens: int = Field(1024, ge=1, description="Most completion tokens per rollout.")
    eval_size: int = Field(164, ge=1, description="Most problems in the greedy evaluation.")
    wall_time_s: float = Field(10.0, gt=0, description="Wall-clock limit of one test run.")
    cpu_time_s: int = Field(5, ge=1, description="CPU-time limit of one test run.")
    memory_mb: int = Field(
        512,
        ge=64,
        description="Address space of each of an answer's two sandboxes (solution, judge), "
        "all its processes together.",
    )
    memory_cgroup: bool = Field(
        True,
        description="Each sandbox in a memory cgroup capped at memory_mb; the env refuses "
        "to start where none can be made. False: the address-space rlimit alone, which "
        "does not count memory held unmapped (a memfd).",
    )
    case_timeout_s: float = Field(3.0, gt=0, description="Time one test case may take.")
    max_concurrent_runs: int = Field(8, ge=1, description="Sandboxed runs at once.")
    sandbox: Literal["bubblewrap", "namespaces"] = Field(
        "bubblewrap",
        description="How answers are isolated. 'bubblewrap' (apt install bubblewrap) shows "
        "them only the interpreter's files; 'namespaces' is the explicit opt-in for hosts "
        "without it (root only; host files stay readable except the project, homes and "
        "data caches). The env refuses to start when the chosen mode cannot run.",
    )


class CodeExecutionEnv(SingleTurnEnv):
    """Functions judged by hidden tests in the sandbox; reward = share of cases passed."""

    name = "code_execution"
    env_config_cls = CodeExecutionConfig
    config: CodeExecutionConfig
    config_defaults = {
        "tokenizer_name": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
        "group_size": 8,
        "max_token_length": 2048,
        "steps_per_eval": 50,
        "use_wandb": True,
    }

    async def setup(self) -> None:
        config = self.config
        train = load_rows(config, "train", SAMPLE_DIR, hub_split=config.hub_train_split)
        test = load_rows(config, "test", SAMPLE_DIR, hub_split=config.hub_eval_split)
        self.train_items = [item_from_row(row) for row in train]
        self.eval_items = [item_from_row(row) for row in test]
        self.shuffle_train_items()
        self.limits = SandboxLimits(
            wall_time_s=config.wall_time_s,
            cpu_time_s=config.cpu_time_s,
            memory_mb=config.memory_mb,
            isolation=config.sandbox,
            hidden_paths=self.answers_on_disk(),
            memory_cgroup=config.memory_cgroup,
        )
        require_isolation(config.sandbox, config.memory_cgroup)
        self.runs = asyncio.Semaphore(config.max_concurrent_runs)

    def answers_on_disk(self) -> list[str]:
        """Where this run keeps what would solve a problem without solving it: the
        dataset (its canonical solutions), the groups and evaluations written (answers
        that scored 1.0). A `namespaces` run sees them empty (SBX-B of the security
        review), as it sees the env's state dir; bubblewrap shows none of the host."""
        config = self.config
        files = [config.dataset_path, config.data_path_to_save_groups]
        found = [os.path.dirname(os.path.abspath(f)) for f in files if f]
        evals = config.data_dir_to_save_evals
        return found + ([os.path.abspath(evals)] if evals else [])

    def messages_for(self, item: dict[str, Any]) -> list[dict[str, str]]:
        request = f"Complete this function:\n```python\n{item['prompt']}```"
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": request},
        ]

    async def judge(self, completion: str, item: dict[str, Any]) -> CodeRun:
        """Run one answer against the item's hidden tests (at most max_concurrent_runs)."""
        async with self.runs:
            return await run_tests(completion, item, self.limits, self.config.case_timeout_s)

    async def score(self, completion: str, item: dict[str, Any]) -> float:
        return (await self.judge(completion, item)).score

    async def eval_sample(self, item: dict[str, Any], sample: Sample) -> dict[str, Any]:
        run = await self.judge(sample.text, item)
        return {
            "task_id": item["task_id"],
            "prompt": item["prompt"],
            "completion": sample.text,
            "passed_cases": run.passed,
            "total_cases": run.total,
            "timed_out": bool(run.result and run.result.timed_out),
            "score": run.score,
        }

    def eval_summary(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Greedy pass@1 and the mean share of cases passed."""
        count = max(1, len(samples))
        return {
            "eval/pass@1": sum(s["passed_cases"] == s["total_cases"] for s in samples) / count,
            "eval/case_pass_rate": sum(s["score"] for s in samples) / count,
        }


if __name__ == "__main__":
    CodeExecutionEnv.cli()
