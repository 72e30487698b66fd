"""Upstream's reporting hooks: called at upstream's points, with upstream's keys, into wandb."""

from __future__ import annotations

import asyncio
import json
import re
import time

import numpy as np
import pytest

pytest.importorskip("transformers")

from atroposlib.envs.base import BaseEnvConfig, ServerBaseline
from tests.support.arith_env import ArithEnv
from tests.support.groups import RecordingClient
from tests.support.served import give_client
from tests.support.wandb_offline import offline_runs


class HookedEnv(ArithEnv):
    """Overrides every reporting hook the way upstream envs do, and records the calls."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []
        self.tables: list[dict] = []

    async def add_rollouts_for_wandb(self, scored_data, item=None):
        self.calls.append(f"add_rollouts:{item}")
        # upstream envs keep wider tuples and build their own table
        self.rollouts_for_wandb.append([("text", scored_data["scores"][0], "extra column")])

    async def create_rollout_table(self, wandb_metrics):
        self.calls.append("create_rollout_table")
        self.tables.append({"rows": sum(len(g) for g in self.rollouts_for_wandb)})
        self.rollouts_for_wandb = []
        wandb_metrics["train/custom_table_rows"] = self.tables[-1]["rows"]
        return await super().create_rollout_table(wandb_metrics)

    def perf_stats(self, metrics_dict):
        self.calls.append("perf_stats")
        return super().perf_stats(metrics_dict)

    async def wandb_log(self, wandb_metrics=None):
        wandb_metrics = dict(wandb_metrics or {})
        wandb_metrics["train/mine"] = 0.25
        await super().wandb_log(wandb_metrics)


def make_env(tiny_model_path, **settings) -> HookedEnv:
    config = BaseEnvConfig(tokenizer_name=str(tiny_model_path), group_size=2, **settings)
    env = HookedEnv(config, ServerBaseline(), testing=True)
    give_client(env, RecordingClient())
    env.env_id = 0
    env.max_token_len = 100
    return env


def group(scores=(1.0, 0.0)) -> dict:
    tokens = [[5, 6, 7, 8] for _ in scores]
    return {"tokens": tokens, "masks": [[-100, -100, 7, 8] for _ in scores], "scores": list(scores)}


def test_hooks_run_at_upstreams_points_and_the_log_has_upstreams_keys(tiny_model_path, caplog):
    env = make_env(tiny_model_path, use_wandb=False)
    asyncio.run(env.handle_send_to_api(group(), item="item-7"))
    asyncio.run(env.handle_send_to_api(group(scores=(1.0, 1.0)), item="same-scores"))
    assert env.calls == ["add_rollouts:item-7"], "a dropped group reached add_rollouts_for_wandb"
    env.task_duration = [0.5, 1.5]
    env.train_scores = [[1.0, 0.0]]  # as collect_trajectories keeps them
    with (
        caplog.at_level("INFO", logger="atroposlib.envs"),
        caplog.at_level("DEBUG", logger="atroposlib.envs.metrics"),
    ):
        asyncio.run(env.wandb_log())
    assert env.calls[1:] == ["create_rollout_table", "perf_stats"]
    assert env.tables == [{"rows": 1}]
    (full,) = [r for r in caplog.records if r.name == "atroposlib.envs.metrics"]
    assert full.levelname == "DEBUG" and full.getMessage().startswith("step 0 metrics: {")
    logged = json.loads(full.getMessage().removeprefix("step 0 metrics: "))
    for key in (
        "train/mine",
        "train/custom_table_rows",
        "train/completion_lengths",
        "train/completion_lengths_std",
        "train/completion_lengths_p95",
    ):
        assert key in logged, (key, logged)
    assert logged["train_perf/task_duration_mean"] == 1.0  # numpy's mean, as a plain number
    assert "np.float64" not in full.getMessage()
    (short,) = [r.getMessage() for r in caplog.records if r.name == "atroposlib.envs"]
    # no groups/min yet: the sends span milliseconds, not the 10 s a rate needs
    assert short == "step 0: accuracy 0.500, 0 failed, 1 dropped (1 same_scores)", short
    assert env.completion_lengths == [] and env.task_duration == []


def test_wandb_gets_prefixed_keys_and_the_trainers_project(
    tiny_model_path, tmp_path, monkeypatch, fresh_wandb
):
    wandb = fresh_wandb
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    env = make_env(tiny_model_path, use_wandb=True, wandb_name="arith")
    env.wandb_prepend = "arith_env"
    env.curr_step = 3

    class WandbInfo(RecordingClient):
        async def wandb_info(self):
            return {"project": "trainer-project", "group": "trainer-group"}

    give_client(env, WandbInfo())
    asyncio.run(env.setup_wandb())
    asyncio.run(env.handle_send_to_api(group()))
    asyncio.run(env.wandb_log({"train/extra": 2.0}))
    run = env._wandb_run
    assert run.settings.mode == "offline"
    run.finish()
    (recorded,) = offline_runs(tmp_path)
    assert (recorded.project, recorded.group) == ("trainer-project", "trainer-group")
    assert recorded.name.startswith("arith-") and len(recorded.name.split("-")[-1]) == 6
    (row,) = recorded.history
    assert row["_step"] == 3
    assert row["arith_env_train/extra"] == 2.0 and row["arith_env_train/mine"] == 0.25
    assert row["arith_env_train/custom_table_rows"] == 1
    assert not {"train/extra", "train/mine"} & set(row), "keys were not prefixed"
    assert wandb.run is None


def test_without_wandb_the_rollout_table_is_not_built(tiny_model_path, monkeypatch):
    """Every env process imported wandb at its first log to build a table nobody read."""
    from atroposlib.envs import reporting

    def no_import():
        raise AssertionError("wandb was imported with use_wandb off")

    monkeypatch.setattr(reporting, "_wandb", no_import)
    config = BaseEnvConfig(tokenizer_name=str(tiny_model_path), group_size=2, use_wandb=False)
    env = ArithEnv(config, ServerBaseline(), testing=True)
    env.rollouts_for_wandb = [[("text", 1.0)]]
    metrics = asyncio.run(env.create_rollout_table({"train/x": 1.0}))
    assert metrics == {"train/x": 1.0}
    env.config.use_wandb = True
    monkeypatch.setattr(reporting, "_wandb", lambda: None)  # on, but not installed
    assert asyncio.run(env.create_rollout_table({})) == {}


def test_groups_per_minute_is_the_last_minutes_rate_not_the_average_since_start(
    tiny_model_path, caplog
):
    """An env started 1,000 s ago, waited for the trainer, then sent 60 groups in the
    last minute: it says 60 groups/min (an average since its start said 4.2)."""
    env = make_env(tiny_model_path, use_wandb=False)
    asyncio.run(env.handle_send_to_api(group(), item="sent"))
    assert env.stats["groups_sent"] == 1 and env.groups_rate.samples[-1][1] == 1
    env.start_time -= 1000
    now = time.monotonic()
    env.groups_rate.samples.clear()
    for seconds_ago, sent in ((1000, 0), (60, 10), (30, 40)):  # the start, then two sends
        env.groups_rate.add(now - seconds_ago, sent)
    env.stats["groups_sent"] = 70
    with caplog.at_level("INFO", logger="atroposlib.envs"):
        asyncio.run(env.wandb_log())
    (short,) = [r.getMessage() for r in caplog.records if r.name == "atroposlib.envs"]
    shown = re.fullmatch(r"step 0: ([0-9.]+) groups/min, 0 failed", short)
    assert shown and 59.0 < float(shown[1]) <= 60.0, short  # 60 in 60 s and the log's moment


def test_a_step_is_one_short_line_with_plain_numbers():
    """The console's line per step: what a person watches, from upstream's metric keys."""
    from atroposlib.envs.reporting import step_line
    from atroposlib.utils.metrics import get_std_min_max_avg

    metrics = get_std_min_max_avg("train_perf/task_duration", [0.1, 0.3], {})
    metrics.update(
        {
            "train/percent_correct": np.float64(0.3125),
            "env/groups_per_minute": 143.98,
            "env/rollout_errors": np.int64(2),
            "env/worker_timeouts": 1,
            "train/completion_lengths": 2.0,
        }
    )
    line = step_line(12, metrics)
    assert line == "step 12: percent_correct 0.312, 144.0 groups/min, 3 failed"
    metrics |= {"train/accuracy": 0.75, "env/dropped_same_scores": 4, "env/dropped_none": 1}
    assert step_line(100, metrics) == (
        "step 100: accuracy 0.750, 144.0 groups/min, 3 failed, 5 dropped (4 same_scores, 1 none)"
    )
    # an env of its own: a score-like train/ number, else no score at all
    assert step_line(3, {"train/mean_reward": 0.5}) == "step 3: mean_reward 0.500, 0 failed"
    assert step_line(3, {"train/samples": 8}) == "step 3: 0 failed"


def test_the_whole_dict_is_logged_where_the_log_is_a_file_not_a_terminal():
    import io
    import logging

    from atroposlib.envs.reporting import METRICS_LOGGER, keep_full_metrics

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    metrics = logging.getLogger(METRICS_LOGGER)
    before = metrics.level
    try:
        metrics.setLevel(logging.INFO)
        keep_full_metrics(Terminal())
        assert not metrics.isEnabledFor(logging.DEBUG)
        keep_full_metrics(io.StringIO())  # a pipe, or the launcher's log file
        assert metrics.isEnabledFor(logging.DEBUG)
    finally:
        metrics.setLevel(before)


def test_a_served_evaluation_is_one_console_line_that_fits():
    from atroposlib.envs.reporting import eval_line
    from atroposlib.utils.logging import MESSAGE_WIDTH

    metrics = {f"eval/subject_{i}_accuracy": i / 10 for i in range(12)}
    line = eval_line("mod_arithmetic_eval", 40, {"eval/accuracy": 0.76, **metrics, "note": "x"})
    assert line.startswith("eval mod_arithmetic_eval at step 40: accuracy 0.760")
    assert len(line) <= MESSAGE_WIDTH and "\n" not in line and not line.endswith(",")
