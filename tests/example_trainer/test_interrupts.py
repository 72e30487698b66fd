"""SIGINT and SIGTERM stop the trainer between steps, with a checkpoint that is what it says.

RUN-2 of the correctness review: a SIGINT after `optimizer.step()` and before the step
was counted wrote a checkpoint labelled N that held step N+1's weights and optimizer
state, so a resume trained batch N+1 twice. Here a real signal lands at each point of
step 2 of a real 3-step run, and the checkpoint it leaves must hold exactly as many
optimizer and scheduler steps as its label says.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from atroposlib.trainer_contract import groups_path, read_trained_groups  # noqa: E402
from example_trainer.checkpoint import STATE_FILE  # noqa: E402
from example_trainer.interrupts import StepInterrupts  # noqa: E402
from tests.support.trainer_batches import make_trainer, post_groups  # noqa: E402


def test_a_signal_outside_a_step_interrupts_at_once():
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN under a shell's background job
    guard = StepInterrupts()
    guard.install()
    try:
        for number in (signal.SIGINT, signal.SIGTERM):
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(number)
    finally:
        guard.uninstall()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_signal_inside_a_step_waits_for_the_step_to_end():
    guard = StepInterrupts()
    guard.install()
    finished = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with guard.step():
                signal.raise_signal(signal.SIGTERM)
                finished.append("the rest of the step")
    finally:
        guard.uninstall()
    assert finished == ["the rest of the step"]


def test_an_error_inside_a_step_is_not_replaced_by_the_interrupt():
    guard = StepInterrupts()
    guard.install()
    try:
        with pytest.raises(ValueError):
            with guard.step():
                signal.raise_signal(signal.SIGINT)
                raise ValueError("the step failed")
    finally:
        guard.uninstall()


def signal_after(monkeypatch, obj, name: str, number: int, on_call: int = 2) -> None:
    """Make obj.name's `on_call`-th call send this process `number` once it has returned.

    A scheduler is patched on its class: its state_dict() is its __dict__, which the
    checkpoint pickles, and a wrapper there would not pickle.
    """
    owner = type(obj) if isinstance(obj, torch.optim.lr_scheduler.LRScheduler) else obj
    original = getattr(owner, name)
    calls = []

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append(1)
        if len(calls) == on_call:
            signal.raise_signal(number)
        return result

    monkeypatch.setattr(owner, name, wrapped)


def steps_held(checkpoint: Path) -> tuple[int, int, int]:
    """(its label, the scheduler's steps, Adam's steps) as the checkpoint stores them."""
    state = torch.load(checkpoint / STATE_FILE, weights_only=False)
    adam = {int(s["step"]) for s in state["optimizer"]["state"].values()}
    assert len(adam) == 1
    return state["step"], state["scheduler"]["last_epoch"], adam.pop()


# Each point of a step where a signal can land, as the (object, method) after whose second
# call (in step 2) it arrives. `next_batch` comes before the step: batch 2 has arrived.
POINTS = {
    "waiting for the batch": ("trainer", "next_batch"),
    "after optimizer.step": ("optimizer", "step"),
    "after the scheduler": ("scheduler", "step"),
    "after the trained-groups record": ("records", "trained_groups"),
    "after the metrics": ("trainer", "log"),
    "after the hand-over": ("trainer", "hand_over_weights"),
}


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_at_any_point_of_a_step_leaves_a_checkpoint_that_holds_its_label(
    point, number, api, wire_client, tiny_model_path, tmp_path, monkeypatch
):
    before = signal.getsignal(signal.SIGINT)
    save = tmp_path / "ckpt"
    trainer = make_trainer(tiny_model_path, save, atropos_url=api.url, training_steps=3)
    post_groups(wire_client, 3)
    owner, method = POINTS[point]
    target = trainer if owner == "trainer" else getattr(trainer, owner)
    signal_after(monkeypatch, target, method, number, on_call=2)
    trainer.run()  # returns: the interrupt is handled with a final checkpoint

    expected = 1 if point == "waiting for the batch" else 2
    assert trainer.step == expected
    (checkpoint,) = sorted(save.glob("step-*"))
    assert checkpoint.name == f"step-{expected}"
    assert steps_held(checkpoint) == (expected, expected, expected)
    trained = read_trained_groups(groups_path(save))
    assert [record.step for record in trained] == list(range(1, expected + 1))
    assert signal.getsignal(signal.SIGINT) is before  # put back
