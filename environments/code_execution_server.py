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

Offline:

    python environments/code_execution_server.py process --env.total_steps 4 \\
        --env.use_wandb false --env.tokenizer_name <model dir> \\
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name tiny \\
        --openai.server_type vllm
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig
from atroposlib.envs.data_source import DataSourceConfig, load_rows
from atroposlib.envs.sandbox import SandboxLimits, require_isolation
from atroposlib.envs.scored_data import group_from_chat
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


class CodeExecutionConfig(BaseEnvConfig, DataSourceConfig):
    """`BaseEnvConfig`, where the problems come from, sandbox limits and sampling."""

    hub_dataset: str = Field("openai/openai_humaneval", description="Hub dataset (HumanEval).")
    hub_train_split: str = Field("test", description="Hub split for training problems.")
    hub_eval_split: str = Field("test", description="Hub split for evaluation problems.")
    max_tokens: int = Field(1024, ge=1, description="Most completion tokens per rollout.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature for rollouts.")
    eval_size: int = Field(164, ge=1, description="Most problems in the greedy evaluation.")
    seed: int = Field(0, description="Shuffle seed for the training problems.")
    wall_time_s: float = Field(10.0, gt=0, description="Wall-clock limit of one test run.")
    cpu_time_s: int = Field(5, ge=1, description="CPU-time limit of one test run.")
    memory_mb: int = Field(
        512,
        ge=64,
        description="Address space of each of an answer's two sandboxes (solution, judge), "
        "all its processes together.",
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


class CodeExecutionEnv(BaseEnv):
    """Functions judged by hidden tests in the sandbox; reward = share of cases passed."""

    name = "code_execution"
    env_config_cls = CodeExecutionConfig

    @classmethod
    def config_init(cls) -> tuple[CodeExecutionConfig, list[APIServerConfig]]:
        config = CodeExecutionConfig(
            tokenizer_name="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            group_size=8,
            max_token_length=2048,
            steps_per_eval=50,
            use_wandb=True,
        )
        server = APIServerConfig(
            model_name="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            base_url="http://localhost:9001/v1",
            server_type="vllm",
            num_requests_for_eval=64,
        )
        return config, [server]

    async def setup(self) -> None:
        config = self.config
        train = load_rows(config, "train", SAMPLE_DIR, hub_split=config.hub_train_split)
        test = load_rows(config, "test", SAMPLE_DIR, hub_split=config.hub_eval_split)
        self.train = [item_from_row(row) for row in train]
        self.test = [item_from_row(row) for row in test][: config.eval_size]
        random.Random(config.seed).shuffle(self.train)
        self.position = 0
        self.limits = SandboxLimits(
            wall_time_s=config.wall_time_s,
            cpu_time_s=config.cpu_time_s,
            memory_mb=config.memory_mb,
            isolation=config.sandbox,
        )
        require_isolation(config.sandbox)
        self.runs = asyncio.Semaphore(config.max_concurrent_runs)

    async def get_next_item(self) -> dict[str, Any]:
        item = self.train[self.position % len(self.train)]
        self.position += 1
        return item

    @staticmethod
    def messages_for(item: dict[str, Any]) -> list[dict[str, str]]:
        request = f"Complete this function:\n```python\n{item['prompt']}```"
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": request},
        ]

    async def judge(self, completion: str, item: dict[str, Any]) -> CodeRun:
        """Run one answer against the item's hidden tests (at most max_concurrent_runs)."""
        async with self.runs:
            return await run_tests(completion, item, self.limits, self.config.case_timeout_s)

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[dict[str, Any], list]:
        """`group_size` samples through ManagedServer, each scored by running its tests."""
        messages = self.messages_for(item)
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            chat = await managed.chat_completion(
                messages=messages,
                n=self.config.group_size,
                max_tokens=self.config.max_tokens,
                temperature=self.config.temperature,
            )
            nodes = managed.get_state()["nodes"]
        runs = await asyncio.gather(
            *(self.judge(choice.message.content or "", item) for choice in chat.choices)
        )
        return group_from_chat(messages, chat.choices, nodes, [run.score for run in runs]), []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Greedy pass@1 and mean case pass rate over the evaluation problems."""
        started = time.time()

        async def one(item: dict[str, Any]) -> dict[str, Any]:
            chat = await self.server.chat_completion(
                messages=self.messages_for(item),
                max_tokens=self.config.max_tokens,
                temperature=0.0,
                split="eval",
            )
            completion = chat.choices[0].message.content or ""
            run = await self.judge(completion, item)
            return {
                "task_id": item["task_id"],
                "prompt": item["prompt"],
                "completion": completion,
                "passed_cases": run.passed,
                "total_cases": run.total,
                "timed_out": bool(run.result and run.result.timed_out),
                "score": run.score,
            }

        samples = await asyncio.gather(*(one(item) for item in self.test))
        count = max(1, len(samples))
        metrics = {
            "eval/pass@1": sum(s["passed_cases"] == s["total_cases"] for s in samples) / count,
            "eval/case_pass_rate": sum(s["score"] for s in samples) / count,
        }
        await self.evaluate_log(
            metrics,
            start_time=started,
            end_time=time.time(),
            generation_parameters={"temperature": 0.0, "max_tokens": self.config.max_tokens},
            samples=samples,
        )


if __name__ == "__main__":
    CodeExecutionEnv.cli()
