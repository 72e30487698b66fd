"""`BaseEnv`: what an environment author subclasses (the Atropos contract).

This file is the readable heart of that contract: the methods a subclass
overrides, and the helpers it calls. Everything else lives beside it:
configuration in `config.py`, the group shapes in `scored_data.py`, the
client of the trajectory API (with its spool) in `api_client.py`, the `serve`
loop in `runtime.py` (which owns the loop's state: workers, running items, timings
of its own), and the `serve` / `process` / `evaluate` command line in `cli.py`.
Upstream's hooks that an env overrides are methods here; their bodies are functions
of the env in `serve_hooks.py` (registration, status) and `reporting.py` (wandb,
perf stats, eval logs), what a group must be to be sent is `sending.py`, and the
env's checkpoint files are `env_checkpoints.py`.

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
import logging
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

from atroposlib.envs import reporting, serve_hooks
from atroposlib.envs.api_client import TrajectoryClient
from atroposlib.envs.config import BaseEnvConfig, EvalHandlingEnum
from atroposlib.envs.env_checkpoints import read_state, write_state
from atroposlib.envs.reporting import GROUPS_RATE_MIN_SPAN_S, GROUPS_RATE_WINDOW_S
from atroposlib.envs.scored_data import (
    ScoredDataGroup,
    ScoredDataItem,
    group_from_chat,
    stack_items,
)
from atroposlib.envs.sending import append_groups, kept_groups
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ReasoningConfig,
    ServerBaseline,
)
from atroposlib.envs.server_handling.server_manager import ServerManager
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


class BaseEnv(ABC):
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
        self.backlog: list[Item] = []  # items to roll out first; the serve runtime's too
        self._runtime: Any = None  # the serve runtime (runtime.py), while one runs
        self._trainer_batch_seen: int | None = None  # /status-env's batch size, last seen
        self._wandb_run: Any = None  # setup_wandb's
        self.process_mode = False  # upstream's attributes of the process command
        self.n_groups_to_process = config.total_steps
        self.group_size_to_process = config.group_size
        # perf_stats' timings, which the serve runtime fills and perf_stats empties
        self.task_duration: list[float] = []
        self.succeeded_task_duration: list[float] = []
        self.failed_task_duration: list[float] = []
        self.mainloop_timings: list[float] = []
        self.workers_added_list: list[int] = []
        self.task_successful: list[int] = []

    @property
    def workers(self) -> dict[asyncio.Task, Item]:
        """The serve runtime's rollout workers (task -> item); none outside `serve`."""
        return self._runtime.workers if self._runtime is not None else {}

    @property
    def client(self) -> TrajectoryClient | None:
        """The serve runtime's client of the trajectory API; none outside `serve`."""
        return getattr(self._runtime, "client", None)

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

    async def setup(self) -> None:  # noqa: B027 (optional, as upstream's)
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
        """Env state as JSON, for the trainer's checkpoint `step` (`env_checkpoints.py`).

        The runtime calls this with no data at each of the trainer's checkpoint steps; an
        env with state overrides it and passes its state on. No data, no file (upstream's
        rule), so a resume never restores an empty stand-in.
        """
        if self.checkpoint_dir and data is not None:
            write_state(self._checkpoint_folder(), step, data)

    def load_checkpoint(self) -> None:
        """Restore the checkpoint of `curr_step` (the step the trainer resumed at), if
        any: its keys become attributes."""
        data = (
            read_state(self._checkpoint_folder(), self.curr_step) if self.checkpoint_dir else None
        )
        for key, value in (data or {}).items():
            setattr(self, key, value)

    async def cleanup(self) -> None:  # noqa: B027 (optional, as upstream's)
        """Called after each rollout worker finishes."""

    def _checkpoint_folder(self) -> Path:
        name = self.wandb_prepend or self.config.wandb_name or self.name or type(self).__name__
        return Path(self.checkpoint_dir) / "env_checkpoints" / name

    # ------------------------------------------------ upstream's hooks (see the docstring)
    register_env = serve_hooks.register_env
    get_server_info = serve_hooks.get_server_info
    get_status = serve_hooks.get_status
    env_step_checks = serve_hooks.env_step_checks
    derived_batch_size = property(serve_hooks.derived_batch_size)
    setup_wandb = reporting.setup_wandb
    add_rollouts_for_wandb = reporting.add_rollouts_for_wandb
    create_rollout_table = reporting.create_rollout_table
    perf_stats = reporting.perf_stats
    wandb_log = reporting.wandb_log
    evaluate_log = reporting.evaluate_log

    async def handle_send_to_api(
        self,
        scored_data: ScoredDataGroup | list[ScoredDataGroup] | None,
        item: Item = None,
        do_send_to_api: bool = True,
        abort_on_any_max_length_exceeded: bool = True,
    ) -> None:
        """Apply the sending rules (`sending.py`), save to jsonl when asked, then post."""
        ready = await kept_groups(self, scored_data, item, abort_on_any_max_length_exceeded)
        if not ready:
            return
        if self.config.data_path_to_save_groups:
            append_groups(self.config.data_path_to_save_groups, ready, item)
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
