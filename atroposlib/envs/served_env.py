"""`ServedEnv`: what the `serve` runtime (`runtime.py`) reads, calls and sets on an env.

`BaseEnv` satisfies it (mypy checks that where `BaseEnv.env_manager` builds its
`EnvRuntime`). The members are exactly the runtime's uses, in three kinds:

- read-only (properties here): the config, the servers, the counters the runtime
  mutates in place, and the step and registration the env's own hooks keep;
- attributes the runtime sets: its own handle (`_runtime`: `env_step_checks` calls
  it back, and the env's read-only `workers` and `client` are the runtime's), and the
  count of groups sent since the last log;
- the env's hooks the runtime calls at upstream's points.

A type only: nothing here runs, and nothing needs to subclass it.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

from atroposlib.type_definitions import Item

if TYPE_CHECKING:
    from atroposlib.envs.api_client import TrajectoryClient
    from atroposlib.envs.config import BaseEnvConfig
    from atroposlib.envs.scored_data import ScoredDataGroup
    from atroposlib.envs.server_handling.server_manager import ServerManager

__all__ = ["ServedEnv"]


class ServedEnv(Protocol):
    # -- read by the runtime (subclasses may narrow them: a subclass's config class)
    @property
    def config(self) -> BaseEnvConfig: ...
    @property
    def name(self) -> str | None: ...
    @property
    def server(self) -> ServerManager: ...
    @property
    def stats(self) -> Counter[str]: ...  # counters, incremented in place
    @property
    def env_id(self) -> int | None: ...  # set by register_env
    @property
    def wandb_prepend(self) -> str | None: ...  # set by register_env
    @property
    def curr_step(self) -> int: ...  # kept by register_env and env_step_checks
    @property
    def checkpoint_interval(self) -> int: ...  # set by register_env
    @property
    def client(self) -> TrajectoryClient | None: ...  # the runtime's own, read back
    @property
    def backlog(self) -> list[Item]: ...  # shared with the runtime, which extends it
    @property
    def task_duration(self) -> list[float]: ...  # perf_stats' timings, appended to
    @property
    def succeeded_task_duration(self) -> list[float]: ...
    @property
    def failed_task_duration(self) -> list[float]: ...
    @property
    def mainloop_timings(self) -> list[float]: ...
    @property
    def workers_added_list(self) -> list[int]: ...
    @property
    def task_successful(self) -> list[int]: ...

    # -- set by the runtime
    _runtime: Any  # the runtime itself: env_step_checks calls its step_checks()
    items_sent_this_step: int  # reset to 0 after each wandb_log

    # -- the env's hooks, called at upstream's points
    async def setup(self) -> None: ...
    async def setup_wandb(self) -> None: ...
    async def register_env(self) -> None: ...
    async def get_server_info(self) -> None: ...
    async def get_status(self) -> dict[str, Any]: ...
    async def env_step_checks(self) -> None: ...
    async def get_next_item(self) -> Item: ...
    async def collect_trajectories(
        self, item: Item
    ) -> tuple[ScoredDataGroup | list[ScoredDataGroup] | None, list[Item]]: ...
    async def postprocess_histories(self, trajectories: Any) -> Any: ...
    async def handle_send_to_api(
        self, scored_data: ScoredDataGroup | list[ScoredDataGroup] | None, item: Item = None
    ) -> None: ...
    async def cleanup(self) -> None: ...
    def save_checkpoint(self, step: int) -> None: ...
    async def evaluate(self) -> None: ...
    async def wandb_log(self) -> None: ...
