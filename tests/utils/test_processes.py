"""Children of `spawn` hear SIGINT even when their parent was started ignoring it."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from atroposlib.utils.processes import spawn
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

CHILD = "import sys, time; print('ready', flush=True); time.sleep(60); sys.exit(3)"


def test_a_child_gets_sigint_back_when_its_parent_ignores_it():
    """As under `nohup ... &`: without the reset, the SIGINT that asks a trainer for its
    final checkpoint is ignored and the launcher has to SIGKILL it after the grace."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = spawn([sys.executable, "-c", CHILD], subprocess.PIPE)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        child.send_signal(signal.SIGINT)
        code = wait_until(lambda: child.poll() is not None and (child.returncode,), 10, "no exit")
        assert code[0] == -signal.SIGINT  # Python exits on KeyboardInterrupt by that signal
    finally:
        child.kill()
        child.wait()
