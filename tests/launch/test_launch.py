"""`atropos-launch` end to end on CPU: start, supervise, stop, report, leave nothing behind."""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.cli.report import main as report_main
from atroposlib.launch.report_html import loading_lines
from atroposlib.trainer_contract import read_engine_recipe, read_events, read_metrics
from tests.support.launch import (
    Finished,
    LaunchRun,
    check_the_console,
    console_rows,
    finish,
    launch_config,
)
from tests.support.pace import Pace
from tests.support.source import REPO

EXITS_TWO_ENV = REPO / "tests" / "support" / "exits_two_env.py"


# Every wait on a run is allowed what it costs at the run's own pace (tests/support/
# pace.py), so these bound each test; this only catches a hang outside them.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]


def trained_steps(run_dir) -> int:
    return len(read_metrics(run_dir / "checkpoints" / "metrics.jsonl"))


def long_run(launch, config, until_steps: int) -> tuple[LaunchRun, Pace]:
    """The launch of `config`, once its trainer has done `until_steps`; and its pace."""
    run, run_dir = launch(config), Path(config["run_dir"])
    pace = run.pace(run_dir)
    reached = lambda: trained_steps(run_dir) >= until_steps  # noqa: E731
    assert run.wait(until=reached, pace=pace, steps=until_steps, restarts=1) is None
    return run, pace


def on_the_minimal_trainer(config: dict, steps: int) -> dict:
    """`config` with tests/support/minimal_trainer.py, the contract's smallest trainer, on
    a standalone engine (the launcher waits for the engine a trainer starts; this one
    starts none). Where a test asks what the launcher does, not what the trainer does,
    its start costs a second of CPU, not example_trainer's ten (torch, transformers and
    the policy)."""
    config["engine"] = {"engine": "transformers", "args": ["--num-threads", "1"]}
    config["trainer"] = {
        "module": "tests.support.minimal_trainer",
        "args": {"training_steps": steps, "seq_len": 128, "batch_size": 8},
    }
    return config


def fifty_steps(run_dir) -> dict:
    """A run of 50 steps, longer than any test here lets it go, for the tests of how the
    launcher stops a run."""
    return on_the_minimal_trainer(launch_config(run_dir, steps=50), steps=50)


# One short run (4 steps, the engine restarted from the checkpoint of step 2, an
# ephemeral API) answers each question below about how a run starts, logs, checkpoints,
# reports and cleans up.


@pytest.fixture(scope="module")
def short_run(module_launch) -> Finished:
    run_dir = module_launch.base / "short"
    finished = finish(module_launch(launch_config(run_dir, steps=4)), run_dir, steps=4)
    assert finished.code == 0, finished.output()[-4000:]
    return finished


def test_each_process_of_a_run_logs_to_its_file_and_the_console(short_run):
    out = short_run.output()
    for name in ("api", "trainer", "arith_env"):
        assert (short_run.run_dir / "logs" / f"{name}.log").stat().st_size > 0
        assert f"{name} " in out  # prefixed lines streamed to the console
    check_the_console(out, "arith_env", steps=4)


def test_each_engine_start_is_one_console_line_and_its_command_is_in_the_log(short_run):
    """The first start and the restart at step 2 on the step-2 checkpoint: a short line on
    the console, the whole command in the trainer's log file; the last step restarts
    nothing."""
    out = short_run.output()
    starts = [line for line in out.splitlines() if "| starting cpu engine on" in line]
    assert len(starts) == 2 and starts[1].endswith(("step-2", "(step-2)")), starts
    assert all(console_rows(line) == 1 for line in starts), starts
    trainer_log = short_run.log("trainer")
    assert trainer_log.count("DEBUG atroposlib.inference.command: engine command: ") == 2
    checkpoints = short_run.run_dir / "checkpoints"
    assert f"--model {checkpoints}/step-2" in trainer_log
    assert f"--model {checkpoints}/step-4" not in trainer_log, "the last step restarted the engine"


def test_the_environments_whole_metrics_go_to_its_log_as_json(short_run):
    """The env's whole metrics dict of each step: in its log file as JSON, not on the console."""
    env_log = short_run.log("arith_env")
    full = re.findall(r"DEBUG atroposlib\.envs\.metrics: step \d+ metrics: (.*)", env_log)
    assert full and all("train/accuracy" in json.loads(d) for d in full), env_log[-3000:]
    assert "np.float64" not in env_log


def test_a_restart_mode_run_checkpoints_records_its_events_and_trains_the_weights(
    short_run, tiny_model_path
):
    checkpoints = short_run.run_dir / "checkpoints"
    assert (checkpoints / "step-2" / "model.safetensors").exists()
    assert (checkpoints / "step-4" / "trainer_state.pt").exists()
    assert [r.step for r in read_metrics(short_run.run_dir / "metrics.jsonl")] == [1, 2, 3, 4]
    events = [
        (e.kind.value, e.step, e.detail.get("reason"))
        for e in read_events(checkpoints / "events.jsonl")
    ]
    assert events == [
        ("engine_started", 0, None),
        ("checkpoint_saved", 2, None),
        ("engine_restarted", 2, "new weights"),
        ("checkpoint_saved", 4, None),
    ]
    assert (checkpoints / "engine.log").exists()
    from safetensors.numpy import load_file  # float32 tensors, without importing torch

    base = load_file(tiny_model_path / "model.safetensors")
    trained = load_file(checkpoints / "step-4" / "model.safetensors")
    assert set(trained) == set(base)
    assert any((base[name] != trained[name]).any() for name in base), "no weight changed"


def test_the_report_shows_the_figure_the_rollouts_and_the_machine(short_run):
    run_dir = short_run.run_dir
    assert (run_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (run_dir / "report.html").read_text()
    assert "data:image/png;base64," in page and "What is" in page  # plot and rollouts
    assert "Sample rollouts: end of training" in page
    machine = short_run.numbers()["machine"]
    assert "What these numbers depend on" in page and html.escape(machine["cpu"]) in page
    assert f"[launch] report: {run_dir / 'report.html'}" in short_run.output()


def test_view_run_reads_the_finished_runs_rollouts_with_no_api(short_run):
    """`view-run RUN_DIR`'s page, built in-process (tests/viewer/ serve it in a browser):
    the run's groups by environment, the first one's prompt and scored answers."""
    from atroposlib.viewer.browse import RecordedPage
    from atroposlib.viewer.recorded import read_run

    run = read_run(short_run.run_dir)
    sent = (short_run.run_dir / "rollouts" / "arith_env.jsonl").read_text().splitlines()
    assert list(run.groups) == ["arith_env"] and run.group_count == len(sent)
    first = json.loads(sent[0])
    number, status, group = RecordedPage(run, None, False).view("arith_env", 1, "first")
    assert number == 1 and f"Group 1 of {len(sent)} in arith_env" in status
    replies = [conversation[-1]["content"] for conversation in first["messages"]]
    assert "What is" in group and all(html.escape(reply) in group for reply in replies)


def test_the_report_rebuilds_from_the_run_directory_and_names_the_final_model(short_run):
    """`atropos-report RUN_DIR` writes the launcher's report again from the run's files
    alone; the panel names the final model and prints the two lines that load it. (That
    they load it: the engine restarted on step-2 above loads a checkpoint of this trainer
    with the same `AutoModelForCausalLM.from_pretrained`, atroposlib/inference/sampler.py;
    running the snippet here would cost 8 s of CPU for torch and transformers.)"""
    run_dir, final = short_run.run_dir, short_run.run_dir / "checkpoints" / "step-4"
    launched = short_run.numbers()
    assert launched["final_model"] == str(final)
    # how the trainer served it, for the final checkpoint's evaluation (final_eval.py)
    recipe = read_engine_recipe(run_dir / "checkpoints")
    assert recipe is not None and recipe["engine"] == "cpu" and "port" not in recipe
    lines = loading_lines(str(final))
    assert f"[launch] final model: {final}\n" + "\n".join(lines) + "\n" in short_run.output()
    page = (run_dir / "report.html").read_text()
    (run_dir / "report.html").unlink()
    assert report_main([str(run_dir)]) == 0
    assert short_run.numbers() == launched
    assert (run_dir / "report.html").read_text() == page


def test_the_summary_of_a_short_run_says_it_is_too_short_to_judge(short_run):
    numbers = short_run.numbers()
    assert numbers["steps"] == 4 and numbers["learned"] is None and numbers["seed"] == 0
    assert numbers["engine_restarts"] == 1 and numbers["checkpoints_saved"] == 2  # not at the end
    assert "too few steps to judge learning (4 < 20)" in numbers["verdict"]
    assert "too few steps to judge learning" in short_run.output()
    machine = numbers["machine"]
    assert machine["cpu"] and machine["torch_cpu_capability"] and machine["transformers_version"]


@pytest.mark.learning
def test_the_summary_gives_the_tiny_models_greedy_accuracy(short_run):
    numbers = short_run.numbers()
    assert numbers["tiny_model"]["greedy_accuracy"] >= 0.3 and numbers["tiny_model"]["seed"] == 0


def test_no_process_of_a_finished_run_outlives_the_launcher(short_run):
    assert short_run.run.seen, "the launcher started no processes"
    assert short_run.leftovers == [], "processes outlived the launcher"


# One run of 20 steps in which every sample scores 0.5, its environment sampling from
# an engine of the launcher's own (an `engine:` section), not the trainer's, and its
# trainer tests/support/minimal_trainer.py, which knows nothing of example_trainer.


@pytest.fixture(scope="module")
def flat_run(module_launch) -> Finished:
    run_dir = module_launch.base / "flat"
    config = on_the_minimal_trainer(launch_config(run_dir, steps=20), steps=20)
    config["environments"][0]["env"].update(fixed_score=0.5, ensure_scores_are_not_same=False)
    finished = finish(module_launch(config), run_dir, steps=20)
    assert finished.code == 0, finished.output()[-4000:]
    return finished


def test_a_run_that_does_not_learn_says_so(flat_run):
    """Every sample scores 0.5, so nothing can be learned: the panel and report say it."""
    numbers = flat_run.numbers()
    assert numbers["learned"] is False and numbers["steps"] == 20
    expected = "THE SCORE DID NOT RISE: mean score 0.500 over the first 10 steps, 0.500 over"
    assert numbers["verdict"].startswith(expected)
    assert expected in re.sub(r"[│\s]+", " ", flat_run.output())  # the panel wraps lines
    page = (flat_run.run_dir / "report.html").read_text()
    assert f'<tr class="verdict bad"><th>Verdict</th><td>{expected}' in page
    assert flat_run.leftovers == []


def test_a_standalone_engine_serves_the_environments(flat_run):
    """With an `engine:` section the trainer starts none; envs sample from that engine."""
    commands = json.loads((flat_run.run_dir / "commands.json").read_text())
    assert "atroposlib.cli.inference_server" in " ".join(commands["engine"])
    trainer = commands["trainer"]
    assert trainer[trainer.index("--inference-engine") + 1] == "none"
    engine_port = commands["engine"][commands["engine"].index("--port") + 1]
    env = commands["arith_env"]
    assert env[env.index("--openai.base_url") + 1] == f"http://127.0.0.1:{engine_port}/v1"
    assert trained_steps(flat_run.run_dir) == 20
    assert "starting cpu engine on" not in flat_run.log("trainer")
    assert flat_run.leftovers == []


def test_a_second_trainer_that_keeps_the_contract_runs_under_the_launcher(flat_run):
    """The minimal trainer keeps the contract, so the run works: its steps, checkpoints
    and events are counted from its records, not from its log lines."""
    out, run_dir = flat_run.output(), flat_run.run_dir
    assert "starting cpu engine: (not really" in out  # printed, and not counted
    numbers = flat_run.numbers()
    assert numbers["steps"] == 20
    assert numbers["engine_restarts"] == 0 and numbers["checkpoints_saved"] == 20
    assert "final_model" not in numbers and "final model" not in out  # not Hugging Face's
    assert re.search(r"engine restarts: 0; checkpoints saved: 20", re.sub(r"[│\s]+", " ", out))
    assert [r.step for r in read_metrics(run_dir / "metrics.jsonl")] == list(range(1, 21))
    assert (run_dir / "checkpoints" / "step-20" / "state.json").exists()


def test_a_fork_trains_on_from_its_parents_checkpoint_and_names_its_parent(flat_run, tmp_path):
    """`atropos-rollouts fork` of the flat run at step 18: a run of its own (API, engine,
    environment), whose trainer resumes the parent's checkpoint and trains steps 19 and
    20, and whose report names the parent and step."""
    parent, fork = flat_run.run_dir, tmp_path / "fork"
    checkpoint = parent / "checkpoints" / "step-18"
    with open(tmp_path / "fork.out", "wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "atroposlib.cli.rollouts", "fork", str(parent)]
            + ["--from-step", "18", "--run-dir", str(fork)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=300,
        )
    said = (tmp_path / "fork.out").read_text(errors="replace")
    assert done.returncode == 0, said[-4000:]
    assert f"the trainer starts from {checkpoint} (a fork)" in said
    assert f"forkedfrom{parent}atstep18" in re.sub(r"[│\s]+", "", said)  # the panel wraps
    trainer = json.loads((fork / "commands.json").read_text())["trainer"]
    assert trainer[trainer.index("--resume") + 1] == str(checkpoint)
    assert trainer[trainer.index("--save-path") + 1] == str(fork / "checkpoints")
    assert [row.step for row in read_metrics(fork / "metrics.jsonl")] == [19, 20]
    numbers = json.loads((fork / "summary.json").read_text())
    assert numbers["forked_from"] == {
        "run_dir": str(parent),
        "step": 18,
        "checkpoint": str(checkpoint),
    }
    assert numbers["steps"] == 2 and numbers["first_10_mean_score"] == pytest.approx(0.5)
    assert json.loads((fork / "launch.json").read_text())["parent"]["step"] == 18
    assert "Forked from" in (fork / "report.html").read_text()
    assert [r.step for r in read_metrics(parent / "metrics.jsonl")][-1] == 20  # untouched


def test_a_killed_ephemeral_api_stops_the_run_with_the_cause(launch, tmp_path):
    """An API without a store cannot be restarted: its queue died with it."""
    run_dir = tmp_path / "run"
    run, pace = long_run(launch, fifty_steps(run_dir), until_steps=1)
    os.kill(run.child_pid("atroposlib.cli.run_api"), signal.SIGKILL)
    pace.killed()
    assert run.wait(pace=pace, restarts=1) == 1  # it stops: no longer than a start
    out = run.output()
    assert "api exited with code -9; the API runs with ephemeral: true" in out
    assert f"last lines of {run_dir / 'logs' / 'api.log'}" in out.replace("\n", "")
    assert run.leftovers() == []


def test_a_crash_past_the_restart_budget_stops_the_run_with_the_cause(launch, tmp_path):
    run_dir = tmp_path / "run"
    config = fifty_steps(run_dir)
    config["environments"][0]["max_restarts"] = 0
    run, pace = long_run(launch, config, until_steps=1)
    os.kill(run.child_pid("arith_env.py"), signal.SIGKILL)
    pace.killed()
    assert run.wait(pace=pace, restarts=1) == 1
    expected = "arith_env crashed 1 time in a row (exit code -9); its restart budget (0) is spent"
    assert expected in re.sub(r"\s+", " ", run.output())
    assert run.leftovers() == []


def test_a_process_that_exits_2_is_not_restarted(launch, tmp_path):
    """Exit code 2 (a refusal found only once running, past the launch's config check)
    would repeat on every restart: the run stops at once."""
    run_dir = tmp_path / "run"
    config = launch_config(run_dir, steps=4)
    config["environments"] = [{"script": str(EXITS_TWO_ENV)}]
    on_the_minimal_trainer(config, steps=4)
    run = launch(config)
    assert run.wait(240) == 1
    out = run.output()
    assert "exits_two_env exited with code 2: a restart would fail the same way" in out
    assert "restarting exits_two_env" not in out
    assert run.leftovers() == []


def test_ctrl_c_stops_everything_then_resume_finishes_one_run(launch, tmp_path):
    """Ctrl-C: every process stops, the panel and summary.json say how to continue.
    `--resume RUN_DIR` then goes on from the trainer's newest checkpoint with the API's
    store and the environments' state, and reports one run of all its steps: every step
    once, no group lost or trained twice, the verdict over the whole run.

    The launcher's questions, on the minimal trainer (a checkpoint every step). That
    example_trainer checkpoints on a signal is test_interrupts.py's question (SIGINT and
    SIGTERM at each point of a step) and test_faults.py's (a SIGTERMed trainer process);
    that the launcher resumes it from its checkpoint, test_faults.py's."""
    # the fewest a verdict judges (2 x 10): the interrupt lands after step 3, and the
    # resumed launch trains the rest
    run_dir, steps = tmp_path / "run", 20
    config = launch_config(run_dir, steps=steps, api={"args": {}})  # a durable API store
    on_the_minimal_trainer(config, steps=steps)
    run, pace = long_run(launch, config, until_steps=3)
    run.proc.send_signal(signal.SIGINT)
    pace.killed()
    assert run.wait(pace=pace, restarts=1) == 130
    assert list((run_dir / "checkpoints").glob("step-*")), "no final checkpoint on Ctrl-C"
    assert (run_dir / "report.html").exists()
    assert run.leftovers() == []
    command = f"atropos-launch --resume {run_dir}"
    assert f"[launch] continue this run: {command}\n" in run.output()
    assert re.search(r"  api: stopped by the launcher +│", run.output())  # not "exit code -15"
    interrupted = json.loads((run_dir / "summary.json").read_text())
    assert interrupted["resume_command"] == command
    stopped_at = trained_steps(run_dir)
    assert 3 <= stopped_at < steps

    # the same run directory is refused without --resume, and the message says how
    again = launch(config)
    assert again.wait(pace=pace, restarts=1) == 2
    assert f"continue it with `{command}`" in again.output()

    resumed = launch(None, "--resume", str(run_dir))
    # the resumed launch's start, its steps and its report, at the first launch's pace
    left = steps - stopped_at
    assert resumed.wait(pace=pace, steps=left, restarts=2) == 0, resumed.output()[-4000:]
    out = resumed.output()
    assert f"resuming the run in {run_dir}" in out
    assert f"the trainer resumes from {run_dir / 'checkpoints'}" in out
    rows = read_metrics(run_dir / "checkpoints" / "metrics.jsonl")
    assert [row.step for row in rows] == list(range(1, steps + 1))
    assert (run_dir / "checkpoints" / f"step-{steps}" / "state.json").exists()  # the last step's
    numbers = json.loads((run_dir / "summary.json").read_text())
    assert numbers["steps"] == steps and "resume_command" not in numbers
    assert numbers["groups"]["lost"] == 0 and numbers["groups"]["duplicated"] == 0, numbers
    assert numbers["groups"]["trained"] >= steps * 2  # batches of 8 = 2 groups of 4
    # one verdict over the whole run: its first steps are the interrupted launch's
    first = sum(row.score_mean for row in rows[:10]) / 10
    assert numbers["first_10_mean_score"] == pytest.approx(first)
    assert numbers["resumed_at"] == [stopped_at]  # the report marks it, in words and lines
    assert f"at step {stopped_at}" in (run_dir / "report.html").read_text()
    # the environment took its registration back (disconnected at the stop): same name
    registered = re.findall(
        r"registered as (\S+) \(env_id (\d+)\)", (run_dir / "logs" / "arith_env.log").read_text()
    )
    assert registered and set(registered) == {registered[0]}, registered
    assert resumed.leftovers() == []

    # a finished run is not started again: one line says how to train on
    again = launch(None, "--resume", str(run_dir))
    assert again.wait(pace=pace, restarts=1) == 2
    assert f"finished all {steps} steps" in again.output()
    assert f"--set trainer.args.training_steps={2 * steps}" in again.output()
