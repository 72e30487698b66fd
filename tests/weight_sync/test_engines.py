"""`--num-engines 2`: every version reaches both CPU engines at once, and an engine that
refuses a push, or dies, is restarted alone on the newest export while the other keeps
its process and its weights.

The trainer runs in this process against a real `run-api` and two real CPU engines on
the tiny model; each engine's `/weight_info` says which step it serves. A refused push
is a real refusal: one push goes out with a wrong key, and the engine answers 401.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import httpx
import pytest

torch = pytest.importorskip("torch")

from atroposlib.inference.sampler import device_problem  # noqa: E402
from atroposlib.trainer_contract import read_events, read_metrics  # noqa: E402
from atroposlib.utils.ports import free_ports  # noqa: E402
from atroposlib.weight_sync import disk_reload as weight_bridge  # noqa: E402
from atroposlib.weight_sync.bridge import HotBridge  # noqa: E402
from tests.support.trainer_batches import hot_trainer, post_groups  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402


def records(save: Path) -> list:
    return read_events(save / "events.jsonl")


def weight_version(url: str) -> str | None:
    return httpx.get(f"{url}/weight_info", timeout=30).json()["weight_version"]


def test_two_engines_take_each_push_at_once_and_a_refusal_or_a_kill_restarts_one(
    api, wire_client, tiny_model_path, tmp_path, monkeypatch
):
    """Engine 1 refuses step 1's push for real (it goes out with a wrong key: 401) and is
    restarted alone on that step's export; step 2's push lands on both; then engine 1 is
    killed -9 while the trainer waits for step 3, and restarts on the newest export. Engine
    0 keeps its one process throughout, and both serve step 3's push at the end."""
    save, first_port = tmp_path / "ckpt", free_ports(2)
    trainer = hot_trainer(
        tiny_model_path, save, api.url, training_steps=4, num_engines=2, vllm_port=first_port
    )
    # each push waits for the other engine's: pushed one after the other, the first
    # would wait alone and the barrier would break
    together = threading.Barrier(2, timeout=60)
    push = HotBridge.push
    pushed: list[tuple[int, int]] = []

    def meeting_push(bridge, exported, step, url):
        together.wait()
        pushed.append((step, int(url.rsplit(":", 1)[1]) - first_port))
        return push(bridge, exported, step, url)

    send = weight_bridge.push_to_cpu_engine

    def wrong_key_once(url, path, version, key, timeout_s):
        if (version, url) == ("1", f"http://127.0.0.1:{first_port + 1}"):
            key = "not-the-engines-key"
        return send(url, path, version, key, timeout_s)

    monkeypatch.setattr(HotBridge, "push", meeting_push)
    monkeypatch.setattr(weight_bridge, "push_to_cpu_engine", wrong_key_once)
    served: list[tuple[int, str]] = []
    pids: dict[int, set[int]] = {0: set(), 1: set()}
    stop = trainer.serving.stop

    def reading_stop() -> None:
        for engine in trainer.engines:
            served.append((engine.index, weight_version(engine.url)))
            pids[engine.index].add(engine.process.proc.pid)  # a push's restart is settled late
        stop()

    trainer.serving.stop = reading_stop  # type: ignore[method-assign]
    original_push_weights = trainer.serving.push

    def noting_pids(step: int) -> float:
        for engine in trainer.engines:
            pids[engine.index].add(engine.process.proc.pid)
        return original_push_weights(step)

    trainer.serving.push = noting_pids  # type: ignore[method-assign]
    failures: list[BaseException] = []

    def run() -> None:
        try:
            trainer.run()
        except BaseException as exc:
            failures.append(exc)

    runner = threading.Thread(target=run, name="trainer")  # it owns the engines it spawns
    post_groups(wire_client, 2)
    runner.start()
    try:
        metrics = save / "metrics.jsonl"

        def step_two_pushed() -> bool:
            fleet = trainer.serving.fleet
            in_flight = fleet.in_flight if fleet is not None else None
            two = metrics.exists() and len(read_metrics(metrics)) == 2
            return two and (in_flight is None or in_flight.refusals.done())

        wait_until(lambda: step_two_pushed() or failures, 120, "step 2 was not pushed", 0.1)
        assert not failures, failures
        assert [weight_version(e.url) for e in trainer.engines] == ["2", "2"]
        # kill -9 engine 1's whole process group while the trainer waits for step 3
        pids[1].add(trainer.engines[1].process.proc.pid)
        os.killpg(trainer.engines[1].process.proc.pid, signal.SIGKILL)
        wait_until(
            lambda: any(e.kind.value == "engine_crashed" for e in records(save)) or failures,
            60,
            "the trainer did not notice the dead engine",
            poll_s=0.1,
        )
        wait_until(
            lambda: any(e.detail.get("reason") == "engine died" for e in records(save)) or failures,
            120,
            "the dead engine was not restarted",
            poll_s=0.1,
        )
        assert not failures, failures
        post_groups(wire_client, 2)
        runner.join(180)
        assert not runner.is_alive(), "the trainer did not finish"
    finally:
        if runner.is_alive():
            trainer.config.optim.training_steps = trainer.step  # let the loop end
            runner.join(60)
    assert not failures, failures

    assert sorted(pushed) == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
    assert sorted(served) == [(0, "3"), (1, "3")], "an engine does not serve the last push"
    assert len(pids[0]) == 1, "engine 0 was restarted, though it took every push"
    assert len(pids[1]) == 3, "engine 1 was not restarted after its refusal and its death"
    kinds = [
        (e.kind.value, e.step, e.detail.get("engine"), e.detail.get("reason"))
        for e in records(save)
    ]
    assert sorted(kinds[:2], key=str) == [
        ("engine_started", 0, 0, None),
        ("engine_started", 0, 1, None),
    ]
    assert kinds[2:] == [
        ("weight_sync_failed", 1, 1, None),
        ("engine_restarted", 1, 1, "weight push failed"),
        ("engine_crashed", 2, 1, None),
        ("engine_restarted", 2, 1, "engine died"),
        ("checkpoint_saved", 4, None, None),
    ]
    (failed,) = [e for e in records(save) if e.kind.value == "weight_sync_failed"]
    assert "401" in failed.detail["error"]
    restarted = [e for e in records(save) if e.kind.value == "engine_restarted"]
    # each restart starts on the newest export, not the last checkpoint (the base model)
    assert [Path(e.detail["model"]) for e in restarted] == [
        save / "live" / "step-1",
        save / "live" / "step-2",
    ]
    assert (save / "engine.log").is_file() and (save / "engine-1.log").is_file()
    assert [row.step for row in read_metrics(save / "metrics.jsonl")] == [1, 2, 3, 4]


def test_engine_devices_are_checked_before_the_model_loads():
    assert device_problem("cpu") is None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    beyond = device_problem(f"cuda:{count}")
    assert beyond is not None and f"cuda:{count}" in beyond
    if count == 0:
        assert "no CUDA device" in (device_problem("cuda") or "")


def test_the_cpu_engine_refuses_a_device_it_does_not_have(tiny_model_path, capsys):
    from atroposlib.cli.inference_server import main

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert main(["--model", str(tiny_model_path), "--device", f"cuda:{count}"]) == 2
    assert f"--device cuda:{count}" in capsys.readouterr().err


class ExitingProcess:
    """An engine process as the trainer sees it: `alive()` for the first `polls` looks."""

    def __init__(self, polls: int | None, answers_health: bool) -> None:
        self.polls, self.answers_health = polls, answers_health

    def alive(self) -> bool:
        if self.polls is None:
            return True
        self.polls -= 1
        return self.polls >= 0

    def healthy(self) -> bool:
        return self.answers_health


@pytest.mark.parametrize(
    ("polls", "answers", "died"),
    [
        (0, False, True),  # already reaped
        (3, False, True),  # killed mid-push: sockets closed, not yet reaped (seen in CI)
        (None, True, False),  # alive and answering: it refused the push
        (None, False, False),  # alive and silent past the grace: a failed push
    ],
)
def test_a_push_that_met_a_dying_engine_counts_as_its_death(
    polls, answers, died, tmp_path, monkeypatch
):
    """An engine SIGKILLed during a push reset the push's connection while its process
    still looked alive, so the trainer called it a refused push: the launcher then
    counted no engine crash (test_faults, seen in CI)."""
    from atroposlib.inference import supervised as engine_module
    from atroposlib.inference.launcher import EngineConfig
    from atroposlib.trainer_contract import RunRecords

    monkeypatch.setattr(engine_module, "EXIT_GRACE_S", 0.2)
    config = EngineConfig(engine="transformers", log_path=str(tmp_path / "engine.log"))
    engine = engine_module.SupervisedEngine(config, RunRecords(tmp_path))
    engine.process = ExitingProcess(polls, answers)  # type: ignore[assignment]
    assert engine.died() is died
