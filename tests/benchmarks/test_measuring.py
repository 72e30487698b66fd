"""The benchmarks' own measuring: when a run reached a score, and whether it ran alone."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from cpu_share import BUSY_SHARE, CpuWatch, others_share
from learning_curve import Curve, seconds_to


def test_time_to_a_score_is_when_the_trailing_ten_step_mean_reaches_it():
    seconds = [float(i) for i in range(1, 31)]
    scores = [0.3] * 10 + [0.9] * 20
    # the mean of the last 10 steps first reaches 0.5 when 4 of them score 0.9
    assert seconds_to(seconds, scores) == 14.0
    assert seconds_to(seconds, [0.9] + [0.3] * 29) is None  # one lucky step is not enough
    assert seconds_to(seconds[:5], [1.0] * 5) is None  # fewer steps than the window


def test_a_curve_summarises_first_and_last_ten_steps():
    curve = Curve()
    for step in range(20):
        curve.add(step * 0.5, 0.2 if step < 10 else 0.8)
    summary = curve.summary()
    assert summary["first10"] == pytest.approx(0.2) and summary["last10"] == pytest.approx(0.8)
    assert summary["to_target_s"] == 7.0  # step 15 (index 14): 5 of the last 10 at 0.8


def test_the_others_share_is_what_the_machine_spent_beyond_the_run():
    assert others_share(machine_busy_s=3.0, own_s=2.0, wall_s=10.0, cpus=2) == 0.05
    assert others_share(machine_busy_s=1.0, own_s=1.5, wall_s=10.0, cpus=2) == 0.0
    assert others_share(machine_busy_s=1.0, own_s=0.0, wall_s=0.0, cpus=2) == 0.0


@pytest.mark.integration  # a real process beside the run
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc/stat")
def test_a_process_outside_the_run_makes_the_timing_busy():
    """A busy loop the run did not wait for is someone else's: one core of N is 1/N."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with CpuWatch() as watch:
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        spinner.kill()
        spinner.wait()
    assert watch.others_share is not None
    assert watch.others_share > BUSY_SHARE and watch.busy
    assert watch.verdict().startswith("BUSY")
