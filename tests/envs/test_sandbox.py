"""The code sandbox against hostile snippets: each ends as a failed run, the machine unharmed.

"Unharmed" is checked, not assumed: no process of the sandbox's user is left behind,
no file appears outside the run's private dir, a listening server receives nothing,
and this process can still fork and allocate afterwards. The network and
outside-write tests need bubblewrap (scripts/test.sh installs it); without it they
skip with the reason, since the OS then offers no such isolation to an unprivileged run.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from atroposlib.envs.sandbox import SandboxLimits, isolation, run_python, run_python_async
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

LIMITS = SandboxLimits(wall_time_s=6, cpu_time_s=2, memory_mb=256, max_processes=8)
needs_bubblewrap = pytest.mark.skipif(
    not isolation().bubblewrap, reason="bubblewrap is not usable here (apt install bubblewrap)"
)


def _leftover_processes() -> list[int]:
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
    wait_until(lambda: not _leftover_processes(), 15, "sandbox processes to end")
    assert subprocess.run(["true"]).returncode == 0  # this process can still fork
    assert len(bytearray(64 << 20)) == 64 << 20  # ...and allocate


def test_a_plain_program_runs_and_reads_stdin():
    result = run_python("import sys\nprint(sys.stdin.read().upper(), 6 * 7)", LIMITS, "abc")
    assert (result.ok, result.reason, result.stdout) == (True, "ok", "ABC 42\n")


# The rlimit layers hold with and without bubblewrap.
both_modes = pytest.mark.parametrize("mode", ["auto", "off"])


@both_modes
def test_an_infinite_loop_is_stopped_by_the_cpu_limit(mode):
    result = run_python("while True:\n    pass", LIMITS.model_copy(update={"bubblewrap": mode}))
    assert not result.ok and result.reason == "cpu_time"
    assert result.duration_s < LIMITS.wall_time_s
    assert_machine_unharmed()


def test_a_sleeping_program_is_killed_at_the_wall_clock_deadline():
    limits = LIMITS.model_copy(update={"wall_time_s": 1.5})
    source = "import os, time\nfor _ in range(3):\n    os.fork()\ntime.sleep(600)"
    result = run_python(source, limits)
    assert result.timed_out and result.reason == "wall_time" and result.exit_code is None
    assert result.duration_s < 10
    assert_machine_unharmed()


@both_modes
def test_a_fork_bomb_hits_the_process_limit(mode):
    source = "import os\nwhile True:\n    os.fork()"
    result = run_python(source, LIMITS.model_copy(update={"bubblewrap": mode}))
    assert not result.ok
    assert "Resource temporarily unavailable" in result.stderr or result.timed_out
    assert_machine_unharmed()


@both_modes
def test_a_10_gb_allocation_fails_inside_the_sandbox(mode):
    source = "block = bytearray(10 * 1024**3)\nprint('allocated')"
    result = run_python(source, LIMITS.model_copy(update={"bubblewrap": mode}))
    assert result.reason == "memory" and "allocated" not in result.stdout
    assert_machine_unharmed()


def test_endless_output_is_cut_off_without_filling_memory():
    limits = LIMITS.model_copy(update={"max_file_mb": 1, "max_output_chars": 1000})
    result = run_python("while True:\n    print('x' * 1000)", limits)
    assert not result.ok and len(result.stdout) == 1000
    assert "File too large" in result.stderr or result.reason == "file_size"


def test_the_environment_is_scrubbed_and_the_work_dir_private(monkeypatch):
    monkeypatch.setenv("ATROPOS_TEST_SECRET", "hunter2")
    source = (
        "import os, json\n"
        "open('note.txt', 'w').write('left behind')\n"
        "print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(),"
        " 'files': sorted(os.listdir('.'))}))"
    )
    first = run_python(source, LIMITS)
    second = run_python(source, LIMITS)
    assert first.ok, first.stderr
    seen = __import__("json").loads(first.stdout)
    assert "ATROPOS_TEST_SECRET" not in seen["env"] and "hunter2" not in first.stdout
    assert set(seen["env"]) <= {"PATH", "LANG", "HOME", "TMPDIR", "PWD"} | {
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
    }
    assert seen["env"]["HOME"] == seen["env"]["TMPDIR"] == seen["cwd"]
    # each run starts in an empty dir of its own; the first run's file is gone
    assert __import__("json").loads(second.stdout)["files"] == ["note.txt"]
    assert not Path(seen["cwd"], "note.txt").exists() or isolation().bubblewrap


@needs_bubblewrap
def test_a_write_outside_the_work_dir_is_refused(tmp_path):
    target_dir = tmp_path / "open-to-all"
    target_dir.mkdir()
    target_dir.chmod(0o777)  # even a world-writable host dir stays out of reach
    targets = [target_dir / "pwned.txt", Path(__file__).with_name("pwned.txt")]
    source = "\n".join(
        f"try:\n    open({str(t)!r}, 'w').write('x')\n    print('wrote {t.name}')\n"
        "except OSError as error:\n    print('refused', error.errno)"
        for t in targets
    )
    result = run_python(source, LIMITS)
    assert result.ok and "wrote" not in result.stdout and result.stdout.count("refused") == 2
    assert not any(t.exists() for t in targets)
    assert_machine_unharmed()


@needs_bubblewrap
def test_a_network_call_reaches_nothing():
    received: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        listener.settimeout(8)
        try:
            connection, _ = listener.accept()
            received.append(connection.recv(100))
        except OSError:
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    source = (
        "import socket\n"
        f"connection = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "connection.sendall(b'stolen secrets')\nprint('sent')"
    )
    result = run_python(source, LIMITS)
    thread.join(10)
    listener.close()
    assert not result.ok and "sent" not in result.stdout
    assert received == []


def test_runs_in_parallel_from_asyncio():
    async def many() -> list:
        sources = [f"print({i} * {i})" for i in range(4)]
        return await asyncio.gather(*(run_python_async(s, LIMITS) for s in sources))

    results = asyncio.run(many())
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(4)], results


@pytest.mark.skipif(os.geteuid() != 0, reason="separate users per run need a root parent")
def test_a_fork_bomb_does_not_starve_concurrent_runs():
    bomb = (
        "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
        "        time.sleep(0.01)"
    )
    neighbour = "import subprocess, time\ntime.sleep(1)\nprint(subprocess.run(['true']).returncode)"

    async def together() -> list:
        limits = LIMITS.model_copy(update={"wall_time_s": 4})
        runs = [run_python_async(bomb, limits)]
        runs += [run_python_async(neighbour, LIMITS) for _ in range(3)]
        return await asyncio.gather(*runs)

    bombed, *neighbours = asyncio.run(together())
    assert not bombed.ok
    assert [n.stdout for n in neighbours] == ["0\n"] * 3, neighbours
    assert_machine_unharmed()
