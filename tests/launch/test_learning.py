"""The shipped CPU configs learn under `atropos-launch`: the quickstart and a black-box
agent through the proxy; the FSDP quickstart trains on two ranks.

Each is a launch of its own, the longest of the e2e tier; they are a module apart from
test_launch.py so that pytest-xdist's `--dist loadfile`, which runs a module's tests on
one worker, can run them beside test_launch.py's launches instead of after them.
"""

from __future__ import annotations

import json
import re

import pytest

from atroposlib.trainer_contract import read_events, read_metrics, read_trained_groups
from tests.support.launch import (
    Finished,
    check_the_console,
    finish,
    role_key,
    shipped,
    trend,
)
from tests.support.source import REPO
from tests.support.token_script_server import TokenScriptServer

# Every wait on a run is allowed what it costs at the run's own pace (tests/support/
# pace.py), so these bound each test; this only catches a hang outside them.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]


def run_dir_flag(tmp_path) -> tuple[str, str]:
    return ("--run-dir", str(tmp_path / "run"))


@pytest.fixture(scope="module")
def quickstart(module_launch) -> Finished:
    """configs/quickstart_cpu.yaml as shipped (seed 0), run to its end: one launch that
    the learning test and the rollout store's test both read."""
    run_dir = module_launch.base / "quickstart"
    run = module_launch(
        None, str(REPO / "configs" / "quickstart_cpu.yaml"), "--run-dir", str(run_dir)
    )
    return finish(run, run_dir, steps=100)


@pytest.mark.learning
def test_the_cpu_quickstart_learns(quickstart):
    """configs/quickstart_cpu.yaml as shipped (seed 0): the late mean score beats the early one."""
    config = shipped("quickstart_cpu.yaml")
    finished, run, run_dir = quickstart, quickstart.run, quickstart.run_dir
    assert finished.code == 0, run.output()[-4000:]
    numbers = finished.numbers()
    assert numbers["steps"] == config["trainer"]["args"]["training_steps"]
    # The margin rules out chance, not a speed: each 10-step mean averages 10 x 64
    # rewards of 0 or 1, so without learning it has a standard deviation of at most
    # 0.5 / sqrt(640) = 0.020, and the difference of two such means at most 0.028.
    # 0.15 is 5.3 of those; a run that learns nothing passes with a chance under 1e-7,
    # and the rises measured on the machines tried (+0.40 to +0.47) are 3x the margin.
    rewards_per_mean = 10 * config["trainer"]["args"]["batch_size"]
    chance_sd = 0.5 * (2 / rewards_per_mean) ** 0.5
    assert rewards_per_mean == 640 and 0.15 > 5 * chance_sd
    assert numbers["last_10_mean_score"] > numbers["first_10_mean_score"] + 0.15, numbers
    assert numbers["learned"] is True and numbers["verdict"].startswith("the score rose by")
    # the env's evaluations (a baseline at step 0, then every 20 steps, and the final
    # checkpoint's at step 100, after the trainer finished) are kept and summed up per
    # environment
    history = run_dir / "evals" / "mod_arithmetic" / "history.jsonl"
    steps = [json.loads(line)["step"] for line in history.read_text().splitlines()]
    assert steps[0] == 0 and steps[-1] == 100 and len(steps) >= 6, steps
    assert "mod_arithmetic: evaluated at step 100" in run.output()
    # `view-run RUN_DIR`'s page reads the finished run, no API running (in-process here;
    # tests/viewer/test_view_recorded_browser.py serves one to a browser)
    from atroposlib.viewer.browse import RecordedPage
    from atroposlib.viewer.recorded import read_run

    recorded = read_run(run_dir)
    assert recorded.group_count >= numbers["groups"]["trained"] > 0
    _, status, group = RecordedPage(recorded, None, False).view("mod_arithmetic", 1, "last")
    assert f"Group {recorded.group_count} of {recorded.group_count}" in status
    assert "mod 10" in group
    own = numbers["environments"]["mod_arithmetic"]
    assert own["steps"] == 100 and own["evaluations"] >= 4 and own["learned"] is True
    # the console a new user reads: mostly step and status lines, each env's on one row
    share = check_the_console(run.output(), "mod_arithmetic", steps=100)
    assert share >= 0.8, (share, run.output()[-4000:])
    assert finished.leftovers == []


def test_a_quickstart_runs_groups_are_listed_exported_and_replayed_into_a_fresh_run(
    quickstart, launch, tmp_path, capsys
):
    """The rollout store on the quickstart's own run directory (docs/rollouts.md): `list
    --json` counts what the trainer trained, `export --format sft` is sft-gen's data,
    and configs/replay_cpu.yaml as shipped trains a fresh policy on the groups of its
    first two steps, sampling nothing, evaluated at its start and its end."""
    from atroposlib.cli.rollouts import main

    source = quickstart.run_dir
    assert quickstart.code == 0, quickstart.output()[-4000:]
    assert main(["list", str(source), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    trained = read_trained_groups(source / "checkpoints" / "trained_groups.jsonl")
    assert listed["trained_steps"] == 100 == len(trained)
    assert listed["trained_groups"] == sum(len(r.group_ids) for r in trained)
    assert [row["step"] for row in listed["rows"][:3]] == [1, 2, 3]
    # the export holds atropos-sft-gen --from-run's records (tests/datagen/
    # test_sft_gen.py feeds such a file to TRL's SFTTrainer), in the order steps trained
    from atroposlib.cli.sft import main as sft_gen

    exported, generated = tmp_path / "exported.jsonl", tmp_path / "generated.jsonl"
    assert main(["export", str(source), "--format", "sft", "--out", str(exported)]) == 0
    assert sft_gen([str(generated), "--from-run", str(source)]) == 0
    records = exported.read_text().splitlines()
    assert records and sorted(records) == sorted(generated.read_text().splitlines())
    assert all(json.loads(r)["completion"][-1]["role"] == "assistant" for r in records)

    replayed = tmp_path / "replay"
    run = launch(
        None,
        str(REPO / "configs" / "replay_cpu.yaml"),
        *("--run-dir", str(replayed), "--set", f"replay.run={source}"),
        *("--set", 'replay.steps="1:2"', "--set", "trainer.args.training_steps=2"),
    )
    finished = finish(run, replayed, steps=2)
    assert finished.code == 0, run.output()[-4000:]
    steps = read_trained_groups(replayed / "checkpoints" / "trained_groups.jsonl")
    ids = [gid for record in steps for gid in record.group_ids]
    assert len(steps) == 2 and len(ids) == 16 and all(i.startswith("replay-") for i in ids)
    assert not list((replayed / "rollouts").glob("*.jsonl"))  # nothing sampled for training
    numbers = finished.numbers()  # its verdict is the evaluation's: it sampled nothing
    assert numbers["verdict"].startswith("trained on replayed groups") and not numbers["learned"]
    own = numbers["environments"]["mod_arithmetic"]
    assert own["evaluate_only"] is True
    assert (own["first_evaluation"]["step"], own["last_evaluation"]["step"]) == (0, 2)
    assert finished.leftovers == []


AGENT_STEPS, AGENT_GROUP = 40, 4


@pytest.mark.learning
def test_a_black_box_agent_learns_through_the_proxy(launch, tmp_path):
    """configs/agent_proxy_cpu.yaml, its batch of 64 as 16 groups of 4 for 40 steps: an
    agent that knows only the openai SDK answers through the environment's proxy
    sessions, and the score rises.

    The run's cost is its rollouts (each is its own proxy session, several HTTP calls in
    the env's process, and its own engine request, about 7 times a quickstart rollout's
    CPU), so it is judged on every step's score, not on its first and last 10 steps'
    means as the quickstart is: the line through the 40 step scores must rise by the
    quickstart's margin, 0.15, and its slope must be 4 standard errors above zero (a
    flat run gets there by chance about once in 10,000). Measured on this project's
    2-core machine (16 prompts a step learn more per rollout than the shipped 8): t =
    7.4 and 6.3 at 40 steps in two runs (the second rose 0.31), 7.9 at 45, 10.9 at 50 and 13.7
    at 60; the shipped groups of 8 rose +0.22 by step 60.

    On the way, PRX-1 of the security review: a local process holding no key posts
    /setup to the environment's proxy (text/plain, as the review's attack, and JSON) to
    point it at its own server. It gets 401s, its server hears nothing, and the run
    learns as if nobody had tried."""
    run = launch(
        None,
        str(REPO / "configs" / "agent_proxy_cpu.yaml"),
        *run_dir_flag(tmp_path),
        *("--set", f"environments.0.env.group_size={AGENT_GROUP}"),
        *("--set", f"trainer.args.training_steps={AGENT_STEPS}"),
    )
    with TokenScriptServer([]) as attackers_server:
        attack_the_envs_proxy(run, tmp_path / "run", attackers_server.url)
        finished = finish(run, tmp_path / "run", steps=AGENT_STEPS)
    assert attackers_server.requests == [], "the run's completions went to the attacker"
    assert finished.code == 0, finished.output()[-4000:]
    numbers = finished.numbers()
    assert numbers["steps"] == AGENT_STEPS
    assert numbers["groups"]["lost"] == 0
    assert numbers["groups"]["trained"] >= AGENT_STEPS * 64 // AGENT_GROUP
    scores = [row.score_mean for row in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert len(scores) == AGENT_STEPS
    rise, t = trend(scores)
    assert rise > 0.15 and t > 4, (rise, t, scores)
    assert numbers["learned"] is True
    assert "Traceback" not in finished.output(), "the env's proxy must stop cleanly"
    assert "Uvicorn running" not in finished.output()  # the env says where its proxy is
    assert finished.leftovers == []


def attack_the_envs_proxy(run, run_dir, attackers_url: str) -> None:
    """The review's keyless attack on a launched run's in-process proxy (see above)."""
    import httpx

    log, found = run_dir / "logs" / "agent_mod_arithmetic.log", {}

    def proxy_served() -> bool:
        text = log.read_text(errors="replace") if log.exists() else ""
        match = re.search(r"serving the agent proxy at (http://127\.0\.0\.1:\d+)", text)
        found.update(url=match.group(1)) if match else None
        return match is not None

    run.wait(until=proxy_served, pace=run.pace(run_dir), steps=2, restarts=1)
    with httpx.Client(base_url=found["url"]) as attacker:
        setup = json.dumps({"model_name": "tiny", "servers": [{"base_url": f"{attackers_url}/v1"}]})
        answers = [
            attacker.post("/setup", content=setup, headers={"Content-Type": "text/plain"}),
            attacker.post("/setup", content=setup, headers={"Content-Type": "application/json"}),
            attacker.get("/sessions", headers={"Host": "attacker.example"}),
            attacker.get("/sessions"),
        ]
        assert [a.status_code for a in answers] == [401] * 4, [a.text for a in answers]


FSDP_STEPS = 8


def test_the_fsdp_quickstart_trains_on_two_ranks_with_two_engines(launch, tmp_path):
    """configs/quickstart_fsdp_cpu.yaml for 8 of its 60 steps: a 2-rank FSDP trainer (gloo
    ranks, each holding half the model) and two CPU engines. The environment samples from
    both engines and both take the weights of every step.

    That it learns is not asked again here (60 steps cost 110-130 s of CPU): two FSDP
    ranks give one process's gradients and updates (tests/example_trainer/
    test_data_parallel.py), one process learns (test_the_cpu_quickstart_learns), and the
    shipped length's run is in docs/trainer.md with its command."""
    import httpx

    run_dir = tmp_path / "run"
    run = launch(
        None,
        str(REPO / "configs" / "quickstart_fsdp_cpu.yaml"),
        *run_dir_flag(tmp_path),
        *("--set", f"trainer.args.training_steps={FSDP_STEPS}"),
    )
    pace = run.pace(run_dir)
    served: dict[int, int] = {}

    def both_engines_served() -> bool:
        commands = run_dir / "commands.json"
        if not commands.exists() or not (run_dir / "api-key").exists():
            return False
        trainer = json.loads(commands.read_text())["trainer"]
        first = int(trainer[trainer.index("--vllm-port") + 1])
        # the engines take the run's sampling key, derived from the run's key
        key = role_key((run_dir / "api-key").read_text().strip(), "engine")
        for index in (0, 1):
            try:
                text = httpx.get(
                    f"http://127.0.0.1:{first + index}/metrics",
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=5,
                ).text
            except httpx.HTTPError:
                continue
            found = re.search(r"^atropos_inference_requests_total (\d+)", text, re.M)
            served[index] = int(found.group(1)) if found else 0
        return len(served) == 2 and min(served.values()) > 0

    # both serve the first batches, within the first steps
    started = run.wait(until=both_engines_served, pace=pace, steps=3, restarts=1)
    assert started is None, f"engines served {served}"
    steps = FSDP_STEPS
    assert run.wait(pace=pace, steps=steps, restarts=2) == 0, run.output()[-4000:]
    trainer = json.loads((run_dir / "commands.json").read_text())["trainer"]
    assert trainer[trainer.index("--nproc") + 1] == "2"
    assert trainer[trainer.index("--parallelism") + 1] == "fsdp"
    started = [
        e.detail["engine"]
        for e in read_events(run_dir / "checkpoints" / "events.jsonl")
        if e.kind.value == "engine_started"
    ]
    assert sorted(started) == [0, 1]
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r.step for r in rows] == list(range(1, steps + 1))
    assert all(r.model_dump()["sync_s"] > 0 for r in rows[:-1]), "a step pushed no weights"
    assert (run_dir / "checkpoints" / f"step-{steps}" / "optimizer").is_dir()  # sharded
    numbers = json.loads((run_dir / "summary.json").read_text())
    assert numbers["steps"] == steps and numbers["groups"]["lost"] == 0, numbers
    assert run.leftovers() == []
