"""The `serve` steps an environment can override: upstream's hooks, on our runtime.

The serve loop (`runtime.py`) owns workers, the backlog, signals and the spool;
at each of upstream's points it calls these methods on the env, so an override
(upstream's `sft_loader_server` replaces `env_step_checks`, others replace
`get_server_info`) runs exactly where upstream runs it:

    env_manager: setup -> setup_wandb -> register_env -> get_server_info -> loop:
        get_status (sets status_dict) -> env_step_checks -> workers

Calls to the API go through the env's `TrajectoryClient` (retries, auth). Each hook
is a function of the env that `BaseEnv` binds as a method of the same name, so an env
overrides it and calls `super()` as upstream's do; its state is the env's own
(upstream's attributes), which is why these are not a part of their own.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

from atroposlib.envs.api_client import EnvUnknownError, TrajectoryClient
from atroposlib.protocol import ENV_PROGRESS_FIELDS, RegisterEnv

if TYPE_CHECKING:
    from atroposlib.envs.base import BaseEnv

logger = logging.getLogger("atroposlib.envs")


def _trajectory_client(env: BaseEnv) -> TrajectoryClient:
    """The trajectory API's client, which the serve runtime sets before these hooks run."""
    if env.client is None:
        raise RuntimeError(
            f"{type(env).__name__} has no trajectory API client: register_env, "
            "get_server_info and get_status run under `serve`, whose runtime sets it"
        )
    return env.client


def _registration(env: BaseEnv) -> dict[str, Any]:
    config = env.config
    return RegisterEnv(
        max_token_length=config.max_token_length,
        desired_name=config.wandb_name or env.name or type(env).__name__,
        weight=config.inference_weight,
        group_size=config.group_size,
        min_batch_allocation=config.min_batch_allocation,
    ).model_dump()


async def register_env(env: BaseEnv) -> None:
    """Register with the trajectory API (waiting until a trainer has) and take its answer."""
    config = env.config
    answer = await _trajectory_client(env).register_env(_registration(env))
    env.env_id = answer["env_id"]
    env.wandb_prepend = answer["wandb_name"]
    env.curr_step = answer["starting_step"]
    env.checkpoint_dir = answer.get("checkpoint_dir") or ""
    env.checkpoint_interval = answer.get("checkpoint_interval", -1)
    if config.total_steps == -1:  # upstream's "as many steps as the trainer runs"
        config.total_steps = answer.get("num_steps", -1)
        if config.total_steps == -1:
            raise ValueError("total_steps is -1 and the trainer registered no num_steps")
        logger.info("total_steps -1: running to the trainer's num_steps %d", config.total_steps)
    if env.curr_step > 0:  # a fresh run (step 0) starts from nothing, as upstream
        env.load_checkpoint()


async def get_server_info(env: BaseEnv) -> None:
    """The trainer's batch size and token limit, from /info (the trainer's value wins)."""
    info = await _trajectory_client(env).get_json("/info")
    if info.get("batch_size", -1) != -1:
        env.config.batch_size = info["batch_size"]
    if info.get("max_token_len", -1) != -1:
        env.max_token_len = info["max_token_len"]
    if env.config.batch_size == -1:
        warnings.warn("batch_size is set by neither the config nor the trainer", stacklevel=2)
    elif env.config.group_size > env.config.batch_size:
        raise ValueError(
            f"group_size ({env.config.group_size}) is over the trainer's batch_size "
            f"({env.config.batch_size})"
        )


async def get_status(env: BaseEnv) -> dict[str, Any]:
    """Poll /status-env into `status_dict` (current_step, queue sizes, env_weight...).

    An API that no longer knows this env (restarted without its state) gets a new
    registration, and the env goes on under the id it answers, with the batch size
    and token limit that API's trainer registered (`get_server_info` again). So does
    an env whose trainer registered again with another batch size: pacing by the old
    one would stall it at max_batches_offpolicy x the old batch.
    """
    client = _trajectory_client(env)
    if env.env_id is None:
        raise RuntimeError("get_status before register_env: this env has no env_id yet")
    progress = {name: int(env.stats[name]) for name in ENV_PROGRESS_FIELDS}
    try:
        env.status_dict = await client.status_env(env.env_id, progress)
    except EnvUnknownError as exc:
        logger.warning("%s; registering again", exc)
        env.env_id = (await client.register_env(_registration(env)))["env_id"]
        logger.warning("registered again as env_id %d", env.env_id)
        await _read_server_info_again(env)
        env.status_dict = await client.status_env(env.env_id)
    trainer_batch = env.status_dict.get("batch_size")
    if trainer_batch is not None and trainer_batch != env._trainer_batch_seen:
        # once per change, so an override of get_server_info that sets its own
        # batch size is not asked again at every poll
        if env._trainer_batch_seen is not None or trainer_batch != env.config.batch_size:
            await _read_server_info_again(env)
        env._trainer_batch_seen = trainer_batch
    return env.status_dict


async def _read_server_info_again(env: BaseEnv) -> None:
    before = env.config.batch_size
    await env.get_server_info()
    if env.config.batch_size != before:
        logger.warning("the trainer's batch size is now %d (was %d)", env.config.batch_size, before)


async def env_step_checks(env: BaseEnv) -> None:
    """After each status poll: evaluations and env checkpoints due, the step, metrics.

    An override reads `self.status_dict` and `self.curr_step` (still the step
    before this poll) and calls super(), as upstream's do.
    """
    env.curr_step = env.status_dict["current_step"]
    runtime = getattr(env, "_runtime", None)
    if runtime is not None:
        await runtime.step_checks()


def derived_batch_size(env: BaseEnv) -> int:
    """This env's share of a batch: the unallocated fraction plus its minimum allocation."""
    status = getattr(env, "status_dict", None)
    if not status or env.config.batch_size == -1:
        return env.config.batch_size
    fraction = status.get("unallocated_fraction", 1.0)
    if env.config.min_batch_allocation is not None:
        fraction += env.config.min_batch_allocation
    return int(env.config.batch_size * fraction)
