"""Running a library environment (environments/<name>.py) in tests: flags and outputs.

Tests that run the real script as a subprocess (`run_env`), against the tiny model,
share the same handful of flags; this module holds them so each test states only what
differs. The in-process runs of the env table are in env_table.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.support.compat_runs import failure, read_jsonl, run_env
from tests.support.source import REPO

LIBRARY = REPO / "environments"


def env_scripts() -> list[Path]:
    """Scripts that end in `<Env>.cli()`: the runnable environments."""
    return sorted(
        path
        for path in LIBRARY.glob("*.py")
        if re.search(r"^\s+\w+\.cli\(\)", path.read_text(), re.MULTILINE)
    )


def process_groups(
    script: str,
    workdir: Path,
    tokenizer: Path,
    server_flags: list[str],
    *extra: str,
    group_size: int = 4,
    steps: int = 2,
) -> list[dict[str, Any]]:
    """`python environments/<script> process ...`: the groups it wrote (jsonl + html)."""
    out = workdir / "groups.jsonl"
    done = run_env(
        str(LIBRARY / script),
        "process",
        workdir,
        *("--env.tokenizer_name", str(tokenizer), "--env.use_wandb", "false"),
        *("--env.group_size", str(group_size), "--env.total_steps", str(steps)),
        *("--env.data_path_to_save_groups", str(out)),
        *server_flags,
        *extra,
    )
    assert done.returncode == 0, failure(done)
    assert out.with_suffix(".html").is_file()
    groups = read_jsonl(out)
    for group in groups:
        assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == group_size
    return groups
