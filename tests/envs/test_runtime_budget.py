"""The off-policy bound holds when a group lands while /status-env is answering.

A real run-api; the env is a stand-in whose only job is to say whether the
runtime asked it for more work.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import httpx

from atroposlib.envs import serve_hooks
from atroposlib.envs.api_client import TrajectoryClient
from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.runtime import EnvRuntime
from tests.support.groups import make_group, register_env, start_trainer
from tests.support.waiting import wait_until_async


class LateDeliveryClient(TrajectoryClient):
    """Delivers spooled groups after the API answered /status-env, before the caller reads it."""

    polls = 0

    async def status_env(self, env_id: int, progress: dict | None = None) -> dict:
        status = await super().status_env(env_id, progress)
        await self.flush()
        self.polls += 1
        return status


class CountingEnv(SimpleNamespace):
    """Just what the serve loop touches: the status hooks, counters, the item source."""

    _trainer_batch_seen = None
    client = property(lambda self: self._runtime.client)  # BaseEnv's: the runtime's
    get_status = serve_hooks.get_status
    get_server_info = serve_hooks.get_server_info
    env_step_checks = serve_hooks.env_step_checks

    async def get_next_item(self):
        self.items_asked += 1
        return None


def test_group_delivered_during_status_poll_still_counts(api, tmp_path: Path):
    with httpx.Client(base_url=api.url, timeout=30) as http:
        start_trainer(http, batch_size=4, max_token_len=64)
        env_id = register_env(http, group_size=2)["env_id"]
        # one group queued; the bound (1 batch of 4 = 2 groups of 2) leaves room for one more
        assert (
            http.post("/scored_data", json=make_group(2, tag=1, env_id=env_id)).status_code == 200
        )

    config = BaseEnvConfig(
        group_size=2, batch_size=4, max_batches_offpolicy=1, max_num_workers=4, steps_per_eval=0
    )
    env = CountingEnv(
        config=config,
        env_id=env_id,
        curr_step=0,
        checkpoint_interval=-1,
        items_sent_this_step=0,
        stats=Counter(),
        items_asked=0,
        backlog=[],
        mainloop_timings=[],
        workers_added_list=[],
    )

    async def scenario() -> tuple[int, int]:
        runtime = EnvRuntime(env, state_dir=tmp_path)
        runtime.client = LateDeliveryClient(api.url, tmp_path / "spool")
        env._runtime = runtime
        # ... and that one more is spooled, delivered only during the next status poll
        runtime.client.send([make_group(2, tag=2, env_id=env_id)])
        runtime.client._flusher.cancel()
        loop = asyncio.create_task(runtime._loop())
        # a second poll starts only after the first one's answer was acted on
        await wait_until_async(
            lambda: runtime.client.polls >= 2 or loop.done(), 30, "the loop polled only once"
        )
        runtime.stopping.set()
        await loop
        delivered = runtime.client.counters["groups_delivered"]
        await runtime.client.http.aclose()
        return env.items_asked, delivered

    items_asked, delivered = asyncio.run(scenario())
    assert delivered == 1
    assert items_asked == 0, "the runtime started a worker beyond max_batches_offpolicy"


def test_a_starving_trainer_always_gets_one_worker():
    """An env whose weight share is diluted (here 0.25: three registrations of crashed
    copies still count) and whose window is full still works while the queue cannot
    make a batch; once it can, the window holds again."""
    config = BaseEnvConfig(group_size=8, batch_size=64, max_batches_offpolicy=3, max_num_workers=4)
    runtime = EnvRuntime.__new__(EnvRuntime)  # only what the budget reads
    runtime.env = SimpleNamespace(config=config)
    runtime.client = SimpleNamespace(pending=lambda: 0)
    runtime.eval_blocking, runtime.eval_task = False, None
    starving = {"env_weight": 0.25, "self_queue_size": 6, "queue_size": 6}
    assert runtime._worker_budget(starving, in_transit=0) == 1
    assert runtime._worker_budget({**starving, "queue_size": 8}, in_transit=0) == 0
