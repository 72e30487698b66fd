"""The `serve` steps an environment can override: upstream's hooks, on our runtime.

The serve loop (`runtime.py`) owns workers, the backlog, signals and the spool;
at each of upstream's points it calls these methods on the env, so an override
(upstream's `sft_loader_server` replaces `env_step_checks`, others replace
`get_server_info`) runs exactly where upstream runs it:

    env_manager: setup -> setup_wandb -> register_env -> get_server_info -> loop:
        get_status (sets status_dict) -> env_step_checks -> workers

Calls to the API go through the env's `TrajectoryClient` (retries, auth).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from atroposlib.envs.api_client import EnvUnknownError, TrajectoryClient
from atroposlib.protocol import RegisterEnv

if TYPE_CHECKING:
    from atroposlib.envs.config import BaseEnvConfig
    from atroposlib.envs.runtime import EnvRuntime

logger = logging.getLogger("atroposlib.envs")


class ServeHooks:
    """Mixed into BaseEnv; relies on its config, client and runtime attributes."""

    # BaseEnv's attributes that these hooks read or set, declared for the type checker
    # only (annotations without values create no class attribute): BaseEnv.__init__
    # sets them, except `_runtime`, which the serve runtime sets when it starts.
    config: BaseEnvConfig
    name: str | None
    client: TrajectoryClient | None
    env_id: int | None
    wandb_prepend: str | None
    curr_step: int
    max_token_len: int
    checkpoint_dir: str
    checkpoint_interval: int
    status_dict: dict[str, Any]
    _runtime: EnvRuntime | None
    _trainer_batch_seen: int | None = None
    """The trainer's batch size as /status-env last gave it (ours; None before)."""
    load_checkpoint: Callable[[], None]

    def _trajectory_client(self) -> TrajectoryClient:
        """The trajectory API's client, which the serve runtime sets before these hooks run."""
        if self.client is None:
            raise RuntimeError(
                f"{type(self).__name__} has no trajectory API client: register_env, "
                "get_server_info and get_status run under `serve`, whose runtime sets it"
            )
        return self.client

    def _registration(self) -> dict[str, Any]:
        config = self.config
        return RegisterEnv(
            max_token_length=config.max_token_length,
            desired_name=config.wandb_name or self.name or type(self).__name__,
            weight=config.inference_weight,
            group_size=config.group_size,
            min_batch_allocation=config.min_batch_allocation,
        ).model_dump()

    async def register_env(self) -> None:
        """Register with the trajectory API (waiting until a trainer has) and take its answer."""
        config = self.config
        answer = await self._trajectory_client().register_env(self._registration())
        self.env_id = answer["env_id"]
        self.wandb_prepend = answer["wandb_name"]
        self.curr_step = answer["starting_step"]
        self.checkpoint_dir = answer.get("checkpoint_dir") or ""
        self.checkpoint_interval = answer.get("checkpoint_interval", -1)
        if config.total_steps == -1:  # upstream's "as many steps as the trainer runs"
            config.total_steps = answer.get("num_steps", -1)
            if config.total_steps == -1:
                raise ValueError("total_steps is -1 and the trainer registered no num_steps")
            logger.info("total_steps -1: running to the trainer's num_steps %d", config.total_steps)
        if self.curr_step > 0:  # a fresh run (step 0) starts from nothing, as upstream
            self.load_checkpoint()

    async def get_server_info(self) -> None:
        """The trainer's batch size and token limit, from /info (the trainer's value wins)."""
        info = await self._trajectory_client().get_json("/info")
        if info.get("batch_size", -1) != -1:
            self.config.batch_size = info["batch_size"]
        if info.get("max_token_len", -1) != -1:
            self.max_token_len = info["max_token_len"]
        if self.config.batch_size == -1:
            warnings.warn("batch_size is set by neither the config nor the trainer", stacklevel=2)
        elif self.config.group_size > self.config.batch_size:
            raise ValueError(
                f"group_size ({self.config.group_size}) is over the trainer's batch_size "
                f"({self.config.batch_size})"
            )

    async def get_status(self) -> dict[str, Any]:
        """Poll /status-env into `status_dict` (current_step, queue sizes, env_weight...).

        An API that no longer knows this env (restarted without its state) gets a new
        registration, and the env goes on under the id it answers, with the batch size
        and token limit that API's trainer registered (`get_server_info` again). So does
        an env whose trainer registered again with another batch size: pacing by the old
        one would stall it at max_batches_offpolicy x the old batch.
        """
        client = self._trajectory_client()
        if self.env_id is None:
            raise RuntimeError("get_status before register_env: this env has no env_id yet")
        try:
            self.status_dict = await client.status_env(self.env_id)
        except EnvUnknownError as exc:
            logger.warning("%s; registering again", exc)
            self.env_id = (await client.register_env(self._registration()))["env_id"]
            logger.warning("registered again as env_id %d", self.env_id)
            await self._read_server_info_again()
            self.status_dict = await client.status_env(self.env_id)
        trainer_batch = self.status_dict.get("batch_size")
        if trainer_batch is not None and trainer_batch != self._trainer_batch_seen:
            # once per change, so an override of get_server_info that sets its own
            # batch size is not asked again at every poll
            if self._trainer_batch_seen is not None or trainer_batch != self.config.batch_size:
                await self._read_server_info_again()
            self._trainer_batch_seen = trainer_batch
        return self.status_dict

    async def _read_server_info_again(self) -> None:
        before = self.config.batch_size
        await self.get_server_info()
        if self.config.batch_size != before:
            logger.warning(
                "the trainer's batch size is now %d (was %d)", self.config.batch_size, before
            )

    async def env_step_checks(self) -> None:
        """After each status poll: evaluations and env checkpoints due, the step, metrics.

        An override reads `self.status_dict` and `self.curr_step` (still the step
        before this poll) and calls super(), as upstream's do.
        """
        self.curr_step = self.status_dict["current_step"]
        runtime = getattr(self, "_runtime", None)
        if runtime is not None:
            await runtime.step_checks()

    @property
    def derived_batch_size(self) -> int:
        """This env's share of a batch: the unallocated fraction plus its minimum allocation."""
        status = getattr(self, "status_dict", None)
        if not status or self.config.batch_size == -1:
            return self.config.batch_size
        fraction = status.get("unallocated_fraction", 1.0)
        if self.config.min_batch_allocation is not None:
            fraction += self.config.min_batch_allocation
        return int(self.config.batch_size * fraction)
