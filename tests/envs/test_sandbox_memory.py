"""The sandbox's memory cap against what the review found: every process of a run
allocating what it can, a 10 GB allocation, and memory held without mapping it (SBX-A:
memfds, which RLIMIT_AS does not count; a memory cgroup per run does)."""

from __future__ import annotations

import os

import pytest

from atroposlib.envs import sandbox_cgroup
from atroposlib.envs.sandbox import run_python
from tests.support.sandbox import assert_machine_unharmed

pytestmark = pytest.mark.integration


def test_a_10_gb_allocation_fails_inside_the_sandbox(limits):
    result = run_python("block = bytearray(10 * 1024**3)\nprint('allocated')", limits)
    assert result.reason == "memory" and "allocated" not in result.stdout
    assert_machine_unharmed()


def test_the_memory_limit_holds_for_the_run_not_each_process(limits):
    """SBX-6: every process the run may have, each allocating what it can, stays under memory_mb."""
    source = (
        "import os\n"
        "children = 0\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n        children = -1\n        break\n"
        "    children += 1\n"
        "got = 0\n"
        "chunks = []\n"
        "try:\n    while True:\n        chunks.append(bytearray(8 << 20)); got += 8\n"
        "except MemoryError:\n    pass\n"
        "print(got, flush=True)\n"
        "for _ in range(max(children, 0)):  # the run ends when its first process does\n"
        "    os.wait()\n"
        "os._exit(0)\n"
    )
    result = run_python(source, limits)
    grabbed = [int(line) for line in result.stdout.split()]
    assert len(grabbed) == 4, result
    assert sum(grabbed) <= limits.memory_mb, grabbed
    assert_machine_unharmed()


def memfd_probe(count: int) -> str:
    """The review's SBX-A probe: `count` memfds of 15 MiB, written, never mapped."""
    return (
        "import os\n"
        "held, fds, chunk = 0, [], b'x' * (15 << 20)\n"
        "try:\n"
        f"    for n in range({count}):\n"
        "        fds.append(os.memfd_create(f'probe{n}'))\n"
        "        os.write(fds[-1], chunk)\n"
        "        held += 15\n"
        "        print(held, flush=True)\n"
        "except OSError as error:\n"
        "    print('refused', error, flush=True)\n"
    )


def held_mib(result) -> int:
    return max((int(word) for word in result.stdout.split() if word.isdigit()), default=0)


def test_memory_held_without_mapping_it_stays_under_the_cap(limits):
    """SBX-A: RLIMIT_AS counts mapped memory only, and the probe held 600 MiB of memfds
    under memory_mb=512. The run's memory cgroup counts every page it holds."""
    limits = limits.model_copy(update={"memory_mb": 512, "max_processes": 4})
    result = run_python(memfd_probe(40), limits)
    assert 0 < held_mib(result) <= 512, result
    assert result.reason == "memory" or "refused" in result.stdout, result
    assert own_run_cgroups() == []
    assert_machine_unharmed()


def test_without_a_cgroup_the_cap_counts_only_mapped_memory(limits):
    """What `memory_cgroup=False` states (docs/security.md): the address-space rlimit
    alone, which memory held unmapped passes."""
    limits = limits.model_copy(update={"memory_mb": 128, "max_processes": 0})
    result = run_python(memfd_probe(12), limits.model_copy(update={"memory_cgroup": False}))
    assert held_mib(result) == 180 > limits.memory_mb, result
    assert_machine_unharmed()


def own_run_cgroups() -> list[str]:
    """This process's sandbox cgroups still on disk (each run removes its own)."""
    mine = f"{sandbox_cgroup.NAME_PREFIX}{os.getpid()}-*"
    return [p.name for parent in sandbox_cgroup.parent_dirs() for p in parent.glob(mine)]
