r"""Any `verifiers` environment (Prime Intellect's Environments Hub) as an Atropos env.

Upstream's runner, with its name, flags and behaviour: `--env.vf_env_name` names the
verifiers environment (`verifiers.load_environment(name, **env_args)` imports the
module the name gives, `vf-mod-arithmetic` -> `vf_mod_arithmetic`, and calls its
`load_environment`), `--env.env_args` its arguments (a JSON object, or a mapping in
YAML). Training items are the environment's dataset, in order; each group is
`group_size` rollouts of one item through `vf_env.generate()`, whose OpenAI client is a
`ManagedServerAdapter`: every completion goes through this env's `ManagedServer`, so
the group's tokens, masks and logprobs are the engine's own, never re-tokenized. The
score of a rollout is the verifiers rubric's reward; each reward function's value goes
to the env's metrics (`train/<function>`).

Beyond upstream:
- a rollout's sequence is found by the response its last turn got (the managed
  server keeps the node of every response), not by the order rollouts finished in,
  which upstream assumes and verifiers does not keep;
- `env_args` may be a mapping (upstream's own YAML example gives one, which its
  string field refuses);
- `evaluate` runs the environment's eval dataset greedily (upstream's does nothing);
- the signal handlers verifiers installs when it builds an environment are put back,
  so this env's own shutdown on SIGINT/SIGTERM still runs.

Needs `pip install 'atroposlib[verifiers]'` and the verifiers environment itself
(`pip install ./environments/vf_mod_arithmetic` for the quickstart's task, which
`configs/verifiers_cpu.yaml` trains).

    python environments/verifiers_server.py serve --env.vf_env_name vf-mod-arithmetic \
        --env.tokenizer_name ./tiny-model --openai.base_url http://127.0.0.1:9001/v1

Offline, on the tiny model:

    python environments/verifiers_server.py process --env.vf_env_name vf-mod-arithmetic \
        --env.tokenizer_name ./tiny-model --env.total_steps 2 --env.group_size 4 \
        --env.max_token_length 64 \
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name tiny
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import Field

# `python environments/verifiers_server.py` puts environments/ on sys.path, not the root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig
from atroposlib.envs.scored_data import ScoredDataGroup
from atroposlib.envs.server_handling.managed_server import ManagedServerAdapter
from atroposlib.envs.server_handling.vllm_server import encode_prompt

logger = logging.getLogger(__name__)

VERIFIERS_MISSING = (
    "environments/verifiers_server.py needs the verifiers library: "
    "pip install 'atroposlib[verifiers]'"
)


class VfEnvConfig(BaseEnvConfig):
    vf_env_name: str = Field("", description="The verifiers environment to load (its module).")
    env_args: dict[str, Any] | str = Field(
        "{}", description="Arguments of its load_environment: a JSON object (or a mapping)."
    )
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature of rollouts.")
    max_tokens: int = Field(
        -1,
        description="Most completion tokens per turn (-1: what max_token_length leaves "
        "after the item's prompt; upstream asks for max_token_length, which no prompt "
        "leaves room for).",
    )
    eval_size: int = Field(-1, description="Eval examples (-1: the whole eval dataset).")

    def get_env_args(self) -> dict[str, Any]:
        """`env_args` as a dict; a clear error when it is not a JSON object."""
        if isinstance(self.env_args, dict):
            return dict(self.env_args)
        try:
            parsed = json.loads(self.env_args or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"--env.env_args is not JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"--env.env_args must be a JSON object, got {self.env_args!r}")
        return parsed


def load_vf_environment(name: str, env_args: dict[str, Any]) -> Any:
    """`verifiers.load_environment(name, **env_args)`, with this process's SIGINT and
    SIGTERM handlers put back afterwards (verifiers replaces them with its own exit)."""
    try:
        import verifiers as vf
    except ImportError as exc:
        raise RuntimeError(VERIFIERS_MISSING) from exc
    if not name:
        raise ValueError("--env.vf_env_name is required: the verifiers environment to load")
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return vf.load_environment(name, **env_args)
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)


class VerifiersEnv(BaseEnv):
    name = "verifiers"
    env_config_cls = VfEnvConfig
    config: VfEnvConfig

    def __init__(self, config: VfEnvConfig, server_configs: Any, **kwargs: Any) -> None:
        super().__init__(config, server_configs, **kwargs)
        self.vf_env = load_vf_environment(config.vf_env_name, config.get_env_args())
        self.reward_values: dict[str, list[float]] = defaultdict(list)
        self.iter = 0

    @classmethod
    def config_init(cls) -> tuple[VfEnvConfig, list[APIServerConfig]]:
        """Upstream's defaults: a 1.5B instruct model on a local vLLM engine."""
        config = VfEnvConfig(
            tokenizer_name="Qwen/Qwen2.5-1.5B-Instruct",
            group_size=8,
            use_wandb=True,
            rollout_server_url="http://localhost:8000",
            total_steps=1000,
            batch_size=64,
            steps_per_eval=100,
            max_token_length=2048,
            wandb_name="verifiers",
        )
        server = APIServerConfig(  # no api_key: the launcher's engine key, else none
            model_name="Qwen/Qwen2.5-1.5B-Instruct",
            base_url="http://localhost:9001/v1",
            server_type="vllm",
        )
        return config, [server]

    async def setup(self) -> None:
        self.train = self.vf_env.get_dataset().to_list()
        if not self.train:
            raise ValueError(f"the verifiers environment {self.config.vf_env_name} has no data")

    async def get_next_item(self) -> dict[str, Any]:
        item = self.train[self.iter % len(self.train)]
        self.iter += 1
        return item

    def save_checkpoint(self, step: int, data: dict | None = None) -> None:
        super().save_checkpoint(step, {**(data or {}), "iter": self.iter})

    def _rollout_inputs(self, item: dict[str, Any], copies: int) -> list[dict[str, Any]]:
        keep = {key: item[key] for key in ("prompt", "answer", "example_id", "info") if key in item}
        task = item.get("task") or self.config.vf_env_name
        return [{"task": task, **keep} for _ in range(copies)]

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[Any, list]:
        size = self.config.group_size
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            managed.response_nodes = {}
            adapter = ManagedServerAdapter(managed, base_url=self.server_base_url())
            results = await self.vf_env.generate(
                inputs=self._rollout_inputs(item, size),
                client=adapter,
                model=self.server_model_name(),
                sampling_args={
                    "temperature": self.config.temperature,
                    "max_completion_tokens": self.completion_budget(item),
                },
                max_concurrent=size,
                max_concurrent_scoring=size,
                save_results=False,
                use_tqdm=False,
                independent_scoring=True,
            )
            found = managed.response_nodes
        failed = [state["error"] for state in results["state"] if state.get("error")]
        if failed:  # a rollout verifiers aborted has no sequence to train on
            logger.warning(
                "%d of %d rollouts of item %s failed (%s); the group is dropped",
                len(failed),
                size,
                item.get("example_id"),
                repr(failed[0]),
            )
            return None, []
        return self.scored_group(results["state"], found), []

    def completion_budget(self, item: dict[str, Any]) -> int:
        """`max_tokens`, within what `max_token_length` leaves after the item's prompt."""
        prompt = item.get("prompt")
        used = 0
        if isinstance(prompt, list):  # counted as the managed server will encode it
            text = self.tokenizer.apply_chat_template(
                prompt, tokenize=False, add_generation_prompt=True
            )
            used = len(encode_prompt(self.tokenizer, text))
        room = max(1, self.config.max_token_length - used)
        return room if self.config.max_tokens < 1 else min(self.config.max_tokens, room)

    def scored_group(self, states: list[Any], found: dict[str, list[Any]]) -> ScoredDataGroup:
        """The group of `states` (verifiers' rollouts), each with the node of the response
        its last turn got."""
        group: ScoredDataGroup = {
            "tokens": [],
            "masks": [],
            "scores": [],
            "inference_logprobs": [],
            "messages": [],
        }
        for state in states:
            steps = state.get("trajectory") or []
            response = steps[-1]["response"] if steps else None
            nodes = found.get(getattr(response, "id", None) or "")
            if not nodes:
                raise RuntimeError(
                    "a verifiers rollout's last response did not come through this env's "
                    "managed server, so its tokens are unknown (an environment that calls "
                    "another client cannot be trained here)"
                )
            node = nodes[0]
            group["tokens"].append(node.tokens)
            group["masks"].append(node.masked_tokens)
            group["inference_logprobs"].append(node.logprobs)
            group["scores"].append(float(state["reward"]))
            conversation = list(state["prompt"]) + list(state["completion"])
            group["messages"].append(
                [{**message, "content": message.get("content") or ""} for message in conversation]
            )
            for name, value in (state.get("metrics") or {}).items():
                self.reward_values[name].append(float(value))
        return group

    def server_base_url(self) -> str:
        server = self.server.servers[0]
        return str(getattr(server.config, "base_url", "") or "")

    def server_model_name(self) -> str:
        return str(self.server.servers[0].config.model_name)

    async def wandb_log(self, wandb_metrics: dict | None = None) -> None:
        """Each reward function's mean over the rollouts since the last log."""
        metrics = dict(wandb_metrics or {})
        for name, values in self.reward_values.items():
            metrics[f"train/{name}"] = sum(values) / len(values)
        self.reward_values = defaultdict(list)
        await super().wandb_log(metrics)

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """The eval dataset answered greedily: accuracy (reward above 0), mean reward and
        each reward function's mean (upstream's eval script's figures)."""
        started = time.time()
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            adapter = ManagedServerAdapter(managed, base_url=self.server_base_url())
            results = await self.vf_env.evaluate(
                client=adapter,
                model=self.server_model_name(),
                sampling_args={"temperature": 0.0, "max_tokens": self.config.max_token_length},
                num_examples=self.config.eval_size,
                rollouts_per_example=1,
                max_concurrent=max(1, self.config.max_eval_workers),
                save_results=False,
                use_tqdm=False,
            )
        rewards = [float(r) for r in results["reward"]]
        metrics = {
            "eval/accuracy": sum(r > 0 for r in rewards) / max(1, len(rewards)),
            "eval/mean_score": sum(rewards) / max(1, len(rewards)),
        }
        for name, values in (results.get("metrics") or {}).items():
            metrics[f"eval/{name}"] = sum(values) / max(1, len(values))
        samples = [
            {"prompt": p, "completion": c, "answer": a, "score": r}
            for p, c, a, r in zip(
                results["prompt"], results["completion"], results["answer"], rewards, strict=True
            )
        ]
        await self.evaluate_log(
            metrics=metrics, samples=samples, start_time=started, end_time=time.time()
        )


if __name__ == "__main__":
    VerifiersEnv.cli()
