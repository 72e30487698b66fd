"""What the serve runtime says of a failed evaluation and of the items it saves at a
stop: what a person must see in a short line, the whole of it in the log file."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from atroposlib.envs.runtime import STATE_LOGGER, EnvRuntime
from atroposlib.utils.logging import MESSAGE_WIDTH

REFUSAL = "max_tokens 1024 + prompt 342 tokens exceeds the maximum context length 512"


def served_env(evaluate=None) -> SimpleNamespace:
    """What the runtime's evaluation and shutdown touch of an env."""
    config = SimpleNamespace(max_tokens=1024, max_token_length=2048)
    return SimpleNamespace(
        name="gsm8k", config=config, stats=Counter(), curr_step=0, backlog=[], evaluate=evaluate
    )


def evaluations(env: SimpleNamespace, runtime: EnvRuntime, steps: list[int]) -> None:
    for step in steps:
        env.curr_step = step
        asyncio.run(runtime._guarded_evaluate())


def test_a_refused_evaluation_is_one_line_and_later_ones_are_counted(caplog, tmp_path):
    async def refused():
        raise RuntimeError(REFUSAL)

    env = served_env(refused)
    with caplog.at_level(logging.DEBUG, logger="atroposlib.envs"):
        evaluations(env, EnvRuntime(env, state_dir=tmp_path), [10, 20, 30])
    shown = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [(r.exc_info, r.getMessage()) for r in shown] == [
        (
            None,
            "gsm8k evaluation: a prompt of 342 tokens plus max_tokens 1024 does not fit the "
            "model's context of 512 tokens; lower --env.max_tokens to 170 or less, or use a "
            "model with a longer context; later refusals are counted (eval_context_refusals), "
            "not logged",
        )
    ]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG] == [
        f"evaluate() at step {step} refused: {REFUSAL}" for step in (20, 30)
    ]
    assert env.stats == Counter(eval_errors=3, eval_context_refusals=3)


def test_a_failing_evaluation_has_its_traceback_once_per_error(caplog, tmp_path):
    async def failing():
        if env.curr_step % 20:
            raise KeyError("accuracy")
        raise ValueError("no eval items")

    env = served_env(failing)
    with caplog.at_level(logging.INFO, logger="atroposlib.envs"):
        evaluations(env, EnvRuntime(env, state_dir=tmp_path), [10, 20, 30, 40, 50])
    assert [(r.getMessage(), type(r.exc_info[1])) for r in caplog.records] == [
        ("evaluate() at step 10 failed", KeyError),
        ("evaluate() at step 20 failed", ValueError),
    ]
    assert env.stats == Counter(eval_errors=5)


def test_saved_items_are_a_short_line_and_their_whole_path_is_in_the_log_file(caplog, tmp_path):
    """A launcher's state dir is under its run dir, wherever that is: the console line
    fits beside the launcher's prefix, the DEBUG line names the whole path."""
    state_dir = tmp_path / "runs" / "quickstart_cpu-20261127-120000" / "env-state" / "gsm8k"
    env = served_env()
    runtime = EnvRuntime(env, state_dir=state_dir / "gsm8k")
    runtime.backlog.extend([{"n": n} for n in range(4)])
    with caplog.at_level(logging.DEBUG, logger="atroposlib.envs"):
        asyncio.run(runtime._shutdown())
    saved = state_dir / "gsm8k" / "backlog.json"
    assert saved.is_file()
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert line == "4 unfinished items saved to .../gsm8k/gsm8k/backlog.json"
    assert len(line) <= MESSAGE_WIDTH
    (whole,) = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert whole.name == STATE_LOGGER
    assert whole.getMessage() == f"4 unfinished items saved to {saved}"


def test_saved_items_under_the_working_directory_are_named_from_it(caplog, tmp_path, monkeypatch):
    """`serve` by hand keeps its state in ./.atropos-env: the line names it whole."""
    monkeypatch.chdir(tmp_path)
    for state_dir in (Path(".atropos-env/gsm8k"), tmp_path / ".atropos-env" / "gsm8k"):
        caplog.clear()
        runtime = EnvRuntime(served_env(), state_dir=state_dir)
        runtime.backlog.append({"n": 1})
        with caplog.at_level(logging.DEBUG, logger="atroposlib.envs"):
            asyncio.run(runtime._shutdown())
        assert [r.getMessage() for r in caplog.records] == [
            "1 unfinished items saved to .atropos-env/gsm8k/backlog.json"
        ]


def test_a_baseline_is_due_where_the_run_holds_no_evaluation_yet(tmp_path):
    """eval_at_start's rule past step 0: a fork starts at its parent's step with a history
    of its own, so it gets a baseline there; a run resumed after its baseline does not."""
    from atroposlib.envs.eval import append_eval_history
    from atroposlib.envs.runtime import evaluated_before

    config = SimpleNamespace(data_dir_to_save_evals=str(tmp_path / "evals"))
    assert not evaluated_before(config)
    assert not evaluated_before(SimpleNamespace(data_dir_to_save_evals=None))
    append_eval_history(config.data_dir_to_save_evals, 50, "task", {"eval/accuracy": 0.5})
    assert evaluated_before(config)
