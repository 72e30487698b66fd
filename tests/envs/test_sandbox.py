"""The code sandbox against hostile snippets: each ends as a failed run, the machine unharmed.

"Unharmed" is checked, not assumed: no process of the sandbox's users is left behind,
no file appears outside the run, a listening server receives nothing, and this process
can still fork and allocate afterwards. Every attack runs in both modes: `bubblewrap`
(the default) and `namespaces` (the opt-in for hosts without bubblewrap; it needs a
root parent). scripts/test.sh installs bubblewrap and CI runs as root, so CI runs both;
elsewhere a mode that cannot run here skips with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from atroposlib.envs import sandbox as sandbox_module
from atroposlib.envs import sandbox_isolation
from atroposlib.envs.sandbox import (
    SandboxLimits,
    SandboxUnavailable,
    run_python,
    run_python_async,
)
from tests.support.sandbox import (
    LIMITS,
    assert_machine_unharmed,
    root_only,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def test_a_plain_program_runs_and_reads_stdin(limits):
    result = run_python("import sys\nprint(sys.stdin.read().upper(), 6 * 7)", limits, "abc")
    assert (result.ok, result.reason, result.stdout) == (True, "ok", "ABC 42\n")


def test_an_infinite_loop_is_stopped_by_the_cpu_limit(limits):
    # a wall-clock limit far past the CPU limit: on a busy machine the loop gets a share
    # of a core, and 2 s of CPU took over 6 s of wall time beside the suite's heaviest runs
    result = run_python("while True:\n    pass", limits.model_copy(update={"wall_time_s": 60}))
    assert not result.ok and result.reason == "cpu_time"
    assert result.duration_s < 60
    assert_machine_unharmed()


def test_a_sleeping_program_is_killed_at_the_wall_clock_deadline(limits):
    limits = limits.model_copy(update={"wall_time_s": 1.5})
    source = "import os, time\nfor _ in range(2):\n    os.fork()\ntime.sleep(600)"
    result = run_python(source, limits)
    assert result.timed_out and result.reason == "wall_time" and result.exit_code is None
    assert result.duration_s < 10
    assert_machine_unharmed()


def test_a_fork_bomb_hits_the_process_limit(limits):
    result = run_python("import os\nwhile True:\n    os.fork()", limits)
    assert not result.ok
    assert "Resource temporarily unavailable" in result.stderr or result.timed_out
    assert_machine_unharmed()


def test_endless_output_is_cut_off_without_filling_memory(limits):
    limits = limits.model_copy(update={"max_file_mb": 1, "max_output_chars": 1000})
    result = run_python("while True:\n    print('x' * 1000)", limits)
    assert not result.ok and len(result.stdout) == 1000
    assert "File too large" in result.stderr or result.reason == "file_size"


def test_the_environment_is_scrubbed_and_the_work_dir_private(limits, monkeypatch):
    monkeypatch.setenv("ATROPOS_TEST_SECRET", "hunter2")
    source = (
        "import os, json\n"
        "open('note.txt', 'w').write('left behind')\n"
        "print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(),"
        " 'files': sorted(os.listdir('.'))}))"
    )
    first = run_python(source, limits)
    second = run_python(source, limits)
    assert first.ok, first.stderr
    seen = json.loads(first.stdout)
    assert "ATROPOS_TEST_SECRET" not in seen["env"] and "hunter2" not in first.stdout
    assert set(seen["env"]) <= {"PATH", "LANG", "HOME", "TMPDIR", "PWD"} | {
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
    }
    assert seen["env"]["HOME"] == seen["env"]["TMPDIR"] == seen["cwd"]
    # each run starts in an empty dir of its own; the first run's file is gone
    assert json.loads(second.stdout)["files"] == ["note.txt"]
    assert not Path(seen["cwd"], "note.txt").exists()


def test_a_write_outside_the_run_is_refused_and_scratch_is_capped_and_cleaned(limits, tmp_path):
    """SBX-7: /tmp, /var/tmp and /dev/shm are the run's own, size-capped, and gone after it."""
    target_dir = tmp_path / "open-to-all"
    target_dir.mkdir()
    target_dir.chmod(0o777)  # even a world-writable host dir stays out of reach
    targets = [target_dir / "pwned.txt", Path(__file__).with_name("pwned.txt")]
    marker = f"atropos-sandbox-test-{os.getpid()}"
    source = "\n".join(
        f"try:\n    open({str(t)!r}, 'w').write('x')\n    print('wrote {t.name}')\n"
        "except OSError as error:\n    print('refused', error.errno)"
        for t in targets
    )
    source += (
        "\nfor scratch in ('/dev/shm', '/tmp', '/var/tmp'):\n"
        f"    path = scratch + '/{marker}'\n"
        "    try:\n        with open(path, 'wb') as f:\n"
        "            for _ in range(64):\n                f.write(bytes(1 << 20))\n"
        "        print('filled', scratch)\n"
        "    except OSError as error:\n        print('capped', scratch, error.errno)\n"
    )
    limits = limits.model_copy(update={"max_file_mb": 8, "memory_mb": 512})
    result = run_python(source, limits)
    assert "wrote" not in result.stdout and result.stdout.count("refused") == 2, result
    assert result.stdout.count("capped") == 3 and "filled" not in result.stdout, result
    assert not any(t.exists() for t in targets)
    assert not any(Path(d, marker).exists() for d in ("/dev/shm", "/tmp", "/var/tmp"))
    assert_machine_unharmed()


def test_nothing_written_outside_the_run_reaches_the_host_or_the_next_run(limits):
    """SBX-D of the security review: in `namespaces` mode a world-writable host dir
    outside the scratch dirs (the review's was under /srv) kept what a run wrote, and the
    next run read it. The host's root file system is read-only to a run now."""
    import shutil
    import tempfile

    if not os.access("/srv", os.W_OK):
        pytest.skip("needs a writable /srv: a host dir outside every scratch dir")
    shared = tempfile.mkdtemp(prefix="atropos-sbx-d-", dir="/srv")
    try:
        os.chmod(shared, 0o1777)
        write = (
            "import os\n"
            "try:\n"
            f"    open(os.path.join({shared!r}, 'left'), 'w').write('from a past run')\n"
            "    print('wrote')\n"
            "except OSError as exc:\n"
            "    print('refused', exc.errno)\n"
        )
        result = run_python(write, limits)
        assert result.ok and result.stdout.startswith("refused"), result
        assert os.listdir(shared) == []
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_network_call_reaches_nothing(limits):
    """SBX-4: a loopback listener (run-api, an engine) is out of reach."""
    received: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                connection, _ = listener.accept()
                received.append(connection.recv(100))
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    source = (
        "import socket\n"
        f"connection = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "connection.sendall(b'stolen secrets')\nprint('sent')"
    )
    result = run_python(source, limits)
    done.set()
    thread.join(10)
    listener.close()
    assert not result.ok and "sent" not in result.stdout
    assert received == []


def test_other_processes_and_the_parents_secrets_are_invisible(limits, monkeypatch):
    """SBX-4, SBX-5: /proc shows only the run, so no command line or environment leaks."""
    monkeypatch.setenv("ATROPOS_API_KEY", "parent-secret-key")
    source = (
        "import os\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "seen = ''\n"
        "for pid in pids:\n"
        "    for name in ('cmdline', 'environ'):\n"
        "        try:\n"
        "            seen += open(f'/proc/{pid}/{name}', 'rb').read().decode('latin-1')\n"
        "        except OSError:\n            pass\n"
        "print(len(pids), 'parent-secret-key' in seen, str(os.getppid()))\n"
    )
    result = run_python(source, limits)
    count, leaked, _ = result.stdout.split()
    assert result.ok and leaked == "False", result
    assert int(count) <= 4  # the run's own few processes, not the host's


def test_a_daemon_that_leaves_the_session_dies_with_the_run(limits, tmp_path):
    """SBX-3: fork + setsid + fork used to outlive the run and pile up across runs."""
    source = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\nprint('parent done')\n"
    )
    for _ in range(3):
        result = run_python(source, limits)
        assert result.ok and result.stdout == "parent done\n", result
        if os.geteuid() == 0:
            assert_machine_unharmed()  # no process of a sandbox user is left


def test_the_run_dies_with_a_killed_parent(limits, tmp_path):
    """SBX-C of the security review: in `namespaces` mode a SIGKILLed environment left
    its sandboxed code running (nothing killed `unshare`), and a sleeping program lived
    on for ever. Every process of the run now dies with the parent, in both modes."""
    import signal
    import sys

    from atroposlib.utils.processes import alive, descendants

    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from atroposlib.envs.sandbox import SandboxLimits, run_python\n"
            f"run_python('import time\\ntime.sleep(120)', SandboxLimits("
            f"isolation={limits.isolation!r}, wall_time_s=110, cpu_time_s=2))",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(sandbox_module.__file__).parents[2])},
    )

    def sandboxed_interpreter() -> bool:  # `python -I -S /dev/fd/N`, not a wrapper naming it
        for pid in descendants(parent.pid):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-I", b"-S"]:
                    return True
        return False

    run: set[int] = set()
    try:
        wait_until(sandboxed_interpreter, 60, "the sandboxed program to start")
        run = descendants(parent.pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_until(lambda: not any(alive(pid) for pid in run), 15, "the run to die with its parent")
    finally:
        parent.kill()
        parent.wait()
        for pid in run:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_runs_group_is_killed_before_its_leader_is_reaped(limits, monkeypatch):
    """SBX-F of the security review: the group was SIGKILLed after `wait()` reaped its
    leader, when the pid could already name another process. It is killed while the
    leader is still ours (alive or a zombie) now, on every way a run ends."""
    seen: list[bool] = []
    real = sandbox_module._kill_group

    def kill_group(pgid: int) -> None:
        seen.append(os.path.exists(f"/proc/{pgid}"))
        real(pgid)

    monkeypatch.setattr(sandbox_module, "_kill_group", kill_group)
    done = run_python("print(1)", limits)
    timed = run_python("import time\ntime.sleep(30)", limits.model_copy(update={"wall_time_s": 1}))
    assert done.ok and timed.timed_out, (done, timed)
    assert len(seen) == 2 and all(seen), seen


def test_a_work_dir_thousands_deep_does_not_break_the_caller(limits):
    """SBX-8: cleaning up used to raise RecursionError out of run_python."""
    source = "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')"
    result = run_python(source, limits.model_copy(update={"wall_time_s": 20, "cpu_time_s": 10}))
    assert result.ok and result.stdout == "deep\n", result


def test_runs_in_parallel_from_asyncio(limits):
    async def many() -> list:
        sources = [f"print({i} * {i})" for i in range(4)]
        return await asyncio.gather(*(run_python_async(s, limits) for s in sources))

    results = asyncio.run(many())
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(4)], results


@root_only
def test_a_fork_bomb_does_not_starve_concurrent_runs(limits):
    bomb = (
        "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
        "        time.sleep(0.01)"
    )
    neighbour = (  # starts a process of its own: the interpreter (no host command is there)
        "import subprocess, sys, time\ntime.sleep(1)\n"
        "print(subprocess.run([sys.executable, '-S', '-c', 'pass']).returncode)"
    )

    async def together() -> list:
        runs = [run_python_async(bomb, limits.model_copy(update={"wall_time_s": 4}))]
        runs += [run_python_async(neighbour, limits) for _ in range(3)]
        return await asyncio.gather(*runs)

    bombed, *neighbours = asyncio.run(together())
    assert not bombed.ok
    assert [n.stdout for n in neighbours] == ["0\n"] * 3, neighbours
    assert_machine_unharmed()


@root_only
def test_a_uid_that_owns_a_process_is_not_handed_out():
    """SBX-3: the pool skips a uid with a live process and hands uids out first in, first out."""
    users = sandbox_isolation.RunUsers()
    with users.take() as (first, charged):
        assert charged == 0
    squatter = subprocess.Popen(["sleep", "30"], user=first, group=first)
    try:
        taken = []
        for _ in range(3):
            with users.take() as (uid, _):
                taken.append(uid)
        assert first not in taken and len(set(taken)) == 3
    finally:
        squatter.kill()
        squatter.wait()


def test_a_mode_that_cannot_run_refuses_instead_of_falling_back(monkeypatch):
    """SBX-4: without bubblewrap the default mode raises; nothing runs with less isolation."""
    sandbox_module._mode_works.cache_clear()
    monkeypatch.setattr(sandbox_isolation, "bubblewrap_path", lambda: None)
    try:
        with pytest.raises(SandboxUnavailable, match="bubblewrap is not installed"):
            run_python("print('ran')", LIMITS)
    finally:
        sandbox_module._mode_works.cache_clear()


def test_bubblewrap_is_run_by_the_path_the_probe_found():
    """SBX-9: runs get a scrubbed PATH, so the command names bwrap by its absolute path."""
    found = sandbox_isolation.bubblewrap_path()
    if found is None:
        pytest.skip("bubblewrap is not installed")
    command = sandbox_isolation.bubblewrap_command(1 << 20)
    assert command[0] == found and os.path.isabs(found)
    binds = [command[i + 1] for i, arg in enumerate(command) if arg == "--ro-bind"]
    interpreter = os.path.realpath(sandbox_isolation.interpreter())
    allowed = {
        *sandbox_isolation.LIBRARY_DIRS,
        *sandbox_isolation.ETC_FILES,
        interpreter,
        str(Path(interpreter).parents[1]),
    }
    assert "/" not in binds and "/usr" not in binds and "/etc" not in binds
    assert set(binds) <= allowed, set(binds) - allowed


def test_a_bubblewrap_run_sees_the_interpreter_and_its_libraries_only():
    """SBX-E: all of /usr and /etc were visible, and with them whatever a machine keeps
    in /usr/local, /usr/src or /etc (a pip.conf with an index token, the machine id)."""
    problem = sandbox_module._mode_works("bubblewrap")
    if problem is not None:
        pytest.skip(f"the bubblewrap sandbox cannot run here: {problem}")
    source = (
        "import json, os, sqlite3, ssl, decimal, ctypes\n"  # the standard library still loads
        "listing = lambda d: sorted(os.listdir(d)) if os.path.isdir(d) else []\n"
        "print(json.dumps({d: listing(d) for d in ('/', '/etc', '/usr')}))\n"
    )
    result = run_python(source, LIMITS)
    assert result.ok, result
    seen = json.loads(result.stdout)
    assert set(seen["/etc"]) <= {"ld.so.cache", "localtime"}, seen["/etc"]
    prefix = Path(os.path.realpath(sandbox_isolation.interpreter())).parents[1]
    kept = set(prefix.relative_to("/usr").parts[:1]) if prefix.is_relative_to("/usr") else set()
    assert not ({"local", "src", "share", "sbin", "games", "include"} - kept) & set(seen["/usr"])
    assert not {"home", "root", "srv", "opt", "mnt", "sbin"} & set(seen["/"]), seen["/"]


def test_limits_that_leave_a_process_too_little_memory_are_refused():
    with pytest.raises(ValueError, match="raise memory_mb or lower max_processes"):
        SandboxLimits(memory_mb=128, max_processes=16)


def test_without_root_the_namespaces_mode_refuses(monkeypatch):
    """SBX-5: a non-root parent ran code as itself, which could read the parent's
    environment; such a parent now has bubblewrap or nothing."""
    sandbox_module._mode_works.cache_clear()
    monkeypatch.setattr(sandbox_isolation, "drops_identity", lambda: False)
    try:
        with pytest.raises(SandboxUnavailable, match="needs a root parent"):
            run_python("print('ran')", LIMITS.model_copy(update={"isolation": "namespaces"}))
    finally:
        sandbox_module._mode_works.cache_clear()
