"""An env overriding upstream's logging and loop hooks, with wandb offline.

The env appends every hook call to a jsonl file; the tests read it to see that the
base class called each hook at upstream's points with upstream's state, and read
the offline wandb run file to see that what the hooks added was logged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.compat_runs import (
    process_groups,
    pull_batches,
    read_jsonl,
    serve_flags,
    serving_to_trainer,
    tiny_flags,
)
from tests.support.wandb_offline import offline_runs

pytest.importorskip("torch")


@pytest.fixture(autouse=True, scope="module")
def wandb_installed() -> None:
    """Skips without wandb, importing it only where these tests run (not at collection,
    in every pytest process)."""
    pytest.importorskip("wandb")


SCRIPT = "wandb_hooks_server.py"
PROMPTS = {"Name a colour.", "Name an animal.", "Name a fruit."}
ENTRY_HOOKS = ("setup_wandb", "register_env", "get_server_info")
STATUS_KEYS = {"current_step", "queue_size", "env_weight", "self_queue_size", "max_group_size"}


def calls(hook_log: Path) -> dict[str, list[dict]]:
    seen: dict[str, list[dict]] = {}
    for record in read_jsonl(hook_log):
        seen.setdefault(record["hook"], []).append(record)
    return seen


def has_key(keys: set[str], name: str) -> bool:
    """A logged key, with or without the `<wandb_name>_` prefix upstream adds in serve
    (a table is recorded as `<name>/_type`, `<name>/path`...)."""
    return any(
        key == name or key.endswith(f"_{name}") or key.startswith(f"{name}/") or f"_{name}/" in key
        for key in keys
    )


def check_logging_hooks(seen: dict[str, list[dict]], groups: int) -> None:
    added = seen.get("add_rollouts_for_wandb", [])
    assert len(added) >= groups, sorted(seen)
    for call in added:
        assert call["item"]["prompt"] in PROMPTS and call["num_sequences"] == 2
    assert seen.get("wandb_log"), sorted(seen)
    assert any("train/hooked_reply_chars" in c["keys"] for c in seen["wandb_log"])
    # the base wandb_log builds the table and the perf stats through the overridable hooks
    assert seen.get("create_rollout_table"), sorted(seen)
    assert any(c["rows"] > 0 for c in seen["create_rollout_table"])
    assert seen.get("perf_stats"), sorted(seen)
    first_log = seen["wandb_log"][0]["time"]
    assert seen["create_rollout_table"][0]["time"] >= first_log
    assert seen["perf_stats"][0]["time"] >= seen["create_rollout_table"][0]["time"]


def check_offline_run(workdir: Path, project: str | None = None, group: str | None = None) -> None:
    runs = offline_runs(workdir)
    assert len(runs) == 1, f"{len(runs)} offline runs under {workdir}"
    run = runs[0]
    if project is not None:
        assert (run.project, run.group) == (project, group)
    for key in (
        "train/hooked_reply_chars",
        "train/hooked_rollouts",
        "train_perf/hooked_perf_stats",
    ):
        assert has_key(run.keys, key), (key, sorted(run.keys))


def test_serve_calls_the_hooks_and_logs_to_the_trainers_wandb_project(
    api_factory, inference_server, tiny_model_path, tmp_path
):
    api = api_factory()
    workdir = tmp_path / "serve"
    hook_log = workdir / "hooks.jsonl"
    args = [
        *tiny_flags(tiny_model_path, f"{inference_server.url}/v1"),
        *serve_flags(api.url, "--env.hook_log", str(hook_log), "--env.total_steps", "2"),
    ]
    serving = serving_to_trainer(api.url, SCRIPT, workdir, *args, batch_size=4, max_token_len=2048)
    with serving as (client, env):
        pull_batches(client, 2, env)
        # at total_steps (with work queued), upstream's env_manager returns by itself
        code = env.wait(90)
    assert code == 0, env.log()[-6000:]
    seen = calls(hook_log)
    for hook in (*ENTRY_HOOKS, "env_step_checks"):
        assert seen.get(hook), f"{hook} never called; called: {sorted(seen)}"
    check_logging_hooks(seen, groups=4)
    check_offline_run(workdir, project="compat-project", group="compat-group")
    checks = seen["env_step_checks"]
    wandb_setup, registered, info = (seen[h][0] for h in ENTRY_HOOKS)
    entry_times = [wandb_setup["time"], registered["time"], info["time"], checks[0]["time"]]
    project_and_group = (wandb_setup["project"], wandb_setup["group"])
    # every deviation from upstream's env_manager is listed at once
    expectations = {
        "setup_wandb called once": len(seen["setup_wandb"]) == 1,
        "wandb project/group from /wandb_info": project_and_group
        == ("compat-project", "compat-group"),
        "register_env set env_id and wandb_prepend": registered["env_id"] == 0
        and bool(registered["wandb_prepend"]),
        "get_server_info adopted the trainer's batch_size, max_token_len": (
            info["batch_size"] == 4 and info["max_token_len"] == 2048
        ),
        "setup_wandb, register_env, get_server_info, env_step_checks in order": entry_times
        == sorted(entry_times),
        "status_dict has /status-env's fields": all(
            STATUS_KEYS <= set(c["status_dict"]) for c in checks
        ),
        # our loop ends once the trainer step plus queued work reaches total_steps
        # (upstream: exceeds it); env_step_checks still sees that last poll
        "env_step_checks saw the poll that ended the run": any(
            c["status_dict"]["current_step"] + c["status_dict"]["queue_size"] * 2 / 4 >= 2
            for c in checks
        ),
    }
    failed = [name for name, ok in expectations.items() if not ok]
    assert not failed, f"{failed}; hook calls: {read_jsonl(hook_log)}"


def test_process_calls_the_hooks_and_logs_offline(inference_server, tiny_model_path, tmp_path):
    hook_log = tmp_path / "hooks.jsonl"
    groups = process_groups(
        SCRIPT,
        tmp_path,
        *tiny_flags(tiny_model_path, f"{inference_server.url}/v1"),
        *("--env.hook_log", str(hook_log), "--env.total_steps", "2"),
        groups_file="hooked.jsonl",
    )
    assert len(groups) == 2
    seen = calls(hook_log)
    check_logging_hooks(seen, groups=2)
    assert len(seen["wandb_log"]) >= 2, "process logs after every group"
    check_offline_run(tmp_path)
