"""`BaseEnv`: what an environment author subclasses (the Atropos contract).

This file is the readable heart of that contract: the methods a subclass
overrides, and the helpers it calls. Everything else lives beside it:
configuration in `config.py`, the group shapes in `scored_data.py`, the
client of the trajectory API (with its spool) in `api_client.py`, the `serve`
loop in `runtime.py`, and the `serve` / `process` / `evaluate` command line in
`cli.py`.

A minimal environment:

    class MyEnv(BaseEnv):
        name = "my_env"

        async def setup(self): self.items = [...]
        async def get_next_item(self): return random.choice(self.items)
        async def collect_trajectory(self, item):
            chat = await self.server.chat_completion(messages=..., n=1)
            ...
            return {"tokens": ..., "masks": ..., "scores": 1.0}, []
        async def evaluate(self): ...

    if __name__ == "__main__":
        MyEnv.cli()
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

from atroposlib.envs.config import BaseEnvConfig, EvalHandlingEnum
from atroposlib.envs.reporting import (
    GROUPS_RATE_MIN_SPAN_S,
    GROUPS_RATE_WINDOW_S,
    ReportingHooks,
)
from atroposlib.envs.scored_data import (
    ScoredDataGroup,
    ScoredDataItem,
    group_from_chat,
    stack_items,
)
from atroposlib.envs.serve_hooks import ServeHooks
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ReasoningConfig,
    ServerBaseline,
)
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.protocol import GROUP_ID_FIELD
from atroposlib.token_limit import exceeds_token_limit
from atroposlib.type_definitions import Item
from atroposlib.utils.metrics import RecentRate

logger = logging.getLogger("atroposlib.envs")

__all__ = [
    "APIServerConfig",
    "BaseEnv",
    "BaseEnvConfig",
    "EvalHandlingEnum",
    "ScoredDataGroup",
    "ScoredDataItem",
    "ServerBaseline",
]


async def maybe_await(value: Any) -> Any:
    """A score that may be a coroutine (a sandboxed judge) or a plain value."""
    return await value if inspect.isawaitable(value) else value


class BaseEnv(ServeHooks, ReportingHooks, ABC):
    """An environment: items in, scored groups of rollouts out, served to the trajectory API.

    A subclass overrides `setup`, `get_next_item`, `collect_trajectories` (or
    `collect_trajectory`) and `evaluate`; `serve`, `process` and `evaluate` on the command
    line drive it (`cli.py`). The inference servers are reached through `self.server`, a
    `ServerManager`; the API through the runtime's client, never directly.
    """

    name: str | None = None
    env_config_cls: type[BaseEnvConfig] = BaseEnvConfig
    server_cls: type[APIServer] | None = None
    # `env_config_cls` fields config_init sets (with tokenizer_name: the model it serves)
    config_defaults: ClassVar[dict[str, Any]] = {}
    # fields of config_init's server that differ (base_url, num_requests_for_eval...)
    server_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        config: BaseEnvConfig,
        server_configs: ServerBaseline | APIServerConfig | list[APIServerConfig],
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        self.config = config
        self.server = ServerManager(
            server_configs,
            server_class=self.server_cls,
            slurm=slurm,
            testing=testing,
            reasoning_config=ReasoningConfig.from_env_config(config),
        )
        self.tokenizer = self._load_tokenizer(config.tokenizer_name)
        self.client = None  # TrajectoryClient, set by the serve runtime
        self.env_id: int | None = None
        self.wandb_prepend: str | None = None
        self.curr_step = 0
        self.max_token_len = -1
        self.checkpoint_dir = ""
        self.checkpoint_interval = -1
        self.completion_lengths: list[int] = []
        self.rollouts_for_wandb: list[list[tuple]] = []
        self.stats: Counter[str] = Counter()
        self.items_sent_this_step = 0
        self.start_time = time.time()
        # env/groups_per_minute
        self.groups_rate = RecentRate(GROUPS_RATE_WINDOW_S, GROUPS_RATE_MIN_SPAN_S)
        # upstream's attributes that envs read; the serve runtime keeps them current
        self.status_dict: dict[str, Any] = {}
        self.wandb_project: str | None = None
        self.wandb_group: str | None = None
        self.max_num_workers = config.max_num_workers
        if self.max_num_workers == -1:
            self.max_num_workers = config.max_num_workers_per_node * len(self.server.servers)
        self.workers: dict[asyncio.Task, Item] = {}  # the serve runtime's: task -> item
        self.eval_workers: set[asyncio.Task] = set()
        self.backlog: list[Item] = []
        self.running_items: dict[str, dict[str, Any]] = {}  # name -> item, worker, start_time
        self.eval_runner: asyncio.Task | None = None
        self.jsonl_writer = None  # groups go to data_path_to_save_groups in handle_send_to_api
        self.process_mode = False
        self.n_groups_to_process = config.total_steps
        self.group_size_to_process = config.group_size
        # timings for perf_stats, filled by the serve runtime
        self.task_duration: list[float] = []
        self.succeeded_task_duration: list[float] = []
        self.failed_task_duration: list[float] = []
        self.mainloop_timings: list[float] = []
        self.workers_added_list: list[int] = []
        self.task_successful: list[int] = []
        self.last_loop_time: float | None = None
        self.last_completed_item: Item = None

    @staticmethod
    def _load_tokenizer(name: str):
        from atroposlib.utils.tokenizers import TOKENIZER_FLAG, load_tokenizer

        return load_tokenizer(name, TOKENIZER_FLAG)

    # ------------------------------------------------------------ overridable
    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, ServerBaseline | APIServerConfig | list]:
        """Default configuration: `env_config_cls` with `config_defaults`. When those
        name a `tokenizer_name`, one vLLM server on localhost:9001 serving that model
        (`server_defaults` changes its fields), else `ServerBaseline()`. Override it to
        return any config and servers, as upstream's environments do."""
        config = cls.env_config_cls(**cls.config_defaults)
        model = cls.config_defaults.get("tokenizer_name")
        if model is None:
            return config, ServerBaseline(**cls.server_defaults)
        server = {"base_url": "http://localhost:9001/v1", "server_type": "vllm"}
        return config, [APIServerConfig(model_name=model, **{**server, **cls.server_defaults})]

    async def setup(self) -> None:
        """Load data; called once before anything else."""

    @abstractmethod
    async def get_next_item(self) -> Item:
        """The next item to roll out (None: nothing right now)."""

    async def collect_trajectory(self, item: Item) -> tuple[ScoredDataItem | None, list[Item]]:
        """One rollout of `item`; override this or `collect_trajectories`."""
        raise NotImplementedError(
            f"{type(self).__name__} must override collect_trajectory or collect_trajectories"
        )

    async def collect_trajectories(
        self, item: Item
    ) -> tuple[ScoredDataGroup | list[ScoredDataGroup] | None, list[Item]]:
        """A group: `group_size` concurrent `collect_trajectory` calls, stacked."""
        results = await asyncio.gather(
            *(self.collect_trajectory(item) for _ in range(self.config.group_size))
        )
        backlog = [extra for _, more in results for extra in more]
        items = [rollout for rollout, _ in results if rollout is not None]
        return (stack_items(items) if items else None), backlog

    async def postprocess_histories(self, trajectories: Any) -> Any:
        return trajectories

    # ---------------------------------------------------------------- helpers
    async def sample_chat(
        self, messages: list[dict[str, str]], **sampling: Any
    ) -> tuple[list[Any], list[Any]]:
        """`group_size` samples of one chat through `ManagedServer`: the API's choices and,
        aligned with them, the nodes with the exact token ids, masks and sampling logprobs
        the engine produced. `sampling` is passed on (max_tokens, temperature, tools...)."""
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            chat = await managed.chat_completion(
                messages=messages, n=self.config.group_size, **sampling
            )
            nodes = managed.get_state()["nodes"]
        return list(chat.choices), list(nodes)

    async def sample_group(
        self,
        messages: list[dict[str, str]],
        score: Callable[[str], float | Awaitable[float]],
        **sampling: Any,
    ) -> ScoredDataGroup:
        """`group_size` samples of one chat (`sample_chat`), each scored by
        `score(completion_text)`: the usual body of a chat environment's
        `collect_trajectories`. Each conversation ends with its sample as the assistant turn.
        """
        choices, nodes = await self.sample_chat(messages, **sampling)
        replies = [choice.message.content for choice in choices]
        outcomes = [score(reply or "") for reply in replies]
        scores = [float(value) for value in await asyncio.gather(*map(maybe_await, outcomes))]
        return group_from_chat(messages, replies, nodes, scores)

    @abstractmethod
    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Run every `steps_per_eval` trainer steps; report with `evaluate_log`."""

    def save_checkpoint(self, step: int, data: dict | None = None) -> None:
        """Env state as JSON: <checkpoint_dir>/env_checkpoints/<wandb_name>/step-<step>.json.

        The runtime calls this with no data at each of the trainer's checkpoint steps; an
        env with state overrides it and passes its state on. No data, no file (upstream's
        rule), so a resume never restores an empty stand-in.
        """
        if not self.checkpoint_dir or data is None:
            return
        folder = self._checkpoint_folder()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"step-{step}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
        logger.info("saved env checkpoint %s", path)

    def load_checkpoint(self) -> None:
        """Restore the checkpoint of `curr_step` (the step the trainer resumed at), if any.

        Only that step's file: a newer one belongs to training the trainer has rolled
        back, and an older one to a different model. Its keys become attributes.
        """
        if not self.checkpoint_dir:
            return
        path = self._checkpoint_folder() / f"step-{self.curr_step}.json"
        if not path.exists():
            logger.info("no env checkpoint for step %d at %s", self.curr_step, path)
            return
        data = json.loads(path.read_text())
        for key, value in data.items():
            setattr(self, key, value)
        logger.warning(
            "restored env checkpoint %s (step %d): %s", path, self.curr_step, sorted(data)
        )

    async def cleanup(self) -> None:
        """Called after each rollout worker finishes."""

    # ----------------------------------------------------------------- helpers
    def _checkpoint_folder(self) -> Path:
        name = self.wandb_prepend or self.config.wandb_name or self.name or type(self).__name__
        return Path(self.checkpoint_dir) / "env_checkpoints" / name

    def _drop(self, reason: str, detail: str = "") -> None:
        self.stats[f"dropped_{reason}"] += 1
        # counted in stats (and logged each step); one line per group would flood the log
        logger.debug("group dropped (%s)%s", reason, f": {detail}" if detail else "")

    async def handle_send_to_api(
        self,
        scored_data: ScoredDataGroup | list[ScoredDataGroup] | None,
        item: Item = None,
        do_send_to_api: bool = True,
        abort_on_any_max_length_exceeded: bool = True,
    ) -> None:
        """Apply the sending rules, save to jsonl when asked, then post to the API."""
        groups = scored_data if isinstance(scored_data, list) else [scored_data]
        ready = []
        for group in groups:
            if group is None:
                self._drop("none")
                continue
            size = (group.get("group_overrides") or {}).get("group_size", self.config.group_size)
            if len(group["tokens"]) != size:
                self._drop("wrong_size", f"{len(group['tokens'])} sequences, expected {size}")
                continue
            scores = group["scores"]
            if self.config.ensure_scores_are_not_same and len(set(scores)) <= 1 and len(scores) > 1:
                self._drop("same_scores")
                continue
            limit = self.max_token_len
            if (
                limit > 0
                and abort_on_any_max_length_exceeded
                and any(exceeds_token_limit(len(t), limit) for t in group["tokens"])
            ):
                self._drop("too_long", f"a sequence is over max_token_len {limit}")
                continue
            if self.config.include_messages and not group.get("messages"):
                # one conversation per sequence, as the API's model (and upstream) has it
                group["messages"] = [
                    [{"role": "user", "content": self.tokenizer.decode(t)}] for t in group["tokens"]
                ]
            group["env_id"] = self.env_id
            # its id from the start, so the rollouts file and the trainer's record of
            # the steps name it alike (the run report's per-environment scores)
            group.setdefault(GROUP_ID_FIELD, uuid.uuid4().hex)  # type: ignore[misc]
            for tokens, masks in zip(group["tokens"], group["masks"], strict=True):
                self.completion_lengths.append(sum(1 for m in masks if m != -100) or len(tokens))
            await self.add_rollouts_for_wandb(group, item)
            ready.append(group)
        if not ready:
            return
        if self.config.data_path_to_save_groups:
            path = Path(self.config.data_path_to_save_groups)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as out:
                for group in ready:
                    out.write(json.dumps(group) + "\n")
        self.stats["groups_sent"] += len(ready)
        self.groups_rate.add(time.monotonic(), self.stats["groups_sent"])
        self.items_sent_this_step += len(ready)
        if do_send_to_api and self.client is not None:
            self.client.send(ready)

    async def env_manager(self) -> None:
        """`serve`: setup, register with the trajectory API, then roll out until total_steps."""
        from atroposlib.envs.runtime import EnvRuntime

        await EnvRuntime(self).run()

    async def process_manager(self) -> None:
        """`process`: setup, then `total_steps` groups to jsonl and HTML, no API."""
        from atroposlib.envs.process import run_process

        await run_process(self)

    async def _run_evaluate(self) -> None:
        """`evaluate`: setup, then one evaluate()."""
        await self.setup()
        await self.evaluate()

    @classmethod
    def cli(cls) -> None:
        """`python my_env.py serve|process|evaluate [--env.* --openai.* --config X.yaml]`."""
        from atroposlib.envs.cli import run_cli

        run_cli(cls)
