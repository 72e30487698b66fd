"""The operating-system layers under `sandbox.py`: identities, rlimits and namespaces.

Design decisions:

- **Two modes, no silent fallback.** `bubblewrap` (the default) runs code in
  bubblewrap's namespaces over a root that holds only the interpreter and its libraries.
  `namespaces` is the explicit opt-in for machines without bubblewrap: util-linux's
  `unshare` (root only) gives the same PID, network, IPC and mount namespaces and
  size-capped tmpfs mounts, but the host's files stay readable except the paths it
  hides. A mode that cannot run here raises `SandboxUnavailable`; nothing falls back.
- **No process outlives a run.** In both modes the code's processes live in a PID
  namespace of their own, and the namespace dies with its first process. The code
  never runs as that first process, so the kernel's signals (SIGXCPU, SIGXFSZ) reach it.
- **Memory is bounded per run, not per process.** `RLIMIT_AS` is per process, so each
  process gets the run's memory divided by the processes it may have.
- **A uid is never handed out while it owns a process**, and the pool is first in,
  first out, so a leftover (there should be none) cannot meet a later run.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import resource
import shutil
import signal
import stat
import sys
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

# Per-process block of uids no account uses, one uid per concurrent run.
UID_POOL_SIZE = 64
UID_POOL_BASE = 2_000_000_000 + os.getpid() * UID_POOL_SIZE  # pids < 2**22: unique, < 2**32
WORK_DIR = "/tmp/work"  # inside both modes: on the run's own /tmp tmpfs
# What the interpreter needs; everything else of the host stays out of a bubblewrap run
# (SBX-E: /usr/local, /usr/src or /etc/pip.conf can hold a project's or a user's secrets).
LIBRARY_DIRS = ("/lib", "/lib32", "/lib64", "/libx32", "/usr/lib", "/usr/lib32", "/usr/lib64")
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")  # the dynamic loader's cache, the time zone
# What a `namespaces` run keeps visible even when a hidden path would cover it.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# The dirs every run gets fresh and size-capped; a `namespaces` run sees the host's
# /run/lock too (world-writable there), which bubblewrap's root does not hold.
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
HOST_SCRATCH_DIRS = (*SCRATCH_DIRS, "/run/lock")
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class SandboxUnavailable(RuntimeError):
    """The asked-for isolation cannot run on this machine."""


def drops_identity() -> bool:
    """A root parent runs code as a uid of its own per run; others run it as themselves."""
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
    # CPython's sys._base_executable (the python a venv's points at) is private: not in typeshed
    base_executable = sys._base_executable  # type: ignore[attr-defined]
    candidates = [base_executable, sys.executable, "/usr/bin/python3"]
    if not drops_identity():
        return candidates[0]
    for candidate in filter(None, candidates):
        if _world_executable(candidate):
            return os.path.realpath(candidate)
    raise SandboxUnavailable(
        "running as root, the sandbox runs code as an unprivileged user, who cannot execute "
        f"{candidates}; install a system python3 (apt install python3)"
    )


def _interpreter_prefix() -> str:
    """The installation tree of `interpreter()` (its bin/ and lib/)."""
    return str(Path(os.path.realpath(interpreter())).parents[1])


def _process_owners() -> list[int]:
    owners = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                owners.append(entry.stat().st_uid)
    return owners


class RunUsers:
    """Hands each concurrent run a uid of its own (root) or our own uid (otherwise)."""

    def __init__(self) -> None:
        self.own = not drops_identity()
        base = os.geteuid() if self.own else UID_POOL_BASE
        self.uids = range(base, base + (1 if self.own else UID_POOL_SIZE))
        self._free = deque(self.uids)
        self._active = 0
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(UID_POOL_SIZE)

    def _clean_uid(self) -> int:
        """The longest-idle free uid that owns no process (a busy one waits its turn)."""
        busy = set(_process_owners())
        for _ in range(len(self._free)):
            uid = self._free.popleft()
            if uid not in busy:
                return uid
            self._free.append(uid)
        raise SandboxUnavailable(
            f"every free sandbox uid still owns processes: {sorted(busy & set(self._free))}"
        )

    @contextlib.contextmanager
    def take(self) -> Iterator[tuple[int, int]]:
        """(uid, processes already charged to it) for one run.

        Only a non-root parent is charged: its code runs as the parent's user, whose own
        processes count against the run's `RLIMIT_NPROC`.
        """
        self._slots.acquire()
        try:
            with self._lock:
                uid = self.uids[0] if self.own else self._clean_uid()
                self._active += 1
                sharing = self._active - 1
            charged = _process_owners().count(uid) + sharing * 3 if self.own else 0
            try:
                yield uid, charged
            finally:
                with self._lock:
                    self._active -= 1
                    if not self.own:
                        self._free.append(uid)
        finally:
            self._slots.release()


run_users = RunUsers()


def rlimits(
    memory_mb: int, cpu_time_s: int, max_processes: int, max_file_mb: int, charged: int
) -> list[tuple[int, int, int]]:
    """(resource, soft, hard) for a run, computed in the parent.

    The address space of the run's processes together stays under `memory_mb`: each
    of the `max_processes + 1` processes it may hold gets its share. The process cap
    adds 3 for bubblewrap's own two processes and the interpreter. The CPU hard limit
    is a second above the soft one, so SIGXCPU (which names the cause) comes first.
    """
    processes = max_processes + 3 + charged
    share = (memory_mb << 20) // (max_processes + 1)
    return [
        (resource.RLIMIT_CPU, cpu_time_s, cpu_time_s + 1),
        (resource.RLIMIT_AS, share, share),
        (resource.RLIMIT_NPROC, processes, processes),
        (resource.RLIMIT_FSIZE, max_file_mb << 20, max_file_mb << 20),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NOFILE, 64, 64),
    ]


def apply_rlimits(limits: list[tuple[int, int, int]]) -> None:
    """Runs in the child between fork and exec: C calls only."""
    for kind, soft, hard in limits:
        resource.setrlimit(kind, (soft, hard))


PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # loaded here: a forked child must not load it


def child_setup(
    limits: list[tuple[int, int, int]], parent_pid: int, cgroup_fds: Sequence[int] = ()
) -> None:
    """Runs in the child between fork and exec: the run's cgroup (each of `cgroup_fds`
    is a `cgroup.procs` the parent opened) and limits, and SIGKILL when the parent dies.
    bubblewrap also has --die-with-parent; `unshare` has nothing of the kind, and its
    `--kill-child` then takes the whole namespace down (SBX-C)."""
    for fd in cgroup_fds:
        os.write(fd, b"0")  # "0": the writing process
    apply_rlimits(limits)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(1)


@functools.lru_cache(maxsize=1)
def bubblewrap_path() -> str | None:
    """bwrap, resolved once with our PATH (runs get a scrubbed PATH that may lack it)."""
    found = shutil.which("bwrap")
    return os.path.realpath(found) if found else None


def _system_binds() -> list[str]:
    """The interpreter, the library dirs it and its standard library load from, its
    own prefix when that is not the system's (/usr), and two /etc files: read-only."""
    shown = [d for d in LIBRARY_DIRS if os.path.exists(d)]
    prefix = _interpreter_prefix()
    if prefix in ("/usr", "/"):  # the system's python: its standard library is in /usr/lib
        shown.append(os.path.realpath(interpreter()))
    elif not any(prefix == d or prefix.startswith(d + "/") for d in shown):
        shown.append(prefix)
    shown += [f for f in ETC_FILES if os.path.exists(f)]
    return [arg for path in shown for arg in ("--ro-bind", path, path)]


def bubblewrap_command(scratch_bytes: int) -> list[str]:
    """bwrap over a root of the interpreter's dirs, fresh capped scratch, no network."""
    bwrap = bubblewrap_path()
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap is not installed (apt install bubblewrap)")
    size = str(scratch_bytes)
    scratch = [arg for d in SCRATCH_DIRS for arg in ("--size", size, "--tmpfs", d)]
    return [
        bwrap,
        *_system_binds(),
        *("--dev", "/dev", "--proc", "/proc"),
        *scratch,
        *("--dir", WORK_DIR, "--chdir", WORK_DIR),
        *("--unshare-all", "--die-with-parent", "--new-session"),
    ]


# Runs as root inside fresh namespaces: the host's root file system read-only in this
# mount namespace (a write to a world-writable host dir would outlive the run and reach
# the next one: SBX-D of the security review), fresh capped scratch dirs, the given host
# paths hidden, then the command as the run's uid (as a child, not the namespace's init).
# Arguments: SIZE UID WORK_DIR SCRATCH_DIR... -- HIDDEN_DIR... -- COMMAND...
NAMESPACE_INIT = r"""
set -e
size=$1; uid=$2; work=$3; shift 3
mount -o remount,bind,ro /
while [ "$1" != "--" ]; do
  if [ -d "$1" ]; then mount -t tmpfs -o "size=$size,mode=1777,nosuid,nodev" tmpfs "$1"; fi
  shift
done
shift
while [ "$1" != "--" ]; do
  if [ -d "$1" ]; then mount -t tmpfs -o size=4k,mode=0555,nosuid,nodev tmpfs "$1"; fi
  shift
done
shift
mkdir -m 0700 "$work"
chown "$uid:$uid" "$work"
cd "$work" && unset OLDPWD
setpriv --reuid="$uid" --regid="$uid" --clear-groups --no-new-privs --inh-caps=-all -- "$@"
"""


def hidden_paths(extra: Sequence[str] = ()) -> list[str]:
    """Host dirs a `namespaces` run sees empty: the project, its data, homes, the cwd."""
    candidates = [str(PROJECT_ROOT), os.getcwd(), "/root", "/home", *extra]
    for variable in (
        *("HF_HOME", "HF_DATASETS_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_CACHE"),
        *("TRANSFORMERS_CACHE", "XDG_CACHE_HOME", "ATROPOS_ENV_STATE_DIR", "ATROPOS_CACHE_DIR"),
    ):
        if os.environ.get(variable):
            candidates.append(os.environ[variable])
    prefix = _interpreter_prefix()
    keep = [*SYSTEM_DIRS, prefix, "/"]
    hidden = []
    for path in map(os.path.realpath, candidates):
        needed = any(k == path or k.startswith(path.rstrip("/") + "/") for k in keep)
        if not needed and os.path.isdir(path) and path not in hidden:
            hidden.append(path)
    return hidden


def namespace_command(scratch_bytes: int, uid: int, hide: Sequence[str]) -> list[str]:
    """util-linux `unshare`: PID, mount, network, IPC and UTS namespaces, then NAMESPACE_INIT."""
    if not drops_identity():
        raise SandboxUnavailable(
            "the 'namespaces' sandbox needs a root parent to build its namespaces; "
            "install bubblewrap instead (apt install bubblewrap)"
        )
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("setpriv") is None:
        raise SandboxUnavailable("the 'namespaces' sandbox needs util-linux's unshare and setpriv")
    return [
        unshare,
        *("--pid", "--fork", "--kill-child", "--mount-proc"),
        *("--mount", "--net", "--ipc", "--uts", "--propagation", "private"),
        *("/bin/sh", "-c", NAMESPACE_INIT, "sandbox-init", str(scratch_bytes), str(uid)),
        *(WORK_DIR, *HOST_SCRATCH_DIRS, "--"),
        *hide,
        "--",
    ]
