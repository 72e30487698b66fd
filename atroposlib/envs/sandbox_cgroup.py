"""A memory cgroup per sandboxed run: the memory cap that holds for untrusted code.

Design decisions:

- **Why a cgroup.** `RLIMIT_AS` bounds what a process maps. Pages written into a
  `memfd`, a System V segment it detached, or a pipe are held without being mapped,
  so a process kept 600 MiB under `memory_mb=512` (SBX-A of the security review), and
  the kernel's OOM killer then picked the trainer or the engine. The kernel charges
  every page, mapped or not, to the memory cgroup of the process that touched it: a
  cgroup per run whose limit is `memory_mb` holds, and what goes over it is killed
  inside the run.
- **Which cgroup.** cgroup v2 where the process's own cgroup already delegates the
  memory controller to its children (`cgroup.subtree_control`); else cgroup v1's
  memory controller (with `memory.memsw` where swap is accounted, so swap is no way
  around it) and its pids controller. The run's cgroups are children of the process's
  own, so a container's or a session's limits still hold above them.
- **Joining.** The run's first process writes itself into `cgroup.procs` between
  fork and exec (through files the parent opened), so nothing it starts is ever
  outside.
- **No silent fallback.** Where no cgroup can be made, `make_run_cgroup` raises
  `SandboxUnavailable` saying why; a caller that accepts `RLIMIT_AS` alone says so
  with `SandboxLimits(memory_cgroup=False)`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from atroposlib.envs.sandbox_isolation import SandboxUnavailable
from atroposlib.utils.waiting import WaitTimeout, poll_until

logger = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
NAME_PREFIX = "atropos-sandbox-"
REMOVE_TIMEOUT_S = 5.0
"""How long a run's cgroup may stay busy after its processes were killed (the kernel
frees a dead PID namespace's processes asynchronously)."""
_numbers = itertools.count()


@dataclass
class RunCgroup:
    """The cgroup directories of one run (one per v1 controller, or one v2 directory)."""

    dirs: list[Path]
    version: int
    join_fds: list[int] = field(default_factory=list)

    def open_for_joining(self) -> list[int]:
        """Files the run's first process writes itself into, opened here (the parent)."""
        self.join_fds = [os.open(d / "cgroup.procs", os.O_WRONLY) for d in self.dirs]
        return self.join_fds

    def memory_exceeded(self) -> bool:
        """Whether the kernel killed a process of the run for going over its limit."""
        memory = self.dirs[0]
        events = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (memory / events).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        if self.version == 1:  # kernels before 4.13 count no oom_kill: the limit was hit
            with contextlib.suppress(OSError, ValueError):
                return int((memory / "memory.failcnt").read_text()) > 0
        return False

    def remove(self) -> None:
        """Remove the run's directories once its processes are gone (a dead namespace's
        processes are freed asynchronously, so an empty cgroup may be busy a moment)."""
        for fd in self.join_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.join_fds = []
        for directory in reversed(self.dirs):

            def removed(directory: Path = directory) -> bool:
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    return True
                except OSError:
                    return False
                return True

            try:
                poll_until(removed, REMOVE_TIMEOUT_S, f"the sandbox cgroup {directory}")
            except WaitTimeout:
                logger.warning("sandbox cgroup %s is still busy; left in place", directory)


def own_cgroups(self_cgroup: Path = SELF_CGROUP) -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" its v2 path."""
    found: dict[str, str] = {}
    for line in self_cgroup.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def parent_dirs(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> list[Path]:
    """Where this process's runs get their cgroups (those that exist): its own cgroup
    in the v2 hierarchy and in v1's memory and pids hierarchies."""
    own = own_cgroups(self_cgroup)
    found = [_v2_parent(root, own)] if "" in own else []
    found += [_v1_parent(root, own, c) for c in ("memory", "pids") if c in own]
    return [directory for directory in found if directory.is_dir()]


def _v2_parent(root: Path, own: dict[str, str]) -> Path:
    mount = root if (root / "cgroup.controllers").exists() else root / "unified"
    return mount / own[""].lstrip("/")


def _v1_parent(root: Path, own: dict[str, str], controller: str) -> Path:
    return root / controller / own[controller].lstrip("/")


def make_run_cgroup(
    memory_mb: int,
    max_tasks: int,
    root: Path = CGROUP_ROOT,
    self_cgroup: Path = SELF_CGROUP,
) -> RunCgroup:
    """A new cgroup (v2, else v1) capping a run at `memory_mb` and `max_tasks` tasks;
    `SandboxUnavailable` with the reasons where neither can be made here."""
    # the pid says whose it is (`_remove_stale`); the random part keeps a reused pid's
    # name apart from a SIGKILLed process's leftover, which nothing removed
    name = f"{NAME_PREFIX}{os.getpid()}-{next(_numbers)}-{secrets.token_hex(4)}"
    limit = str(memory_mb << 20)
    try:
        own = own_cgroups(self_cgroup)
    except (OSError, ValueError) as error:
        raise SandboxUnavailable(f"cannot read this process's cgroups: {error}") from None
    problems = []
    for attempt in (_make_v2, _make_v1):
        try:
            return attempt(root, own, name, limit, max_tasks)
        except (OSError, _NoController) as error:
            problems.append(str(error))
    raise SandboxUnavailable(
        "no memory cgroup can be made for a sandboxed run here ("
        + "; ".join(problems)
        + "); without one memory_mb bounds only what each process maps, not what it holds "
        "unmapped (memfd, System V segments): give this process a writable cgroup (root, or "
        "a delegated cgroup v2 subtree), or accept that with SandboxLimits(memory_cgroup=False)"
    )


class _NoController(Exception):
    pass


def _remove_stale(parent: Path) -> None:
    """Remove the empty run cgroups of processes that are gone (killed before they could
    remove theirs); a busy one, or one whose process lives, is left alone."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            owner = entry.name.removeprefix(NAME_PREFIX).partition("-")[0]
            if not entry.name.startswith(NAME_PREFIX) or not owner.isdigit():
                continue
            if not Path(f"/proc/{owner}").exists():
                with contextlib.suppress(OSError):
                    entry.rmdir()


def _make_v2(root: Path, own: dict[str, str], name: str, limit: str, tasks: int) -> RunCgroup:
    if "" not in own:
        raise _NoController("cgroup v2: this process is in none")
    parent = _v2_parent(root, own)
    delegated = (parent / "cgroup.subtree_control").read_text().split()
    if "memory" not in delegated:
        raise _NoController(f"cgroup v2: {parent} does not delegate the memory controller")
    _remove_stale(parent)
    directory = parent / name
    directory.mkdir()
    try:
        (directory / "memory.max").write_text(limit)
        with contextlib.suppress(FileNotFoundError):  # no swap accounting, no swap to limit
            (directory / "memory.swap.max").write_text("0")
        if "pids" in delegated:
            (directory / "pids.max").write_text(str(tasks))
    except OSError:
        directory.rmdir()
        raise
    return RunCgroup([directory], version=2)


def _make_v1(root: Path, own: dict[str, str], name: str, limit: str, tasks: int) -> RunCgroup:
    if "memory" not in own or not (root / "memory").is_dir():
        raise _NoController("cgroup v1: no memory controller is mounted")
    made: list[Path] = []
    try:
        _remove_stale(_v1_parent(root, own, "memory"))
        memory = _v1_parent(root, own, "memory") / name
        memory.mkdir()
        made.append(memory)
        (memory / "memory.limit_in_bytes").write_text(limit)
        if (memory / "memory.memsw.limit_in_bytes").exists():  # swap is accounted: cap it too
            (memory / "memory.memsw.limit_in_bytes").write_text(limit)
        if "pids" in own and (root / "pids").is_dir():
            _remove_stale(_v1_parent(root, own, "pids"))
            pids = _v1_parent(root, own, "pids") / name
            pids.mkdir()
            made.append(pids)
            (pids / "pids.max").write_text(str(tasks))
    except OSError:
        for directory in reversed(made):
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise
    return RunCgroup(made, version=1)
