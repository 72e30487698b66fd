"""Running untrusted, model-written Python so that its limits hold and the machine is unharmed.

Every run gets all of these; `sandbox_isolation.py` builds them:

- **Time.** A wall-clock deadline, after which the run's session is killed, and a
  CPU-time rlimit: the kernel stops a busy loop with SIGXCPU.
- **Memory and processes.** A memory cgroup of the run's own capped at `memory_mb`
  (`sandbox_cgroup.py`: it counts memory no process maps, such as a memfd's), the
  run's address space in all (`memory_mb`, shared out per process), a process cap
  (`max_processes`: a fork bomb's forks fail), a cap on every file written (stdout
  and stderr included: endless printing ends with SIGXFSZ) and no core dumps.
- **Identity.** A root parent runs each concurrent run as a uid of its own, never one
  that still owns a process, so runs cannot signal or starve each other and cannot
  write the host's files. A non-root parent needs bubblewrap.
- **Namespaces.** New PID, network, IPC, UTS and mount namespaces: no network, no view
  of other processes (their command lines or environments), and every process of the
  run dies with it. /tmp, /var/tmp and /dev/shm are fresh tmpfs mounts, each capped at
  `max_file_mb`, that vanish with the run; the work dir (cwd, HOME, TMPDIR) is in /tmp.
- **Files.** `isolation="bubblewrap"` (the default) mounts only the interpreter's
  directories, read-only. `isolation="namespaces"` (an explicit opt-in for hosts
  without bubblewrap; root only) keeps the host's files readable except the project,
  home directories, data caches and the cwd, which it hides.
- **Environment.** Scrubbed to PATH, LANG, HOME and TMPDIR.

A mode that cannot run here raises `SandboxUnavailable` at the first run, and so does
a machine where no memory cgroup can be made (unless `memory_cgroup=False` says that
`RLIMIT_AS` alone will do): nothing falls back to weaker isolation. Calls block;
`run_python_async` runs one in a worker thread, and `sandboxed_python` starts one that
runs beside others (the code grader pairs a solution with a judge through pipes).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from atroposlib.envs import sandbox_isolation as layers
from atroposlib.envs.sandbox_cgroup import RunCgroup, make_run_cgroup
from atroposlib.envs.sandbox_isolation import SandboxUnavailable
from atroposlib.utils.waiting import WaitTimeout, poll_until

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "Sandboxed",
    "interpreter",
    "isolation",
    "require_isolation",
    "run_python",
    "run_python_async",
    "sandboxed_python",
]

logger = logging.getLogger(__name__)
interpreter = layers.interpreter
RUN_DIR_PREFIX = "atropos-sandbox-"  # the host dir of a run: program, stdout, stderr
MIN_PROCESS_MEMORY_MB = 48  # below this an interpreter cannot start


class SandboxLimits(BaseModel):
    """What one run of untrusted code may use."""

    wall_time_s: float = Field(10.0, gt=0, description="Wall-clock seconds before a kill.")
    cpu_time_s: int = Field(5, ge=1, description="CPU seconds (RLIMIT_CPU) before SIGXCPU.")
    memory_mb: int = Field(
        512, ge=64, description="Address space of the whole run in MiB, all processes together."
    )
    max_processes: int = Field(
        4, ge=0, description="Processes the code may start itself (each shares memory_mb)."
    )
    max_file_mb: int = Field(
        16, ge=1, description="Largest file it may write, and the size of each scratch tmpfs."
    )
    max_output_chars: int = Field(
        65536, ge=1, description="Characters of stdout/stderr kept in the result."
    )
    isolation: Literal["bubblewrap", "namespaces"] = Field(
        "bubblewrap",
        description="'bubblewrap': only the interpreter's dirs are visible; 'namespaces': "
        "opt-in for hosts without bubblewrap (root only), host files readable except the "
        "project, homes, data caches and the cwd.",
    )
    hidden_paths: list[str] = Field(
        default_factory=list, description="More host dirs a 'namespaces' run sees empty."
    )
    memory_cgroup: bool = Field(
        True,
        description="Run in a memory cgroup capped at memory_mb (refused where none can be "
        "made). False: RLIMIT_AS alone, which does not count memory a process holds "
        "without mapping it (a memfd, a detached System V segment).",
    )

    @model_validator(mode="after")
    def _memory_per_process(self) -> SandboxLimits:
        share = self.memory_mb // (self.max_processes + 1)
        if share < MIN_PROCESS_MEMORY_MB:
            raise ValueError(
                f"memory_mb={self.memory_mb} shared by {self.max_processes + 1} processes is "
                f"{share} MiB each, under the {MIN_PROCESS_MEMORY_MB} MiB an interpreter needs: "
                "raise memory_mb or lower max_processes"
            )
        return self


@dataclass(frozen=True)
class SandboxResult:
    """How a run ended. `reason` names the limit that stopped it, if any."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    memory_exceeded: bool = False
    """The run's memory cgroup hit its limit (the kernel then kills inside the run)."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def reason(self) -> str:
        """'ok', 'wall_time', 'cpu_time', 'file_size', 'memory' or 'error'."""
        if self.timed_out:
            return "wall_time"
        if self.exit_code == -signal.SIGXCPU:
            return "cpu_time"
        if self.exit_code == -signal.SIGXFSZ:
            return "file_size"
        if self.memory_exceeded or "MemoryError" in self.stderr:
            return "memory"
        return "ok" if self.exit_code == 0 else "error"


@dataclass(frozen=True)
class Isolation:
    """Which layers a mode gives on this machine."""

    bubblewrap: bool  # the default mode can run here
    namespaces: bool  # the opt-in mode can run here
    run_as_uids: range  # the users runs execute as (just ours when not root)
    memory_cgroup: bool  # a run gets a memory cgroup of its own here


@functools.lru_cache(maxsize=2)
def _mode_works(mode: str) -> str | None:
    """None when `mode` runs here, else why not (probed once per process)."""
    try:
        result = _run("pass", SandboxLimits(isolation=mode, memory_cgroup=False), "", ())
    except (SandboxUnavailable, OSError) as error:
        return str(error)
    if not result.ok:
        return f"a probe run failed ({result.exit_code}): {result.stderr[-300:]}"
    return None


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """Which modes run here."""
    return Isolation(
        bubblewrap=_mode_works("bubblewrap") is None,
        namespaces=_mode_works("namespaces") is None,
        run_as_uids=layers.run_users.uids,
        memory_cgroup=_cgroup_problem() is None,
    )


@functools.lru_cache(maxsize=1)
def _cgroup_problem() -> str | None:
    """None when a run's memory cgroup can be made here, else why not (probed once)."""
    try:
        make_run_cgroup(64, 1).remove()
    except SandboxUnavailable as error:
        return str(error)
    return None


def require_isolation(mode: str, memory_cgroup: bool = True) -> None:
    """Raise `SandboxUnavailable`, with the reason, unless `mode` runs here (and, with
    `memory_cgroup`, a run's memory cgroup can be made)."""
    problem = _mode_works(mode)
    if problem is not None:
        raise SandboxUnavailable(f"the {mode!r} sandbox cannot run here: {problem}")
    problem = _cgroup_problem() if memory_cgroup else None
    if problem is not None:
        raise SandboxUnavailable(problem)


def _scrubbed_env() -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": layers.WORK_DIR,
        "TMPDIR": layers.WORK_DIR,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }


def _read_capped(path: Path, limit: int) -> str:
    with open(path, "rb") as handle:
        return handle.read(limit * 4).decode("utf-8", errors="replace")[:limit]


def _kill_group(pgid: int) -> None:
    """SIGKILL the run's session leader's group; its PID namespace takes the rest along."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _exited_unreaped(pid: int, timeout_s: float) -> bool:
    """Whether `pid` (our child) exits within `timeout_s`, leaving it unreaped: until it
    is reaped its pid, the run's process group id, cannot name another process (SBX-F)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # a kernel before 5.3: ask without reaping, in polls

        def exited() -> bool:
            flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
            return os.waitid(os.P_PID, pid, flags) is not None

        try:
            return poll_until(exited, timeout_s, "the sandboxed run", interval_s=0.02)
        except WaitTimeout:
            return False
    try:  # a pidfd turns readable when the process exits, and reaps nothing
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(int(timeout_s * 1000)))
    finally:
        os.close(pidfd)


class Sandboxed:
    """One started run: `finish` waits for it (or its deadline) and collects the result."""

    def __init__(
        self,
        child: subprocess.Popen,
        run_dir: Path,
        limits: SandboxLimits,
        cgroup: RunCgroup | None = None,
    ) -> None:
        self.child = child
        self.run_dir = run_dir
        self.limits = limits
        self.cgroup = cgroup
        self.started = time.monotonic()

    def end(self) -> None:
        """Kill what is left of the run, then reap it (in that order: SBX-F)."""
        if self.child.returncode is None:
            _kill_group(self.child.pid)
            self.child.wait()

    def finish(self, timeout: float | None = None) -> SandboxResult:
        """Wait at most `timeout` (default: the wall clock left), then kill what is left."""
        left = self.limits.wall_time_s - (time.monotonic() - self.started)
        wait_s = max(0.0, left if timeout is None else min(left, timeout))
        timed_out = not _exited_unreaped(self.child.pid, wait_s)
        self.end()
        code = self.child.returncode
        if code is not None and code > 128:
            code = 128 - code  # both modes' first process reports a signal as 128 + signal
        cap = self.limits.max_output_chars
        return SandboxResult(
            exit_code=None if timed_out else code,
            stdout=_read_capped(self.run_dir / "stdout", cap),
            stderr=_read_capped(self.run_dir / "stderr", cap),
            timed_out=timed_out,
            duration_s=time.monotonic() - self.started,
            memory_exceeded=self.cgroup is not None and self.cgroup.memory_exceeded(),
        )


@contextlib.contextmanager
def sandboxed_python(
    source: str,
    limits: SandboxLimits | None = None,
    stdin: str = "",
    pass_fds: Sequence[int] = (),
    args: Sequence[str] = (),
) -> Iterator[Sandboxed]:
    """Start `source` under `limits`; `pass_fds` stay open in it, `args` are its argv.

    The program and stdin reach the child as open files, never as paths it could list.
    Leaving the block kills whatever of the run is still alive.
    """
    limits = limits or SandboxLimits()
    require_isolation(limits.isolation, limits.memory_cgroup)
    with _started(source, limits, stdin, pass_fds, args) as run:
        yield run


@contextlib.contextmanager
def _started(
    source: str, limits: SandboxLimits, stdin: str, pass_fds: Sequence[int], args: Sequence[str]
) -> Iterator[Sandboxed]:
    with (
        layers.run_users.take() as (uid, charged),
        _run_cgroup(limits) as cgroup,
        tempfile.TemporaryDirectory(prefix=RUN_DIR_PREFIX, ignore_cleanup_errors=True) as private,
        tempfile.TemporaryFile() as stdin_file,
    ):
        run_dir = Path(private)  # 0700: only this process reads the program and output
        program = run_dir / "main.py"
        program.write_text(source, encoding="utf-8")
        stdin_file.write(stdin.encode())
        stdin_file.seek(0)
        program_fd = os.open(program, os.O_RDONLY)
        scratch = limits.max_file_mb << 20
        if limits.isolation == "bubblewrap":
            prefix = layers.bubblewrap_command(scratch)
            drop = uid != os.geteuid()
            identity: dict[str, Any] = (
                {"user": uid, "group": uid, "extra_groups": []} if drop else {}
            )
        else:
            hide = layers.hidden_paths(limits.hidden_paths)
            prefix, identity = layers.namespace_command(scratch, uid, hide), {}
        command = [*prefix, layers.interpreter(), "-I", "-S", f"/dev/fd/{program_fd}", *args]
        rlimits = layers.rlimits(
            limits.memory_mb, limits.cpu_time_s, limits.max_processes, limits.max_file_mb, charged
        )
        try:
            with open(run_dir / "stdout", "wb") as out, open(run_dir / "stderr", "wb") as err:
                child = subprocess.Popen(
                    command,
                    stdin=stdin_file,
                    stdout=out,
                    stderr=err,
                    cwd="/",
                    env=_scrubbed_env(),
                    start_new_session=True,
                    pass_fds=(program_fd, *pass_fds),
                    preexec_fn=functools.partial(
                        layers.child_setup,
                        rlimits,
                        os.getpid(),
                        cgroup.open_for_joining() if cgroup else [],
                    ),
                    **identity,
                )
        finally:
            os.close(program_fd)
        run = Sandboxed(child, run_dir, limits, cgroup)
        try:
            yield run
        finally:
            run.end()


@contextlib.contextmanager
def _run_cgroup(limits: SandboxLimits) -> Iterator[RunCgroup | None]:
    """The run's memory cgroup (None without `memory_cgroup`), removed after the run.
    Its task cap is the process cap's, plus one for `namespaces` mode's shell."""
    if not limits.memory_cgroup:
        yield None
        return
    cgroup = make_run_cgroup(limits.memory_mb, limits.max_processes + 4)
    try:
        yield cgroup
    finally:
        cgroup.remove()


def _run(source: str, limits: SandboxLimits, stdin: str, args: Sequence[str]) -> SandboxResult:
    with _started(source, limits, stdin, (), args) as run:
        return run.finish()


def run_python(source: str, limits: SandboxLimits | None = None, stdin: str = "") -> SandboxResult:
    """Run `source` as a Python program under `limits`; never raises for what the code does.

    Raises `SandboxUnavailable` when the asked-for isolation cannot run here.
    """
    limits = limits or SandboxLimits()
    require_isolation(limits.isolation, limits.memory_cgroup)
    return _run(source, limits, stdin, ())


async def run_python_async(
    source: str, limits: SandboxLimits | None = None, stdin: str = ""
) -> SandboxResult:
    """`run_python` in a worker thread, for environments' async scoring."""
    return await asyncio.to_thread(run_python, source, limits, stdin)
