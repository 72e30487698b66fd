"""`replay`: stored groups posted into a running API as off-policy data, once each."""

from __future__ import annotations

import os
import subprocess
import sys

from atroposlib.envs.reward_spec import load_reward
from atroposlib.protocol import WEIGHT_VERSIONS_FIELD
from atroposlib.rollouts.replay import (
    REPLAYED_FROM,
    informative,
    ordered,
    passes,
    replay,
    rescored_groups,
)
from atroposlib.rollouts.rescore import rescore
from atroposlib.rollouts.store import read_store
from tests.support.groups import drain_batches, register
from tests.support.inprocess_api import inprocess_api
from tests.support.stored_runs import REWARDS, write_stored_run


def test_replayed_groups_keep_their_logprobs_and_versions_and_queue_once(tmp_path):
    run_dir = write_stored_run(tmp_path / "run")
    store = read_store(run_dir)
    groups = ordered(store.groups, (2, 3))
    assert [g.step for g in groups] == [2, 2, 3, 3]
    with inprocess_api(tmp_path / "state") as api:
        register(api, max_token_len=256, batch_size=8)
        done = replay(passes(groups, None), run_dir, "", None, client=api, say=lambda line: None)
        assert done.posted == 4 and done.sequences == 16 and done.refused == []
        served = [group for batch in drain_batches(api) for group in batch]
        again = replay(passes(groups, None), run_dir, "", None, client=api, say=lambda line: None)
        assert again.posted == 4 and drain_batches(api) == []  # the same keys: nothing new
    assert len(served) == 4
    for sent, group in zip(groups, served, strict=True):
        assert group["tokens"] == sent.data["tokens"] and group["scores"] == sent.scores
        assert group["inference_logprobs"] == sent.data["inference_logprobs"]
        assert group[WEIGHT_VERSIONS_FIELD] == sent.data[WEIGHT_VERSIONS_FIELD]
        assert group[REPLAYED_FROM] == {
            "run": str(run_dir.resolve()),
            "env": "mod_arithmetic",
            "group_id": sent.group_id,
            "step": sent.step,
            "reward": None,
        }
        assert group["env_id"] is None and "item" not in group
        assert group["group_id"].startswith("replay-") and group["group_id"] != sent.group_id


def test_rescored_groups_go_with_their_new_scores_and_a_refusal_is_counted(tmp_path):
    run_dir = write_stored_run(tmp_path / "run")
    store = read_store(run_dir)
    rescore(store, "mod_arithmetic", load_reward(f"{REWARDS}:right"), tmp_path / "right")
    groups = ordered(rescored_groups(tmp_path / "right"), None)
    assert [g.step for g in groups] == [1, 1, 2, 2, 3, 3, None]
    with inprocess_api(tmp_path / "state") as api:
        register(api, max_token_len=256, batch_size=8)
        replay(passes(groups, None), run_dir, "", None, client=api, say=lambda line: None)
        served = [group for batch in drain_batches(api) for group in batch]
        assert [g["scores"] for g in served] == [[1.0, 0.0, 0.0, 0.0]] * 6
        assert served[0][REPLAYED_FROM]["reward"].endswith("rewards_for_tests.py:right")
    with inprocess_api(tmp_path / "short") as api:
        register(api, max_token_len=32, batch_size=8)  # shorter than every sequence
        done = replay(
            passes(groups[:2], None), run_dir, "", None, client=api, say=lambda line: None
        )
    assert done.posted == 0 and len(done.refused) == 2 and "HTTP 422" in done.refused[0]


def test_the_command_needs_the_runs_key_and_posts_with_it(tmp_path, api_factory):
    run_dir = write_stored_run(tmp_path / "run")
    api = api_factory("--api-key", "k" * 32)
    command = [
        sys.executable,
        "-m",
        "atroposlib.cli.rollouts",
        "replay",
        str(run_dir),
        "--into",
        api.url,
        "--steps",
        "1:1",
    ]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "refused the key (HTTP 401)" in refused.stderr and "ATROPOS_API_KEY" in refused.stderr
    keyed = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ATROPOS_API_KEY": "k" * 32},
    )
    assert keyed.returncode == 0, keyed.stderr
    assert "replayed 2 groups (8 sequences) into" in keyed.stdout


def test_uniform_groups_are_left_out_and_a_fill_posts_passes_with_ids_of_their_own(tmp_path):
    """A run that samples nothing needs its steps x batch: the informative groups are
    posted again, each pass under new ids, so the API queues every pass."""
    run_dir = write_stored_run(tmp_path / "run")
    store = read_store(run_dir)
    rescore(store, "mod_arithmetic", load_reward(f"{REWARDS}:all_ones"), tmp_path / "ones")
    uniform = rescored_groups(tmp_path / "ones")
    assert informative(uniform) == ([], 7)
    kept, left_out = informative(store.groups)
    assert left_out == 0 and len(kept) == 7
    plan = passes(kept[:2], fill=20)  # 2 groups of 4: 3 passes, the last one cut short
    assert [(rank, g.group_id) for rank, g in plan] == [
        (rank, g.group_id) for rank in range(3) for g in kept[:2]
    ][:5]
    with inprocess_api(tmp_path / "state") as api:
        register(api, max_token_len=256, batch_size=4)
        done = replay(plan, run_dir, "", None, client=api, say=lambda line: None)
        served = [group for batch in drain_batches(api) for group in batch]
    assert done.posted == 5 and done.passes == 3 and len(served) == 5
    assert len({g["group_id"] for g in served}) == 5
    assert [g[REPLAYED_FROM].get("pass", 0) for g in served] == [0, 0, 1, 1, 2]
