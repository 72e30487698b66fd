"""What the launcher's console shows of a child's lines (the log file keeps them whole)."""

from __future__ import annotations

from atroposlib.launch.console import console_text


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
