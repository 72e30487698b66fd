"""The environment's API client: spooled groups reach the API once, even when closing mid-flush."""

from __future__ import annotations

import asyncio

from atroposlib.envs.api_client import TrajectoryClient
from tests.support.groups import make_group, start_trainer


def test_close_while_the_background_flusher_runs(api, client, tmp_path):
    start_trainer(client, batch_size=4)

    async def produce() -> int:
        trajectories = TrajectoryClient(api.url, tmp_path / "spool")
        for tag in range(20):
            trajectories.send([make_group(2, tag=tag + 3)])
        await asyncio.sleep(0)  # let the background flusher start delivering
        await trajectories.close()  # flushes the rest concurrently with it
        return trajectories.pending()

    assert asyncio.run(produce()) == 0
    status = client.get("/status").json()
    assert status["queued_sequences"] == 40, "every group arrives exactly once"
