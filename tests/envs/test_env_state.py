"""What a serve run takes over at start: the API's step count, env checkpoints, the backlog.

A real run-api and the real runtime's registration path; the env is the arith test env
in-process with canned inference (nothing here samples).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")

from atroposlib.envs.api_client import TrajectoryClient
from atroposlib.envs.base import BaseEnvConfig, ServerBaseline
from atroposlib.envs.runtime import EnvRuntime
from tests.support.arith_env import ArithEnv
from tests.support.groups import start_trainer


class StatefulEnv(ArithEnv):
    """Saves how many items it served, as an upstream env that keeps state would."""

    items_served = 0

    def save_checkpoint(self, step: int, data: dict | None = None) -> None:
        super().save_checkpoint(step, {"items_served": self.items_served})


def make_env(tiny_model_path, **config) -> StatefulEnv:
    defaults = {"tokenizer_name": str(tiny_model_path), "group_size": 2, "use_wandb": False}
    return StatefulEnv(BaseEnvConfig(**{**defaults, **config}), ServerBaseline(), testing=True)


def register(env, api_url: str, tmp_path: Path) -> EnvRuntime:
    """The runtime's own registration (register-env, /info, checkpoint, backlog)."""
    runtime = EnvRuntime(env, state_dir=tmp_path / "env-state")

    async def run() -> None:
        runtime.client = TrajectoryClient(api_url, runtime.state_dir / "spool")
        env._runtime = runtime
        try:
            assert await runtime._register()
        finally:
            await runtime.client.http.aclose()

    asyncio.run(run())
    return runtime


def test_total_steps_minus_one_takes_the_trainers_num_steps(api, tiny_model_path, tmp_path):
    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(client, batch_size=4, num_steps=7)
    env = make_env(tiny_model_path, total_steps=-1)
    register(env, api.url, tmp_path)
    assert env.config.total_steps == 7


def test_total_steps_unset_everywhere_is_an_error(api, tiny_model_path, tmp_path):
    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(client, batch_size=4, num_steps=-1)
    env = make_env(tiny_model_path, total_steps=-1)
    with pytest.raises(ValueError, match="total_steps"):
        register(env, api.url, tmp_path)


def write_checkpoints(folder: Path, steps: list[int]) -> None:
    folder.mkdir(parents=True)
    for step in steps:
        (folder / f"step-{step}.json").write_text(json.dumps({"items_served": 100 * step}))


def test_a_resumed_trainer_restores_the_checkpoint_of_its_step(
    api, tiny_model_path, tmp_path, caplog
):
    checkpoints = tmp_path / "ckpt"
    folder = checkpoints / "env_checkpoints" / "arith_0"
    write_checkpoints(folder, [3, 6])  # step 6 is newer, but the trainer resumes at 3
    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(
            client,
            batch_size=4,
            starting_step=3,
            checkpoint_dir=str(checkpoints),
            save_checkpoint_interval=3,
        )
    env = make_env(tiny_model_path)
    with caplog.at_level(logging.INFO, logger="atroposlib.envs"):
        register(env, api.url, tmp_path)
    assert env.curr_step == 3 and env.items_served == 300
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(str(folder / "step-3.json") in m for m in warnings), warnings


def test_a_fresh_run_restores_no_checkpoint(api, tiny_model_path, tmp_path, caplog):
    checkpoints = tmp_path / "ckpt"
    write_checkpoints(checkpoints / "env_checkpoints" / "arith_0", [0, 6])
    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(client, batch_size=4, checkpoint_dir=str(checkpoints))
    env = make_env(tiny_model_path)
    register(env, api.url, tmp_path)
    assert env.curr_step == 0 and env.items_served == 0


def test_checkpoints_are_named_by_the_interval_multiple(tiny_model_path, tmp_path):
    """A poll that sees step 4 with interval 3 saves step-3, the trainer's checkpoint step."""
    env = make_env(tiny_model_path, steps_per_eval=0)
    env.checkpoint_dir = str(tmp_path / "ckpt")
    env.wandb_prepend = "arith_0"
    env.checkpoint_interval = 3
    env.items_served = 11
    runtime = EnvRuntime(env, state_dir=tmp_path / "env-state")
    for step in (1, 4, 5, 8, 9):
        env.curr_step = step
        asyncio.run(runtime._evaluate_and_checkpoint())
    folder = tmp_path / "ckpt" / "env_checkpoints" / "arith_0"
    assert sorted(p.name for p in folder.iterdir()) == ["step-3.json", "step-6.json", "step-9.json"]
    assert json.loads((folder / "step-3.json").read_text()) == {"items_served": 11}


def test_a_resumed_backlog_warns_with_count_and_path(tiny_model_path, tmp_path, caplog):
    env = make_env(tiny_model_path)
    runtime = EnvRuntime(env, state_dir=tmp_path / "env-state")
    runtime.state_dir.mkdir(parents=True)
    runtime.backlog_file.write_text(json.dumps([{"a": 1, "b": 2}, {"a": 3, "b": 4}]))
    with caplog.at_level(logging.INFO, logger="atroposlib.envs"):
        runtime._restore_backlog()
    assert runtime.backlog == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "restored 2 backlog items" in m and str(runtime.backlog_file) in m for m in warnings
    ), warnings
