"""Environments as microservices: real run-api, CPU inference server and env processes."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from atroposlib.utils.retry_notes import NOTE_AFTER_S
from tests.support.groups import drain_batches, register_env, start_trainer
from tests.support.pace import CountPace
from tests.support.processes import EnvProcess, serve_args
from tests.support.waiting import wait_until

pytest.importorskip("torch")


def api_counter(client: httpx.Client, name: str) -> int:
    """A counter from the API's /metrics, named with its labels (0 before it is first counted)."""
    for line in client.get("/metrics").text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == name:
            return int(float(value))
    return 0


def status_env_polls(client: httpx.Client) -> int:
    """/status-env requests answered: one per turn of an env's loop."""
    return api_counter(client, 'atropos_request_duration_seconds_count{path="/status-env"}')


def groups_received(client: httpx.Client) -> int:
    """Groups the API accepted since it started (batches the trainer took included)."""
    return api_counter(client, "atropos_groups_received_total")


def queued_groups(client: httpx.Client) -> int:
    return client.get("/status").json()["queue_size"]


def serving(client: httpx.Client, api, inference_server, tmp_path: Path, *extra: str) -> EnvProcess:
    """Register a trainer (batches of 4) and start the arith env serving for it."""
    start_trainer(client, batch_size=4, max_token_len=128)
    return EnvProcess(tmp_path, "serve", *serve_args(api.url, inference_server.url, *extra))


def pull(client: httpx.Client, batches: int, timeout: float = 120) -> list[dict]:
    groups: list[dict] = []
    deadline = time.monotonic() + timeout
    taken = 0
    while taken < batches and time.monotonic() < deadline:
        batch = client.get("/batch").json()["batch"]
        if batch:
            groups.extend(batch)
            taken += 1
        else:
            time.sleep(0.2)
    assert taken == batches, "batches did not arrive in time"
    return groups


def check_group(group: dict, group_size: int) -> None:
    assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == group_size
    assert group["env_id"] == 0
    for tokens, masks, logprobs in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], strict=True
    ):
        assert len(tokens) == len(masks) == len(logprobs)
        prompt = [i for i, m in enumerate(masks) if m == -100]
        completion = [i for i, m in enumerate(masks) if m != -100]
        assert prompt == list(range(len(prompt))) and completion, "prompt first, then completion"
        assert all(logprobs[i] == 1.0 for i in prompt)
        assert all(masks[i] == tokens[i] and logprobs[i] <= 0 for i in completion)


def test_serve_delivers_well_formed_groups(api_factory, inference_server, tmp_path):
    """Also test_evaluations_run_every_steps_per_eval's NONE case (evaluations beside
    training, which they leave as it is): an env process costs about 5 s of CPU."""
    api = api_factory()
    evals = tmp_path / "evals"
    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(client, batch_size=8, max_token_len=128)
        env = EnvProcess(
            tmp_path,
            "serve",
            *serve_args(api.url, inference_server.url, *evaluating(evals, "NONE")),
        )
        try:
            groups = pull(client, 3)
            # the only connected env has all of the weight
            assert client.get("/status-env", params={"env_id": 0}).json()["env_weight"] == 1.0
            wait_until((evals / "metrics.json").exists, 60, "no evaluation was written")
        finally:
            code = env.stop()
        # once it told the API it left, no connected env carries its weight any more ...
        after = client.get("/status-env", params={"env_id": 0}).json()["env_weight"]
        # ... and an env registered next shares the weight with no one (with a connected
        # twin of equal context it would get half)
        newcomer = register_env(client, max_token_length=128, group_size=4)["env_id"]
        newcomers = client.get("/status-env", params={"env_id": newcomer}).json()["env_weight"]
    assert len(groups) == 6
    for group in groups:
        check_group(group, 4)
    assert code == 0, env.log()
    assert "Traceback" not in env.log()
    assert after < 1.0 and newcomers == 1.0, "the env did not disconnect on shutdown"
    assert_evaluation_written(evals)


def test_user_exceptions_are_logged_counted_and_survived(api_factory, inference_server, tmp_path):
    api = api_factory()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        env = serving(client, api, inference_server, tmp_path, "--env.fail_first_items", "2")
        try:
            groups = pull(client, 2)
        finally:
            env.stop()
    assert len(groups) == 2
    log = env.log()
    # the same error raised at the same place: its traceback once, the repeat only counted
    failed = [n for n in (1, 2) if f"deliberate failure on item {n}" in log]
    assert "rollout of item" in log and len(failed) == 1 and log.count("Traceback") == 1, log


def test_an_env_whose_every_rollout_is_refused_stops_with_the_refusals_line(
    api_factory, inference_server, tmp_path
):
    """max_tokens over the engine's 512-token context: the env does not wait for ever at
    step 0, it exits 2 (which the launcher does not restart) saying what to change."""
    api = api_factory()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        flags = ("--env.max_tokens", "600", "--env.stop_when_refused_s", "2")
        env = serving(client, api, inference_server, tmp_path, *flags)
        try:
            code = env.proc.wait(timeout=120)
        finally:
            env.stop()
    last = env.log().strip().splitlines()[-1]
    assert code == 2, env.log()
    assert "plus max_tokens 600 does not fit the model's context of 512 tokens" in last
    assert "lower --env.max_tokens to " in last and last.endswith("so this env stops")


def test_off_policy_bound_stops_generation(api_factory, inference_server, tmp_path):
    api = api_factory()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        env = serving(
            client,
            api,
            inference_server,
            tmp_path,
            "--env.group_size",
            "2",
            "--env.max_batches_offpolicy",
            "1",
        )
        # The bound: 1 batch of 4 sequences = 2 groups of 2 queued, spooled or in flight.
        try:
            wait_until(lambda: queued_groups(client) >= 2, 120, "the env generated no groups")
            full = queued_groups(client), groups_received(client)
            # every /status-env poll is one turn of the env's loop; over a few turns that
            # all saw a full queue, a worker left in flight is cancelled and nothing new
            # starts, however slow the machine is
            polls = status_env_polls(client)
            wait_until(lambda: status_env_polls(client) >= polls + 4, 60, "the env stopped polling")
            held = queued_groups(client), groups_received(client)
            # the bound, not a stall, is what holds it: a batch taken, the env makes 2 more
            assert len(pull(client, 1)) == 2
            wait_until(lambda: queued_groups(client) >= 2, 120, "the env did not refill")
            polls = status_env_polls(client)
            wait_until(lambda: status_env_polls(client) >= polls + 4, 60, "the env stopped polling")
            refilled = queued_groups(client), groups_received(client)
        finally:
            env.stop()
    assert full == held == (2, 2), (full, held)
    assert refilled == (2, 4), refilled


# `process` writing JSONL and HTML: test_serve_settings.py, beside an earlier output


@pytest.mark.e2e
@pytest.mark.timeout(3600)  # a last resort: the waits are paced by the groups' arrival
def test_api_outage_loses_and_duplicates_nothing(api_factory, inference_server, tmp_path):
    api = api_factory()
    saved = tmp_path / "produced.jsonl"
    received: list[dict] = []
    stop_pulling = threading.Event()

    def trainer() -> None:
        with httpx.Client(base_url=api.url, timeout=5) as client:
            while not stop_pulling.is_set():
                try:
                    batch = client.get("/batch").json()["batch"]
                except httpx.HTTPError:
                    batch = None
                if batch:
                    received.extend(batch)
                else:
                    time.sleep(0.2)

    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(client, batch_size=4, max_token_len=128)
    env = EnvProcess(
        tmp_path,
        "serve",
        *serve_args(api.url, inference_server.url, "--env.data_path_to_save_groups", str(saved)),
    )
    puller = threading.Thread(target=trainer)
    puller.start()
    # the waits are allowed what they cost at the pace the groups arrive (tests/support/pace.py)
    pace = CountPace(lambda: len(received))
    try:
        pace.wait(lambda: len(received) >= 2, "no groups reached the trainer", steps=2)
        notes = env.log().count("still fails after")
        api.stop()
        pace.killed()
        # the outage lasts until the env has retried for 10 s (its retry log's second note)
        pace.wait(
            lambda: env.log().count("still fails after") > notes,
            "the env did not keep retrying while the API was down",
            steps=2,
            plus_s=2 * NOTE_AFTER_S[1],
        )
        api.start()
        before = len(received)
        # the env's next try comes at most its longest back-off (10 s) after the restart
        what = "delivery did not resume after the outage"
        pace.wait(lambda: len(received) >= before + 3, what, steps=3, restarts=1, plus_s=10.0)
    finally:
        env.stop()  # delivers what it has spooled before it exits
        stop_pulling.set()
        puller.join()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        received.extend(group for batch in drain_batches(client) for group in batch)
    produced = [json.loads(line) for line in saved.read_text().splitlines()]
    key = lambda g: json.dumps(g["tokens"])  # noqa: E731
    assert Counter(map(key, received)) == Counter(map(key, produced))
    assert len(produced) >= 5


def evaluating(evals: Path, handling: str) -> list[str]:
    """Flags for an evaluation every 2 steps, handled as `handling`, written to `evals`."""
    return [
        *("--env.steps_per_eval", "2", "--env.eval_handling", handling),
        *("--env.data_dir_to_save_evals", str(evals)),
    ]


def assert_evaluation_written(evals: Path) -> None:
    metrics = json.loads((evals / "metrics.json").read_text())
    assert "eval/accuracy" in metrics["results"]["all"]
    assert set(metrics["config_general"]) >= {"model_name", "generation_parameters"}


# NONE: test_serve_delivers_well_formed_groups, whose env evaluates that way; STOP_TRAIN:
# test_stops_at_total_steps_and_a_stateless_env_writes_no_checkpoint
@pytest.mark.parametrize("handling", ["LIMIT_TRAIN"])
def test_evaluations_run_every_steps_per_eval(api_factory, inference_server, tmp_path, handling):
    """With eval_at_start (the launcher's setting), a baseline at step 0 comes first."""
    api = api_factory()
    evals = tmp_path / "evals"
    flags = (*evaluating(evals, handling), "--env.eval_at_start", "true")
    with httpx.Client(base_url=api.url, timeout=30) as client:
        env = serving(client, api, inference_server, tmp_path, *flags)
        try:
            pull(client, 3)
            wait_until((evals / "history.jsonl").exists, 60, "no evaluation was written")
            wait_until(lambda: len(eval_steps(evals)) >= 2, 60, "one evaluation only")
        finally:
            env.stop()
    assert_evaluation_written(evals)
    first, second = eval_steps(evals)[:2]  # the second at the step its poll saw: 2 or later
    assert first == 0 and second >= 2, eval_steps(evals)


def eval_steps(evals: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (evals / "history.jsonl").read_text().splitlines()]


def test_evaluate_subcommand(inference_server, tmp_path):
    """With --env.eval_step (the launcher's evaluation of a run's final checkpoint) the
    result also joins history.jsonl at that step."""
    evals = tmp_path / "evals"
    env = EnvProcess(
        tmp_path,
        "evaluate",
        "--openai.base_url",
        f"{inference_server.url}/v1",
        "--env.data_dir_to_save_evals",
        str(evals),
        "--env.eval_step",
        "7",
    )
    assert env.proc.wait(120) == 0, env.log()
    assert eval_steps(evals) == [7]
    accuracy = json.loads((evals / "metrics.json").read_text())["results"]["all"]["eval/accuracy"]
    samples = [json.loads(line) for line in (evals / "samples.jsonl").read_text().splitlines()]
    assert samples
    for sample in samples:  # each sample graded right: "What is a + b mod 10?"
        a, b = map(int, re.findall(r"\d+", sample["question"])[:2])
        assert sample["answer"] == str((a + b) % 10)
        assert sample["score"] == float(sample["completion"].strip() == sample["answer"])
    assert 0.0 <= accuracy <= 1.0
    assert accuracy == sum(sample["score"] for sample in samples) / len(samples)


def test_stops_at_total_steps_and_a_stateless_env_writes_no_checkpoint(
    api_factory, inference_server, tmp_path
):
    """The arith env keeps no state (no save_checkpoint override): no empty files appear.

    Envs that do save state are covered in test_env_state.py. The env also evaluates
    every 2 steps with STOP_TRAIN (test_evaluations_run_every_steps_per_eval's third
    case): training waits for each evaluation, and still reaches total_steps.
    """
    api = api_factory()
    checkpoints = tmp_path / "ckpt"
    evals = tmp_path / "evals"
    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(
            client,
            batch_size=4,
            max_token_len=128,
            checkpoint_dir=str(checkpoints),
            save_checkpoint_interval=1,
        )
        env = EnvProcess(
            tmp_path,
            "serve",
            *serve_args(
                api.url,
                inference_server.url,
                "--env.total_steps",
                "6",
                "--env.max_batches_offpolicy",
                "1",
                *evaluating(evals, "STOP_TRAIN"),
            ),
        )
        try:
            pull(client, 5)
            assert env.proc.wait(60) == 0, env.log()
        finally:
            env.stop()
    assert not (checkpoints / "env_checkpoints").exists()
    assert "reached total_steps 6" in env.log()
    assert_evaluation_written(evals)


def test_stuck_workers_time_out(api_factory, inference_server, tmp_path):
    api = api_factory()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        env = serving(client, api, inference_server, tmp_path, "--env.worker_timeout", "0.001")
        try:
            wait_until(lambda: "timed out" in env.log(), 60, "no worker timed out")
        finally:
            assert env.stop() == 0
        assert client.get("/status").json()["queue_size"] == 0
    assert "timed out after 0.001s" in env.log()


def test_interrupted_items_go_to_the_backlog_and_come_back(api_factory, inference_server, tmp_path):
    api = api_factory()
    with httpx.Client(base_url=api.url, timeout=30) as client:
        start_trainer(client, batch_size=4, max_token_len=128)
        slow = serve_args(api.url, inference_server.url, "--env.rollout_delay_s", "30")
        first = EnvProcess(tmp_path, "serve", *slow)
        # the env starts its workers right after its first /status-env answer, so once a
        # second poll arrives they are sleeping inside their 30 s rollouts
        wait_until(lambda: status_env_polls(client) >= 2, 120, "the env never polled twice")
        assert first.stop() == 0, first.log()
        backlog = tmp_path / "env-state" / "arith" / "backlog.json"
        saved = json.loads(backlog.read_text())
        assert saved and all({"a", "b", "n"} <= set(item) for item in saved)
        assert f"{len(saved)} unfinished items saved to {backlog}" in first.log()
        assert queued_groups(client) == 0, "a rollout finished, so it was not interrupted"
        second = EnvProcess(tmp_path, "serve", *serve_args(api.url, inference_server.url))
        try:
            wait_until(lambda: "restored" in second.log(), 120, "the second run restored nothing")
            took_the_file = not backlog.exists()
            groups = pull(client, 1)
        finally:
            code = second.stop()
    assert code == 0, second.log()
    assert f"restored {len(saved)} backlog items" in second.log()
    assert took_the_file, "the restored backlog file was left behind for a third run"
    # one batch of 4: one group of 4, from the second run, which took the registration
    # the first gave up at its stop (/disconnect-env) back: env 0 again
    assert [(group["env_id"], len(group["tokens"])) for group in groups] == [(0, 4)]
