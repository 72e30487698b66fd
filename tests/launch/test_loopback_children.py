"""Every process `atropos-launch` starts binds and calls loopback only.

Plans are built as `--dry-run` builds them (nothing starts), from the test config and
from the configs shipped in `configs/`. Each child's command is read the way the child
reads it: run-api's and the inference server's own parsers decide what they bind.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from atroposlib.api.settings import APISettings
from atroposlib.cli import inference_server, run_api
from atroposlib.inference.launcher import EngineConfig
from atroposlib.launch.config import load_config
from atroposlib.launch.plan import Plan, ProcessPlan, plan
from atroposlib.utils.exposure import is_loopback
from atroposlib.utils.flags import model_from_args
from atroposlib.utils.tiny_model import TINY_VLM_NAME
from tests.support.launch import launch_config, write_config
from tests.support.source import REPO

SHIPPED = sorted((REPO / "configs").glob("*.yaml"))


def children(resolved: Plan) -> list[ProcessPlan]:
    engine = [resolved.engine] if resolved.engine else []
    return [resolved.api, *engine, resolved.trainer, *resolved.environments]


def exposed_values(child: ProcessPlan) -> list[str]:
    """Every host or URL the child is told to bind or call, non-loopback ones named."""
    command = child.command
    problems = []
    for index, arg in enumerate(command):
        flag = arg.split("=", 1)[0]
        if flag.rstrip("-").endswith("host") and flag.startswith("--"):
            value = arg.split("=", 1)[1] if "=" in arg else command[index + 1]
            if not is_loopback(value):
                problems.append(f"{child.name}: {flag} {value}")
    urls = [a for a in command if "://" in a] + [v for v in child.env.values() if "://" in v]
    urls += [child.health_url] if child.health_url else []
    for url in urls:
        host = urlsplit(url.split("=", 1)[-1]).hostname or ""
        if not is_loopback(host):
            problems.append(f"{child.name}: calls {url}")
    return problems


def assert_loopback_only(resolved: Plan) -> None:
    assert is_loopback(urlsplit(resolved.api_url).hostname)
    assert is_loopback(urlsplit(resolved.engine_url).hostname)
    problems = [p for child in children(resolved) for p in exposed_values(child)]
    assert problems == []
    api = api_settings(resolved.api)
    assert is_loopback(api.host) and api.exposure_problem() is None
    if resolved.engine is not None:
        assert "--host" in resolved.engine.command
        if "atroposlib.cli.inference_server" in resolved.engine.command:
            engine = engine_settings(resolved.engine)
            assert is_loopback(engine.host) and engine.exposure_problem() is None
    else:  # the trainer starts the engine itself, from EngineConfig's defaults
        assert is_loopback(EngineConfig.model_fields["host"].default)


def api_settings(child: ProcessPlan) -> APISettings:
    start = child.command.index("atroposlib.cli.run_api") + 1
    args = run_api.build_parser().parse_args(child.command[start:])
    return model_from_args(APISettings, args)


def engine_settings(child: ProcessPlan) -> inference_server.InferenceServerSettings:
    start = child.command.index("atroposlib.cli.inference_server") + 1
    args = inference_server.build_parser().parse_args(child.command[start:])
    return model_from_args(inference_server.InferenceServerSettings, args)


def plan_of(tmp_path: Path, **overrides) -> Plan:
    path = write_config(tmp_path / "c.yaml", launch_config(tmp_path / "run", **overrides))
    return plan(load_config(path), path)


def test_the_trainer_run_engine_layout_binds_loopback(tmp_path, tiny_model_path):
    resolved = plan_of(tmp_path)
    assert resolved.engine is None
    assert_loopback_only(resolved)


def test_a_standalone_engine_binds_loopback(tmp_path, tiny_model_path):
    resolved = plan_of(tmp_path, engine={"engine": "transformers"})
    assert resolved.engine is not None
    command = resolved.engine.command
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert_loopback_only(resolved)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_config_binds_loopback(path, tmp_path, tiny_model_path):
    config = load_config(path)
    update = {
        "run_dir": str(tmp_path / "run"),
        "api": config.api.model_copy(update={"port": "auto"}),
    }
    if config.teacher is not None:  # the same commands, without a minute's tiny-teacher build
        update["teacher"] = config.teacher.model_copy(update={"model": "tiny"})
    if config.model == TINY_VLM_NAME:  # the same commands, without tiny-vl's 100 s build
        update["model"] = "tiny"
    if config.replay is not None:  # its run to replay is a placeholder, set with --set
        update["replay"] = config.replay.model_copy(update={"run": str(tmp_path)})
    assert_loopback_only(plan(config.model_copy(update=update), path))


def test_the_check_can_fail():
    """A child told to bind everywhere, or to call another machine, is named."""
    child = ProcessPlan(
        "engine",
        ["python", "-m", "x", "--host", "0.0.0.0", "--env.rollout_server_url=http://10.0.0.5:8000"],
        health_url="http://127.0.0.1:9/health",
    )
    assert exposed_values(child) == [
        "engine: --host 0.0.0.0",
        "engine: calls --env.rollout_server_url=http://10.0.0.5:8000",
    ]
