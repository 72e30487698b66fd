"""Which cgroup a sandboxed run gets, read off a cgroup tree laid out in a temporary dir.

The real kernel's side (the cap holds against the review's memfd probe, nothing is
left behind) is test_sandbox.py's; here each layout a machine may have, in-process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from atroposlib.envs.sandbox_cgroup import make_run_cgroup, parent_dirs
from atroposlib.envs.sandbox_isolation import SandboxUnavailable

MIB_512 = str(512 << 20)


def machine(tmp_path: Path, cgroups: str, dirs: dict[str, str] | None = None) -> tuple[Path, Path]:
    """A cgroup mount under tmp_path/cg, `cgroups` as /proc/self/cgroup, and `dirs`:
    relative path -> cgroup.subtree_control (v2) or "" (a plain directory)."""
    root = tmp_path / "cg"
    for relative, subtree in (dirs or {}).items():
        (root / relative).mkdir(parents=True, exist_ok=True)
        if subtree:
            (root / relative / "cgroup.subtree_control").write_text(subtree)
    self_cgroup = tmp_path / "self-cgroup"
    self_cgroup.write_text(cgroups)
    return root, self_cgroup


def test_cgroup_v1_caps_memory_with_swap_and_tasks_under_the_processs_own_cgroups(tmp_path):
    root, own = machine(
        tmp_path,
        "8:pids:/\n4:memory:/process_api/abc\n0::/\n",
        {"unified": "\n", "memory/process_api/abc": "", "pids": ""},
    )
    cgroup = make_run_cgroup(512, 7, root, own)
    memory, pids = cgroup.dirs
    assert cgroup.version == 1
    assert memory.parent == root / "memory" / "process_api" / "abc"
    assert (memory / "memory.limit_in_bytes").read_text() == MIB_512
    assert pids.parent == root / "pids" and (pids / "pids.max").read_text() == "7"
    assert memory.name == pids.name and memory.name.startswith("atropos-sandbox-")
    assert parent_dirs(root, own) == [root / "unified", memory.parent, pids.parent]


def test_cgroup_v2_is_taken_where_the_memory_controller_is_delegated(tmp_path):
    root, own = machine(tmp_path, "0::/user.slice/app\n", {"user.slice/app": "memory pids"})
    (root / "cgroup.controllers").write_text("memory pids")
    cgroup = make_run_cgroup(512, 7, root, own)
    [directory] = cgroup.dirs
    assert cgroup.version == 2 and directory.parent == root / "user.slice" / "app"
    assert (directory / "memory.max").read_text() == MIB_512
    assert (directory / "memory.swap.max").read_text() == "0"
    assert (directory / "pids.max").read_text() == "7"


def test_no_cgroup_to_make_is_refused_saying_why_and_what_to_do(tmp_path):
    """A v2 cgroup that delegates no memory controller, and no v1 memory hierarchy (a
    container's usual lot): no run, rather than a cap that does not hold."""
    root, own = machine(tmp_path, "0::/\n", {"": "cpu io"})
    (root / "cgroup.controllers").write_text("cpu io memory")
    with pytest.raises(SandboxUnavailable) as refused:
        make_run_cgroup(512, 7, root, own)
    said = str(refused.value)
    assert "does not delegate the memory controller" in said
    assert "no memory controller is mounted" in said
    assert "memory_cgroup=False" in said and "memfd" in said


@pytest.mark.parametrize(
    ("version", "files", "exceeded"),
    [
        (2, {"memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"}, True),
        (2, {"memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"}, False),
        (1, {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"}, True),
        (1, {"memory.oom_control": "oom_kill 0\n", "memory.failcnt": "0\n"}, False),
        (1, {"memory.oom_control": "oom_kill_disable 0\n", "memory.failcnt": "5\n"}, True),
    ],
)
def test_a_run_that_hit_its_limit_is_told_from_one_that_did_not(tmp_path, version, files, exceeded):
    root, own = machine(tmp_path, "4:memory:/\n0::/\n", {"memory": "", "unified": ""})
    if version == 2:
        (root / "unified" / "cgroup.subtree_control").write_text("memory")
    cgroup = make_run_cgroup(512, 7, root, own)
    assert cgroup.version == version
    for name, text in files.items():
        (cgroup.dirs[0] / name).write_text(text)
    assert cgroup.memory_exceeded() is exceeded


def test_a_killed_processs_leftover_neither_blocks_nor_stays(tmp_path):
    """A parent SIGKILLed mid-run leaves its cgroup; a later process with the same pid
    met it and every run was refused (File exists). Names are now unique, and an empty
    leftover of a process that is gone is removed."""
    import os

    root, own = machine(tmp_path, "0::/app\n", {"app": "memory pids"})
    (root / "cgroup.controllers").write_text("memory pids")
    parent = root / "app"
    gone = parent / f"atropos-sandbox-{2**22 + 7}-0-0000"  # above pid_max: no such process
    mine = parent / f"atropos-sandbox-{os.getpid()}-0"  # this pid's old name scheme
    busy = parent / "atropos-sandbox-unrelated"
    for directory in (gone, mine, busy):
        directory.mkdir()
    [made] = make_run_cgroup(512, 7, root, own).dirs
    assert made.parent == parent and made not in (gone, mine)
    assert not gone.exists() and mine.exists() and busy.exists()
