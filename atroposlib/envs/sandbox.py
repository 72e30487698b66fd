"""Running untrusted, model-written Python so that its limits hold and the machine is unharmed.

Layers, each applied where the operating system allows it (`isolation()` says which):

- **Time.** A wall-clock deadline: the parent kills the child's whole process group.
  A CPU-time rlimit: the kernel kills a busy loop with SIGXCPU.
- **Memory and processes.** RLIMIT_AS caps the address space (a 10 GB allocation raises
  MemoryError), RLIMIT_NPROC caps processes (a fork bomb's forks fail), RLIMIT_FSIZE
  caps every file written (stdout and stderr are files too, so endless printing ends
  with SIGXFSZ instead of filling the parent's memory), RLIMIT_CORE is 0.
- **Identity.** The kernel does not enforce RLIMIT_NPROC for root, and counts processes
  per user. So a root parent runs each concurrent run as a user of its own, taken from
  a pool of unused uids: a fork bomb in one run cannot starve its neighbours, and none
  of them can write the host's files. A non-root parent runs code as itself; the
  process cap then covers that user's processes plus each active run's headroom.
- **Files.** A private work directory is the code's cwd, HOME and TMPDIR, and is
  removed afterwards. The environment is scrubbed to PATH, LANG, HOME and TMPDIR.
- **Bubblewrap**, when installed and working (Debian's `bubblewrap`; scripts/test.sh
  installs it): a read-only view of the host, fresh size-capped tmpfs for the work dir,
  /tmp, /var/tmp and /dev/shm, and new network, PID, IPC and UTS namespaces: no
  network at all, and every process dies with the sandbox. Without it there is no
  network isolation, and world-writable host dirs such as /tmp stay writable; the
  module logs that once.

Calls block; `run_python_async` runs one in a worker thread for asyncio callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE
from typing import Any, Literal

from pydantic import BaseModel, Field

logger = logging.getLogger(__name__)

# Per-process block of uids no account uses, one uid per concurrent run.
UID_POOL_SIZE = 64
UID_POOL_BASE = 2_000_000_000 + (os.getpid() % 1_000_000) * UID_POOL_SIZE
SANDBOX_TMP = "/tmp"  # inside bubblewrap: a fresh tmpfs holding the program and work dir


class SandboxUnavailable(RuntimeError):
    """`bubblewrap="require"` was asked for and bubblewrap cannot run here."""


class SandboxLimits(BaseModel):
    """What one run of untrusted code may use."""

    wall_time_s: float = Field(10.0, gt=0, description="Wall-clock seconds before a kill.")
    cpu_time_s: int = Field(5, ge=1, description="CPU seconds (RLIMIT_CPU) before SIGXCPU.")
    memory_mb: int = Field(512, ge=64, description="Address space in MiB (RLIMIT_AS).")
    max_processes: int = Field(
        16, ge=1, description="Processes the code may start itself (RLIMIT_NPROC headroom)."
    )
    max_file_mb: int = Field(
        16, ge=1, description="Largest file it may write, stdout and stderr included."
    )
    max_output_chars: int = Field(
        65536, ge=1, description="Characters of stdout/stderr kept in the result."
    )
    bubblewrap: Literal["auto", "require", "off"] = Field(
        "auto",
        description="'auto': use bubblewrap when it works here; 'require': fail without "
        "it; 'off': rlimits, a private dir and a dropped identity only.",
    )


@dataclass(frozen=True)
class SandboxResult:
    """How a run ended. `reason` names the limit that stopped it, if any."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float

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
        if "MemoryError" in self.stderr:
            return "memory"
        return "ok" if self.exit_code == 0 else "error"


@dataclass(frozen=True)
class Isolation:
    """Which layers are active on this machine."""

    bubblewrap: bool
    run_as_uids: range  # the users runs execute as (just ours when not root)
    network_isolated: bool


def _drops_identity() -> bool:
    return os.geteuid() == 0


def _world_executable(path: str) -> bool:
    """Can any user run this interpreter? (Its standard library lives beside it.)"""
    real = Path(os.path.realpath(path))
    if not real.is_file():
        return False
    return all(p.stat().st_mode & stat.S_IXOTH for p in [real, *real.parents])


@functools.lru_cache(maxsize=1)
def interpreter() -> str:
    """The Python that runs sandboxed code: this one, unless the run users cannot reach it."""
    candidates = [
        sys._base_executable,
        sys.executable,
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ]
    if not _drops_identity():
        return candidates[0]
    for candidate in filter(None, candidates):
        if _world_executable(candidate):
            return candidate
    raise SandboxUnavailable(
        "running as root, the sandbox runs code as an unprivileged user, who cannot execute "
        f"{candidates}; install a system python3 (apt install python3)"
    )


def _user_process_count(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                continue
    return count


class _RunUsers:
    """Hands each concurrent run a uid of its own (root) or our own uid (otherwise)."""

    def __init__(self) -> None:
        self.own = not _drops_identity()
        self.uids = (
            range(os.geteuid(), os.geteuid() + 1)
            if self.own
            else range(UID_POOL_BASE, UID_POOL_BASE + UID_POOL_SIZE)
        )
        self._free = list(self.uids)
        self._active = 0
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(UID_POOL_SIZE)

    @contextlib.contextmanager
    def take(self) -> Iterator[tuple[int, int]]:
        """(uid, processes already charged to it) for one run."""
        self._slots.acquire()
        with self._lock:
            uid = self.uids[0] if self.own else self._free.pop()
            self._active += 1
            sharing = self._active - 1 if self.own else 0
        try:
            yield uid, _user_process_count(uid) + sharing * 3
        finally:
            with self._lock:
                self._active -= 1
                if not self.own:
                    self._free.append(uid)
            self._slots.release()


_run_users = _RunUsers()


def _rlimits(limits: SandboxLimits, charged: int) -> list[tuple[int, int, int]]:
    """(resource, soft, hard) for a run, computed in the parent.

    The process cap is what the run's user already has (`charged`) plus the headroom;
    the CPU hard limit is a second above the soft one, so SIGXCPU (which names the
    cause) arrives before the kernel's SIGKILL.
    """
    processes = limits.max_processes + 3 + charged
    return [
        (resource.RLIMIT_CPU, limits.cpu_time_s, limits.cpu_time_s + 1),
        (resource.RLIMIT_AS, limits.memory_mb << 20, limits.memory_mb << 20),
        (resource.RLIMIT_NPROC, processes, processes),
        (resource.RLIMIT_FSIZE, limits.max_file_mb << 20, limits.max_file_mb << 20),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NOFILE, 64, 64),
    ]


def _apply_rlimits(limits: list[tuple[int, int, int]]) -> None:
    """Runs in the child between fork and exec, after the identity drop: C calls only."""
    for kind, soft, hard in limits:
        resource.setrlimit(kind, (soft, hard))


def _spawn(
    command: list[str], limits: SandboxLimits, uid: int, charged: int, **popen: Any
) -> subprocess.Popen:
    """Start `command` in its own session, as `uid`, under the run's rlimits."""
    identity = {"user": uid, "group": uid, "extra_groups": []} if uid != os.geteuid() else {}
    return subprocess.Popen(
        command,
        start_new_session=True,
        preexec_fn=functools.partial(_apply_rlimits, _rlimits(limits, charged)),
        **identity,
        **popen,
    )


def _bubblewrap_command(program: Path, tmpfs_bytes: int) -> list[str]:
    work = f"{SANDBOX_TMP}/work"
    mounts = [
        *("--ro-bind", "/", "/"),
        *("--dev", "/dev", "--proc", "/proc"),
        *("--size", str(tmpfs_bytes), "--tmpfs", "/tmp"),
        *("--size", str(tmpfs_bytes), "--tmpfs", "/var/tmp"),
        *("--size", str(tmpfs_bytes), "--tmpfs", "/dev/shm"),
        *("--size", str(tmpfs_bytes), "--tmpfs", work),
        *("--ro-bind", str(program), f"{SANDBOX_TMP}/main.py"),
    ]
    return ["bwrap", *mounts, "--unshare-all", "--die-with-parent", "--chdir", work]


@functools.lru_cache(maxsize=1)
def _bubblewrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    with tempfile.TemporaryDirectory() as folder:
        program = Path(folder) / "main.py"
        program.write_text("print('ok')\n")
        program.chmod(0o644)
        os.chmod(folder, 0o755)
        command = [*_bubblewrap_command(program, 1 << 20), interpreter(), "-I", "-c", "pass"]
        try:
            with _run_users.take() as (uid, charged):
                probe = _spawn(command, SandboxLimits(), uid, charged, stdout=PIPE, stderr=PIPE)
                _, stderr = probe.communicate(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return False
    if probe.returncode != 0:
        logger.warning("bubblewrap is installed but cannot run here: %s", stderr[-300:])
    return probe.returncode == 0


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """The layers a run gets here (bubblewrap is probed once per process)."""
    wrapped = _bubblewrap_works()
    if not wrapped:
        logger.warning(
            "sandbox without bubblewrap: no network isolation, and world-writable host "
            "dirs stay writable (apt install bubblewrap)"
        )
    return Isolation(bubblewrap=wrapped, run_as_uids=_run_users.uids, network_isolated=wrapped)


def _scrubbed_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }


def _read_capped(path: Path, limit: int) -> str:
    with open(path, "rb") as handle:
        return handle.read(limit * 4).decode("utf-8", errors="replace")[:limit]


def run_python(source: str, limits: SandboxLimits | None = None, stdin: str = "") -> SandboxResult:
    """Run `source` as a Python program under `limits`; never raises for what the code does."""
    limits = limits or SandboxLimits()
    use_bubblewrap = limits.bubblewrap != "off" and isolation().bubblewrap
    if limits.bubblewrap == "require" and not use_bubblewrap:
        raise SandboxUnavailable("bubblewrap is required but cannot run here")
    with _run_users.take() as (uid, charged):
        return _run(source, limits, stdin, use_bubblewrap, uid, charged)


def _run(
    source: str, limits: SandboxLimits, stdin: str, use_bubblewrap: bool, uid: int, charged: int
) -> SandboxResult:
    with tempfile.TemporaryDirectory(prefix="atropos-sandbox-") as private:
        run_dir = Path(private)  # 0700 unless another user must reach main.py and work/
        program = run_dir / "main.py"
        program.write_text(source, encoding="utf-8")
        work = run_dir / "work"
        work.mkdir()
        if uid != os.geteuid():
            os.chmod(run_dir, 0o711)
            program.chmod(0o644)
            os.chown(work, uid, uid)
        if use_bubblewrap:
            prefix = _bubblewrap_command(program, limits.max_file_mb << 20)
            home, script = f"{SANDBOX_TMP}/work", f"{SANDBOX_TMP}/main.py"
        else:
            prefix, home, script = [], str(work), str(program)
        command = [*prefix, interpreter(), "-I", "-S", script]
        out_path, err_path = run_dir / "stdout", run_dir / "stderr"
        started = time.monotonic()
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            child = _spawn(
                command,
                limits,
                uid,
                charged,
                stdin=PIPE,
                stdout=out,
                stderr=err,
                cwd=str(work),
                env=_scrubbed_env(home),
            )
            try:
                child.communicate(stdin.encode(), timeout=limits.wall_time_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(child.pid)
                child.wait()
        code = child.returncode
        if use_bubblewrap and code is not None and code > 128:
            code = 128 - code  # bubblewrap reports a signal death as 128 + signal
        return SandboxResult(
            exit_code=None if timed_out else code,
            stdout=_read_capped(out_path, limits.max_output_chars),
            stderr=_read_capped(err_path, limits.max_output_chars),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )


def _kill_group(pgid: int) -> None:
    """SIGKILL every process left in the run's session (forks included)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_python_async(
    source: str, limits: SandboxLimits | None = None, stdin: str = ""
) -> SandboxResult:
    """`run_python` in a worker thread, for environments' async scoring."""
    return await asyncio.to_thread(run_python, source, limits, stdin)
