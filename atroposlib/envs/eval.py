"""Stand-alone evaluations and the one writer of evaluation results.

Evaluation results go to disk in lighteval's layout (`metrics.json` with
`config_general` and `results`, plus `samples.jsonl`) because that is what
nous-evals and the existing leaderboards read; `BaseEnv.evaluate_log` and
`EvalBase` both write through `evaluate_log` here, so there is one file shape.

`EvalBase` is the light alternative to a full environment for benchmarks: no
trajectory API, no trainer, just every data item run concurrently against a
`ServerManager` and the per-item metrics averaged.
"""

from __future__ import annotations

import json
import logging
import os
import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.asyncio import tqdm_asyncio

from atroposlib.utils.metrics import plain_numbers

if TYPE_CHECKING:
    # imported where a server is made: the launcher's report reads EVAL_HISTORY from
    # here, and the server stack imports the openai SDK (a second of CPU per launch)
    from atroposlib.envs.server_handling.server_manager import ServerManager

logger = logging.getLogger(__name__)

__all__ = ["EvalBase", "append_eval_history", "eval_runner", "evaluate_log", "pass_at_k"]

EVAL_HISTORY = "history.jsonl"
"""One line per evaluation of a served env, beside the latest metrics.json: the run
report plots it (metrics.json keeps lighteval's shape, so it holds the latest only)."""


def pass_at_k(m: int | float, c: int | float, k: int | float) -> float:
    """Unbiased pass@k from `m` samples of which `c` are correct (Chen et al. 2021).

    1 - C(m - c, k) / C(m, k), computed as a running product so large `m` cannot
    overflow.
    """
    if m < 0 or c < 0 or k < 1:
        raise ValueError(f"pass_at_k needs m >= 0, c >= 0 and k >= 1; got m={m}, c={c}, k={k}")
    if c > m:
        raise ValueError(f"pass_at_k: {c} correct samples out of only {m}")
    if m - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(m - c + 1, m + 1)))


def evaluate_log(
    metrics: dict,
    eval_dir: str | None = None,
    task_name: str | None = None,
    model_name: str | None = None,
    start_time: float | None = None,
    end_time: float | None = None,
    generation_parameters: dict | None = None,
    samples: list[dict] | None = None,
    verbose: bool = True,
) -> None:
    """Write `<eval_dir>/metrics.json` (lighteval layout) and `samples.jsonl` if samples.

    Nothing is written without `eval_dir`. The metrics go under both
    `results["atropos|<task_name>|0"]` and `results["all"]`; `verbose` prints a table.
    """
    if eval_dir is None:
        logger.warning("eval_dir is not set, skipping evaluation logging")
        return
    metrics = plain_numbers(metrics)  # json cannot write numpy's ints, nor its float32
    os.makedirs(eval_dir, exist_ok=True)
    now = time.time()
    start_time = now if start_time is None else start_time
    end_time = now if end_time is None else end_time
    if verbose:
        from atroposlib.utils.display import display_metrics_table

        display_metrics_table(str(task_name), metrics, start_time, end_time)
    document = {
        "config_general": {
            "model_name": model_name,
            "total_evaluation_time_seconds": str(end_time - start_time),
            "generation_parameters": generation_parameters or {},
        },
        "results": {f"atropos|{task_name}|0": metrics, "all": metrics},
    }
    metrics_path = os.path.join(eval_dir, "metrics.json")
    with open(metrics_path, "w") as out:
        json.dump(document, out, indent=2)
    said = print if verbose else logger.debug  # a served env says one line instead
    said(f"Evaluation results saved to {metrics_path}")
    if samples:
        samples_path = os.path.join(eval_dir, "samples.jsonl")
        with open(samples_path, "w") as out:
            for sample in samples:
                out.write(json.dumps(plain_numbers(sample), ensure_ascii=False) + "\n")
        said(f"Evaluation samples saved to {samples_path}")


def append_eval_history(eval_dir: str, step: int, task: str, metrics: dict) -> None:
    """Add one evaluation (`step`: the trainer's step it ran at) to `history.jsonl`."""
    os.makedirs(eval_dir, exist_ok=True)
    record = {"step": step, "task": task, "time": time.time(), "metrics": plain_numbers(metrics)}
    with open(os.path.join(eval_dir, EVAL_HISTORY), "a") as out:
        out.write(json.dumps(record) + "\n")


class EvalBase(ABC):
    """A benchmark: `setup_data()` items, each scored by `run_item()`, metrics averaged.

    Keyword arguments become attributes (temperature, top_p, max_tokens, eval_dir,
    verbose, or anything a subclass reads with getattr).
    """

    def __init__(self, pass_at_n: int = 1, pass_at_n_samples: int = 1, **kwargs: Any) -> None:
        self.pass_at_n = pass_at_n
        self.pass_at_n_samples = pass_at_n_samples
        for name, value in kwargs.items():
            setattr(self, name, value)
        self.data = self.setup_data()

    def get_generation_params(self) -> dict:
        """Sampling settings sent with each chat completion (n covers pass@n)."""
        return {
            "temperature": getattr(self, "temperature", 0.0),
            "n": max(self.pass_at_n_samples, self.pass_at_n),
            "top_p": getattr(self, "top_p", 1.0),
            "max_tokens": getattr(self, "max_tokens", -1),
        }

    async def chat_completion(self, server: Any, messages: list[dict]) -> Any:
        """`server.chat_completion` with this eval's generation parameters."""
        return await server.chat_completion(messages=messages, **self.get_generation_params())

    @abstractmethod
    def setup_data(self) -> list:
        """The items to evaluate (called once, from __init__)."""
        raise NotImplementedError("Setup data method must be implemented in subclass")

    @abstractmethod
    async def run_item(self, server: ServerManager, data_item: dict) -> tuple[dict, list]:
        """Evaluate one item: (its metrics, its sample records for samples.jsonl)."""
        raise NotImplementedError("Run item method must be implemented in subclass")

    def _task_name(self) -> str:
        """`ClassName@pass_at_n`, with `:pass_at_n_samples` when that differs."""
        name = f"{type(self).__name__}@{self.pass_at_n}"
        if self.pass_at_n != self.pass_at_n_samples:
            name += f":{self.pass_at_n_samples}"
        return name

    async def __call__(self, server_manager: ServerManager) -> dict:
        """Run every item concurrently, average each metric, log and return the averages."""
        if not self.data:
            raise ValueError(f"{type(self).__name__}.setup_data() returned no items to evaluate")
        start_time = time.time()
        results = await tqdm_asyncio.gather(
            *(self.run_item(server_manager, item) for item in self.data)
        )
        end_time = time.time()
        per_item = [result[0] for result in results]
        metrics = {
            key: sum(item_metrics[key] for item_metrics in per_item) / len(per_item)
            for key in per_item[0]
        }
        task_name = self._task_name()
        print(f"{task_name} metrics: {plain_numbers(metrics)}")
        evaluate_log(
            metrics,
            eval_dir=getattr(self, "eval_dir", None),
            task_name=task_name,
            model_name=server_manager.servers[0].config.model_name,
            start_time=start_time,
            end_time=end_time,
            generation_parameters=self.get_generation_params(),
            samples=[result[1] for result in results],
            verbose=getattr(self, "verbose", False),
        )
        return metrics


async def eval_runner(eval_env: EvalBase) -> dict:
    """Command line of an `EvalBase` script: `--server-url` and `--model-name`, then run."""
    import argparse

    from atroposlib.envs.server_handling.server_baseline import APIServerConfig
    from atroposlib.envs.server_handling.server_manager import ServerManager

    parser = argparse.ArgumentParser(description=type(eval_env).__doc__)
    parser.add_argument(
        "--server-url",
        default="http://localhost:8000",
        help="base URL of the OpenAI-compatible server (default: http://localhost:8000)",
    )
    parser.add_argument("--model-name", default=None, help="model name sent with each request")
    args = parser.parse_args()
    server = {"api_key": "dummy", "base_url": args.server_url, "health_check": False}
    if args.model_name is not None:
        server["model_name"] = args.model_name
    return await eval_env(ServerManager(configs=[APIServerConfig(**server)]))
