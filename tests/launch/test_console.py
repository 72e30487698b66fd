"""What the launcher's console shows of a child's lines (the log file keeps them whole)."""

from __future__ import annotations

import logging
from pathlib import Path

from atroposlib.launch.console import ChildConsole, console_text, key_line
from atroposlib.launch.supervisor import SAID
from atroposlib.utils.logging import TEXT_FORMAT, TIME_FORMAT, short_path


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


def formatted(level: int, message: str, error: BaseException | None = None) -> list[str]:
    """A record as a child writes it in the services' text format, line by line."""
    exc_info = None if error is None else (type(error), error, error.__traceback__)
    record = logging.LogRecord("atroposlib.envs", level, __file__, 1, message, None, exc_info)
    return logging.Formatter(TEXT_FORMAT, TIME_FORMAT).format(record).splitlines()


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


def test_a_records_traceback_is_shown_or_kept_with_the_record():
    """A DEBUG record's traceback stays in the log file with it; an ERROR's shows."""
    debug = formatted(logging.DEBUG, "rollout failed again", raised(KeyError("answer")))
    error = formatted(logging.ERROR, "rollout of item 3 failed", raised(ValueError("bad row")))
    info = formatted(logging.INFO, "step 3: accuracy 0.250\nsecond line")
    assert len(debug) > 3 and debug[1] == "Traceback (most recent call last):"
    console = ChildConsole()
    tool_output = "Loading checkpoint shards: 100%"
    lines = [tool_output, *debug, *error, *debug, *info]
    shown = [text for text in map(console.shown, lines) if text is not None]
    assert shown == [
        tool_output,
        "ERROR atroposlib.envs: rollout of item 3 failed",
        *error[1:],
        "step 3: accuracy 0.250",
        "second line",
    ]
    assert error[-1] == "ValueError: bad row"


def test_a_path_in_a_console_line_is_short():
    cwd = Path("/home/someone/atropos")
    run = cwd / "runs/quickstart_cpu-20261127-120000"
    assert short_path(run / "api-key", 60, cwd) == "runs/quickstart_cpu-20261127-120000/api-key"
    backlog = run / "env-state/arith/arith/backlog.json"
    assert short_path(backlog, 40, cwd) == ".../env-state/arith/arith/backlog.json"
    assert short_path(backlog, 37, cwd) == ".../arith/arith/backlog.json"
    assert short_path(Path("/scratch/x/backlog.json"), 40, cwd) == "/scratch/x/backlog.json"
    assert short_path(Path("/scratch/a-very-long-file-name.json"), 16, cwd) == "a-very-long-f..."
    assert short_path(Path(".atropos-env/gsm8k/backlog.json"), 40, cwd) == (
        ".atropos-env/gsm8k/backlog.json"
    )
