"""Staleness admission: the trainer's max_staleness narrows an env's off-policy window.

All in-process: the window function by hand-computed cases, and the serve loop's worker
budget on a stand-in runtime (only what `_worker_budget` reads).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from atroposlib.envs.admission import offpolicy_window
from atroposlib.envs.api_client import TrajectoryClient
from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.runtime import EnvRuntime
from atroposlib.protocol import WEIGHT_VERSIONS_FIELD
from tests.support.groups import make_group


@pytest.mark.parametrize(
    ("max_staleness", "current_step", "newest", "window"),
    [
        (None, 9, 0, 3),  # no bound: max_batches_offpolicy, however far behind the engine is
        (None, 0, None, 3),
        (0, 5, 5, 1),  # on-policy: only the batch being produced
        (0, 5, 4, 0),  # ... and none once the engine is one step behind
        (1, 5, 5, 2),  # K=1, lag 0: 1 + 1 - 0
        (1, 5, 4, 1),  # K=1, lag 1: 1 + 1 - 1
        (1, 5, 3, 0),  # K=1, lag 2: 1 + 1 - 2
        (1, 5, 1, 0),  # K=1, lag 4: floored at 0
        (1, 5, None, 2),  # no version seen yet: lag 0
        (1, 5, 7, 2),  # an engine ahead of the step (a resumed run): lag 0
        (10, 5, 5, 3),  # K larger than max_batches_offpolicy: the latter holds
        (10, 12, 5, 3),  # K=10, lag 7: 4 batches would be allowed, 3 are
        (10, 14, 5, 2),  # K=10, lag 9: 10 + 1 - 9
    ],
)
def test_the_window_by_hand(max_staleness, current_step, newest, window):
    assert offpolicy_window(3, max_staleness, current_step, newest) == window


def stand_in_runtime(config: BaseEnvConfig, client) -> EnvRuntime:
    runtime = EnvRuntime.__new__(EnvRuntime)  # only what the budget reads
    runtime.env = SimpleNamespace(config=config)
    runtime.client = client
    runtime.eval_blocking, runtime.eval_task = False, None
    return runtime


def status(step: int, max_staleness: int | None, queue_size: int = 0, mine: int = 0) -> dict:
    return {
        "current_step": step,
        "queue_size": queue_size,
        "self_queue_size": mine,
        "env_weight": 1.0,
        "max_staleness": max_staleness,
    }


# groups of 4, batches of 8: each batch of window is 2 groups; 16 workers never bind
CONFIG = BaseEnvConfig(group_size=4, batch_size=8, max_batches_offpolicy=3, max_num_workers=16)


def budget(newest: int | None, state: dict) -> int:
    client = SimpleNamespace(pending=lambda: 0, newest_weight_version=newest)
    return stand_in_runtime(CONFIG, client)._worker_budget(state, in_transit=0)


def test_the_budget_shrinks_with_the_engines_lag():
    # a queue that already makes a batch (2 groups of 4 = 8), none of it this env's
    full = {"queue_size": 2}
    assert budget(5, status(5, None, **full)) == 6  # 3 batches x 2 groups
    assert budget(0, status(5, None, **full)) == 6  # no bound: the lag does not matter
    assert budget(5, status(5, 1, **full)) == 4  # K=1, lag 0: 2 batches
    assert budget(4, status(5, 1, **full)) == 2  # lag 1: 1 batch
    assert budget(3, status(5, 1, **full)) == 0  # lag 2: nothing would arrive in time
    assert budget(5, status(5, 7, **full)) == 6  # K above the window: the window holds
    assert budget(5, status(5, 1, queue_size=2, mine=1)) == 3  # its own queued group counts
    # upstream's API sends no max_staleness: no bound
    upstream = {k: v for k, v in status(5, None, **full).items() if k != "max_staleness"}
    assert budget(0, upstream) == 6


def test_a_closed_window_still_keeps_one_worker_while_the_trainer_starves():
    """An engine held too far behind closes the window, but while the queue cannot make
    a batch one worker goes on: the trainer's own bound then drops what is too stale,
    and counts it, instead of the run stalling."""
    assert budget(3, status(5, 1, queue_size=1)) == 1  # 4 sequences queued, 8 needed
    assert budget(3, status(5, 1, queue_size=0)) == 1
    assert budget(3, status(5, 1, queue_size=2)) == 0  # a batch is there: none


def test_the_narrowing_is_logged_once(caplog):
    client = SimpleNamespace(pending=lambda: 0, newest_weight_version=5)
    runtime = stand_in_runtime(CONFIG, client)
    with caplog.at_level(logging.INFO, logger="atroposlib.envs"):
        runtime._worker_budget(status(5, 7, queue_size=2), in_transit=0)  # not narrowed
        assert not caplog.records
        for step in (5, 6, 6, 7):
            runtime._worker_budget(status(step, 1, queue_size=2), in_transit=0)
    lines = [r.getMessage() for r in caplog.records if r.name == "atroposlib.envs"]
    assert len(lines) == 1, lines
    assert "max_staleness 1" in lines[0] and "from 3 to 2 batches" in lines[0]


def test_the_versions_the_client_sent_set_the_engines_lag(tmp_path: Path):
    """The runtime reads the engine's version from what its real client sent."""

    async def scenario() -> tuple[int | None, int]:
        client = TrajectoryClient("http://127.0.0.1:9", tmp_path / "spool")
        client.send([{**make_group(2, tag=1), WEIGHT_VERSIONS_FIELD: ["3", "4"]}])
        assert client._flusher is not None
        client._flusher.cancel()  # nothing is delivered: the spool holds the group
        try:
            runtime = stand_in_runtime(CONFIG, client)
            # step 6, K=2: lag 2 leaves 1 batch (2 groups), less the one spooled
            return client.newest_weight_version, runtime._worker_budget(
                status(6, 2, queue_size=2), in_transit=0
            )
        finally:
            await client.http.aclose()

    assert asyncio.run(scenario()) == (4, 1)
