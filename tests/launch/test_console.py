"""What the launcher's console shows of a child's lines (the log file keeps them whole)."""

from __future__ import annotations

from pathlib import Path

from atroposlib.launch.console import console_text, key_line
from atroposlib.launch.supervisor import SAID


def test_an_info_record_shows_its_message_and_debug_stays_in_the_log_file():
    step = "step 12: accuracy 0.320, 143.9 groups/min, 0 failed"
    assert console_text(f"09:06:20 INFO atroposlib.envs: {step}") == step
    warning = "09:06:16 WARNING atroposlib.inference: server http://127.0.0.1:1/v1 unreachable"
    assert (
        console_text(warning)
        == "WARNING atroposlib.inference: server http://127.0.0.1:1/v1 unreachable"
    )
    assert console_text('09:06:20 DEBUG atroposlib.envs.metrics: step 3 metrics: {"a": 1}') is None
    for other in ("Traceback (most recent call last):", "", "starting engine: (not really)"):
        assert console_text(other) == other
    assert console_text("INFO: 127.0.0.1 - GET /health") == "INFO: 127.0.0.1 - GET /health"


def test_the_key_line_names_the_key_file_from_the_working_directory_in_80_columns():
    project = Path("/home/someone/projects/atropos")
    key = project / "runs/quickstart_cpu-20261127-120000/api-key"
    line = key_line(key, cwd=project)
    assert line == "ATROPOS_API_KEY is in runs/quickstart_cpu-20261127-120000/api-key"
    assert len(SAID + line) <= 80
    elsewhere = Path("/scratch/runs/quickstart_cpu-20261127-120000/api-key")
    assert key_line(elsewhere, cwd=project) == f"ATROPOS_API_KEY is in {elsewhere}"
