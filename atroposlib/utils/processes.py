"""Child processes that never outlive their parent.

Three guards, used by the engine launcher and `atropos-launch`: each child runs
in its own session (so stopping it signals its whole group, and only that
group), asks the kernel to SIGTERM it when its parent dies (Linux
`PR_SET_PDEATHSIG`, which covers a parent killed with SIGKILL), and `stop_group`
escalates from a polite signal to SIGKILL after a grace period.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import IO, Any


def die_with_parent() -> None:
    """In the child: get SIGTERM when the parent dies (Linux only; a no-op elsewhere).

    Also restores SIGINT's default: a parent started in the background by a shell
    ignores SIGINT and its children would inherit that, so the SIGINT that asks a
    trainer for its final checkpoint would never arrive.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def spawn(
    command: list[str],
    stdout: IO[Any] | int,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.Popen:
    """Start `command` in a new session, tied to this process's life."""
    return subprocess.Popen(
        command,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,
    )


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(proc: subprocess.Popen, grace_s: float, first: int = signal.SIGTERM) -> int | None:
    """Signal the child's group with `first`, then SIGKILL after `grace_s`; returns its code."""
    if proc.poll() is None:
        signal_group(proc, first)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait(10)
    signal_group(proc, signal.SIGKILL)  # stragglers of its own group only
    return proc.returncode


def log_tail(path: Path | None, lines: int = 30) -> str:
    if path is None or not path.exists():
        return "(no log)"
    with open(path, errors="replace") as log:
        return "".join(deque(log, maxlen=lines))


def descendants(root: int) -> set[int]:
    """Every live process below `root`, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, stack = set(), [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def descendant_matching(root: int, pattern: str) -> int | None:
    """The lowest pid below `root` whose command line contains `pattern`, or None."""
    for pid in sorted(descendants(root)):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if pattern in cmdline:
            return pid
    return None
