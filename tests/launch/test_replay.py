"""A launch YAML's `replay:` section: a supervised child `replay` that posts a stored
run's groups into this run's API (`atropos-rollouts replay`), done at exit 0, restarted
after a crash, and the run's end at exit 2; environments may then be none at all, or
evaluate-only ones. The plan is tested in-process; one dry run plans and checks such a
run for real."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from atroposlib.cli.launch import main
from atroposlib.launch.config import ConfigError, LaunchConfig, load_config
from atroposlib.launch.plan import ProcessPlan
from atroposlib.launch.processes import REPLAY_MODULE, Shared, replay_plan
from atroposlib.launch.resume import LaunchRecord
from atroposlib.launch.supervisor import Launcher, RunFailed
from tests.support.launch import ARITH_ENV, launch_config, role_key, write_config
from tests.support.report_runs import made_up_run


def loaded(tmp_path: Path, data: dict) -> LaunchConfig:
    return load_config(write_config(tmp_path / "c.yaml", data))


@pytest.mark.unit
def test_environments_may_be_none_with_a_replay_and_only_then(tmp_path):
    replayed = loaded(tmp_path, {"model": "tiny", "replay": {"run": "r", "steps": " 3:9"}})
    assert replayed.environments == [] and replayed.replay and replayed.replay.steps == "3:9"
    evaluated = [{"script": "e.py", "evaluate_only": True}]
    both = {"model": "tiny", "replay": {"run": "r"}, "environments": evaluated}
    assert loaded(tmp_path, both).environments[0].evaluate_only
    nothing_trains = "give an environment that samples for training, or a replay: section"
    refused = [
        ({"model": "tiny"}, f"environments: Field required: {nothing_trains}"),
        ({"model": "tiny", "environments": evaluated}, "every environment is evaluate_only: "),
        ({"model": "tiny", "replay": {"run": "r", "steps": "9:3"}}, "replay.steps: Value error"),
        ({**both, "environments": [{**evaluated[0], "copies": 2}]}, "evaluated once"),
    ]
    for data, why in refused:
        with pytest.raises(ConfigError) as refusal:
            loaded(tmp_path, data)
        assert why in str(refusal.value) and str(refusal.value).count(":") < 6, refusal.value


@pytest.mark.unit
def test_the_replay_is_the_rollouts_command_with_an_environments_key(tmp_path):
    """Paths relative to the YAML's folder, the run's API, and in its environment the
    environment key (never the run's own key, never in argv)."""
    (tmp_path / "runs" / "parent").mkdir(parents=True)
    (tmp_path / "rescored").mkdir()
    base = tmp_path / "configs"
    base.mkdir()
    shared = Shared(
        run_dir=tmp_path / "run",
        python="py",
        model="m",
        served="m",
        api_url="http://127.0.0.1:5",
        engine_port=6,
        key="the-runs-key",
    )
    section = {"run": "../runs/parent", "rescored": str(tmp_path / "rescored"), "steps": "3:9"}
    config = LaunchConfig.model_validate({"model": "m", "replay": section})
    replay = replay_plan(config, shared, base)
    assert replay is not None and replay.name == "replay"
    assert replay.command == [
        *("py", "-m", REPLAY_MODULE, "replay", str(tmp_path / "runs" / "parent")),
        *("--into", "http://127.0.0.1:5"),
        *("--rescored", str(tmp_path / "rescored"), "--steps", "3:9"),
    ]
    assert replay.env["ATROPOS_API_KEY"] == role_key("the-runs-key", "env")
    assert "the-runs-key" not in [*replay.command, *replay.env.values()]
    assert replay.done_at_exit_0 and replay.max_restarts == 3 and replay.health_url is None
    from atroposlib.cli.rollouts import build_parser  # the command it runs takes these

    parsed = build_parser().parse_args(replay.command[3:])
    assert (parsed.command, parsed.run_dir, parsed.into) == (
        *("replay", str(tmp_path / "runs" / "parent"), "http://127.0.0.1:5"),
    )
    assert (parsed.rescored, parsed.steps) == (str(tmp_path / "rescored"), "3:9")
    bare = LaunchConfig.model_validate({"model": "m", "replay": {"run": "../runs/parent"}})
    assert replay_plan(bare, shared, base).command[-2:] == ["--into", "http://127.0.0.1:5"]
    missing = LaunchConfig.model_validate({"model": "m", "replay": {"run": "../runs/gone"}})
    with pytest.raises(ConfigError, match="replay.run: no directory ../runs/gone"):
        replay_plan(missing, shared, base)


class Exited:
    """A child process that has exited with `returncode`, as `Popen.poll` shows it."""

    def __init__(self, returncode: int) -> None:
        self.returncode = returncode

    def poll(self) -> int:
        return self.returncode


@pytest.mark.unit
def test_the_replay_is_done_at_exit_0_restarted_after_a_crash_and_final_at_exit_2(tmp_path):
    plan = made_up_run(tmp_path / "run")
    plan.replay = ProcessPlan("replay", ["py"], max_restarts=3, done_at_exit_0=True)
    plan.environments[2].evaluate_only = True  # flat<b>: evaluated after the run only
    config = write_config(tmp_path / "c.yaml", {"model": "tiny", "replay": {"run": "r"}})
    launcher = Launcher(plan, LaunchRecord(config=str(config)))
    out = io.StringIO()
    launcher.console = Console(file=out, width=200)
    try:
        assert [c.name for c in launcher.children] == [
            *("api", "trainer", "learns-1", "learns-2", "replay")  # no child for flat<b>
        ]
        replay = launcher.replay
        assert replay is not None
        replay.proc = Exited(0)
        launcher._supervise_child(replay)
        assert replay.next_restart_at is None and "replay" not in out.getvalue()

        replay.proc = Exited(1)
        launcher._supervise_child(replay)
        assert replay.next_restart_at is not None
        assert "replay crashed with exit code 1; restarting in 1s" in out.getvalue()

        replay.next_restart_at = None
        replay.log_path.parent.mkdir(parents=True)
        said = "atropos-rollouts replay: the run stored no groups at steps 3:9"
        replay.log_path.write_text(f"--- start: py\n{said}\n\n")
        replay.proc = Exited(2)
        with pytest.raises(RunFailed) as failed:
            launcher._supervise_child(replay)
        assert failed.value.why == (
            f"exited with code 2: a restart would fail the same way ({said})"
        )
    finally:
        launcher.status.close()


@pytest.mark.integration
def test_a_run_of_replayed_groups_and_an_evaluate_only_environment_plans_and_checks(
    tmp_path, capsys
):
    """The dry run of such a run: the replay's command after the environments', and the
    evaluate-only environment's own `evaluate` command, which the launch's checks ran
    through that environment's parser like any other."""
    (tmp_path / "parent").mkdir()
    config = launch_config(tmp_path / "run")
    config["environments"] = [{"script": str(ARITH_ENV), "evaluate_only": True}]
    config["replay"] = {"run": "parent", "steps": "1:4"}
    assert main([str(write_config(tmp_path / "c.yaml", config)), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split(":")[0] for line in lines[:4]]
    assert names == ["api", "trainer", "arith_env (after the trainer finishes)", "replay"]
    assert f"{ARITH_ENV} evaluate --env.rollout_server_url" in lines[2]
    assert f"-m {REPLAY_MODULE} replay {tmp_path / 'parent'} --into http://127.0.0.1:" in lines[3]
    # nothing samples for training: the replay fills every step's batch (4 steps of 8)
    assert lines[3].endswith("--steps 1:4 --fill 32")
    checked = next(line for line in lines if line.startswith("checked: "))
    assert "environment arith_env" in checked


def test_a_run_trained_only_on_replayed_groups_is_judged_by_its_evaluations():
    """Its trained scores are the stored ones, so a rise of theirs would mean nothing."""
    from atroposlib.launch.report import replay_verdict

    entry = {
        "evaluate_only": True,
        "first_evaluation": {"step": 0, "eval/accuracy": 0.56},
        "last_evaluation": {"step": 100, "eval/accuracy": 0.88},
    }
    verdict = replay_verdict({"mod_arithmetic": entry})
    assert verdict["learned"] is None
    assert verdict["verdict"].endswith(
        "not this policy's; mod_arithmetic: eval/accuracy 0.560 at step 0 -> 0.880 at step 100"
    )
    assert replay_verdict({})["verdict"].endswith("no evaluation says how the policy changed")
