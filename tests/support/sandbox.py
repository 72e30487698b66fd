"""The code sandbox's tests' shared parts: the limits each test runs under, in each mode
this machine can run, and the check that the machine is unharmed after an attack."""

from __future__ import annotations

import os
import subprocess

import pytest

from atroposlib.envs.sandbox import SandboxLimits, isolation
from tests.support.waiting import wait_until

LIMITS = SandboxLimits(wall_time_s=6, cpu_time_s=2, memory_mb=256, max_processes=3)
MODES = ["bubblewrap", "namespaces"]
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="per-run users need a root parent")


def leftover_processes() -> list[int]:
    """Processes of the sandbox's users, when those are not us (root runs code as others)."""
    uids = isolation().run_as_uids
    if os.geteuid() in uids:
        return []
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid in uids:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def assert_machine_unharmed() -> None:
    wait_until(lambda: not leftover_processes(), 15, "sandbox processes to end")
    assert subprocess.run(["true"]).returncode == 0  # this process can still fork
    assert len(bytearray(64 << 20)) == 64 << 20  # ...and allocate
