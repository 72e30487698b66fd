"""The multi-turn tool-use env: its tools, its tasks, and its rows of the env table (whole
episodes end to end: tests/environments/test_env_table.py).

A scripted model plays: the first reply to a task's question varies per request (right
plan, a wrong direct answer, a malformed call, a call loop), later replies follow from
the conversation so far, and the final answer is read from the last tool result in the
prompt, so every score is known exactly.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter

import pytest

from atroposlib.envs.server_handling.chat_prompt import render_prompt
from environments.tool_use_multiturn_server import (
    ToolUseMultiturnConfig,
    ToolUseMultiturnEnv,
    answer_right,
)
from environments.tool_use_multiturn_tools import (
    KINDS,
    TOOLS,
    ToolError,
    calculate,
    convert,
    execute,
    task_for,
)
from tests.support.env_table import EvaluateRow, ProcessRow, Run, ServeRow, scripted
from tests.support.scripted_model import last_turn, turns

pytest.importorskip("torch")

TASKS = {
    t["question"]: t
    for kinds in (KINDS, ("lookup",))
    for t in (task_for(seed, i, kinds) for seed in (0, 1_000_000) for i in range(100))
}
MALFORMED = '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'
LOOP = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
SCORES = [-0.2, -0.2, 0.0, 1.0]  # sorted: loop, malformed, wrong answer, right answer


def call_text(call: dict) -> str:
    return f"<think>next step</think><tool_call>{json.dumps(call)}</tool_call>"


def final_answer(prompt: str) -> str:
    result = re.search(r"<tool_response>\n(.*?)\n</tool_response>", last_turn(prompt), re.DOTALL)
    payload = json.loads(result.group(1))
    return f"The result is in.\n<answer>{payload.get('result', payload.get('value'))}</answer>"


class Policy:
    """First replies cycle through four behaviours per prompt; the rest follow the plan."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, prompt: str, n: int) -> list[str]:
        said = [text for role, text in turns(prompt) if role == "assistant"]
        question = next(text for role, text in turns(prompt) if role == "user")
        plan = TASKS[question]["plan"]
        if not said:
            with self.lock:
                variant = self.seen[prompt] % 4
                self.seen[prompt] += 1
            return [[call_text(plan[0]), "<answer>-1</answer>", MALFORMED, LOOP][variant]] * n
        if LOOP in said[-1]:
            return [LOOP] * n
        return [call_text(plan[len(said)]) if len(said) < len(plan) else final_answer(prompt)] * n


def test_calculator_parses_arithmetic_without_eval():
    assert calculate("2 + 3 * 4") == 14
    assert calculate("(2 + 3) * 4 - -1") == 21
    assert calculate("2 ** 3 ** 2") == 512 and calculate("2^10") == 1024
    assert calculate("7 / 2") == 3.5 and calculate("7 // 2") == 3 and calculate("7 % 4") == 3
    assert calculate("1,234 + 1") == 1235 and calculate(".5 * 4") == 2
    assert calculate("124500000 / 377975") == pytest.approx(329.387, abs=1e-3)
    for bad in (
        "__import__('os')",
        "2 +",
        "(1",
        "1 / 0",
        "2 ** 1000",
        "9" * 20 + " * 9" * 2,
        "",
        "1 2",
        "abs(1)",
        "x",
    ):
        with pytest.raises(ToolError):
            calculate(bad)
    assert json.loads(execute("calculator", {"expression": "(" * 150 + "1" + ")" * 49})[0])["error"]


def test_units_and_table_lookups():
    assert convert(1, "mi", "km") == pytest.approx(1.609344)
    assert convert(100, "C", "fahrenheit") == 212 and convert(32, "F", "c") == 0
    assert convert(2, "pounds", "kg") == pytest.approx(0.90718474)
    with pytest.raises(ToolError):
        convert(1, "kg", "m")
    with pytest.raises(ToolError):
        convert("1", "kg", "g")
    assert execute("country_info", {"country": "japan", "field": "capital"}) == (
        '{"value": "Tokyo"}',
        True,
    )
    assert json.loads(execute("country_info", {"country": "Atlantis", "field": "capital"})[0])
    assert execute("search", {})[1] is False
    assert [t["function"]["name"] for t in TOOLS] == ["calculator", "convert_units", "country_info"]


def test_every_generated_task_is_solved_by_its_plan():
    kinds = Counter()
    for index in range(200):
        task = task_for(7, index)
        kinds[task["kind"]] += 1
        assert task == task_for(7, index)  # reproducible
        results = [json.loads(execute(c["name"], c["arguments"])[0]) for c in task["plan"]]
        assert all("error" not in r for r in results)
        last = results[-1].get("result", results[-1].get("value"))
        assert answer_right(f"<answer>{last}</answer>", task), task
    assert set(kinds) == set(KINDS)
    assert task_for(0, 3, ("lookup",))["kind"] == "lookup"
    with pytest.raises(ValueError):
        ToolUseMultiturnConfig(task_kinds="lookup,poetry")


def test_final_answers_are_checked_strictly():
    numeric = {"answer": 329, "decimals": 0}
    assert answer_right("<answer>329</answer>", numeric)
    assert answer_right("<think>hmm</think>It is <answer>329.39</answer>", numeric)
    assert not answer_right("<answer>330</answer>", numeric)
    assert not answer_right("<think><answer>329</answer></think>I am not sure.", numeric)
    assert not answer_right("<answer>329 or 330</answer>", numeric)
    assert not answer_right("329", numeric)
    exact = {"answer": 12, "decimals": None}
    assert answer_right("<answer>12.0</answer>", exact) and not answer_right(
        "<answer>12.4</answer>", exact
    )
    text = {"answer": "Pico da Neblina", "decimals": None}
    assert answer_right("<answer>pico da neblina.</answer>", text)
    assert not answer_right("<answer>Pico</answer>", text)


def runs(tokens: list[int], masks: list[int]) -> list[tuple[bool, list[int]]]:
    """Maximal runs of masked / trained tokens."""
    out: list[tuple[bool, list[int]]] = []
    for token, mask in zip(tokens, masks, strict=True):
        masked = mask == -100
        assert masked or mask == token
        if out and out[-1][0] == masked:
            out[-1][1].append(token)
        else:
            out.append((masked, [token]))
    return out


def check_sequence(tokens, masks, messages, tokenizer) -> None:
    """One sequence covers every turn; exactly the replies are trained on."""
    text = tokenizer.decode(tokens)
    assert text + "\n" == render_prompt(tokenizer, messages, tools=TOOLS, native_tools=False)
    parts = [(masked, tokenizer.decode(ids)) for masked, ids in runs(tokens, masks)]
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    assert [t for masked, t in parts if not masked] == [r + "<|im_end|>" for r in replies]
    masked = [t for is_masked, t in parts if is_masked]
    assert masked[0] == render_prompt(tokenizer, messages[:2], tools=TOOLS, native_tools=False)
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert len(masked) == len(replies) and "".join(masked[1:]).count("<tool_response>") == len(
        results
    )
    for part in masked[1:]:
        assert part.startswith("\n<|im_start|>user\n<tool_response>")
        assert part.endswith("<|im_start|>assistant\n")
    for result in results:
        assert result in "".join(masked[1:])


def check_group(group: dict, tokenizer) -> None:
    assert len(group["tokens"]) == len(group["masks"]) == len(group["messages"]) == 4
    assert sorted(group["scores"]) == SCORES
    by_score = dict(zip(group["scores"], group["messages"], strict=False))
    right = by_score[1.0]
    task = TASKS[right[1]["content"]]
    assert sum(m["role"] == "assistant" for m in right) == len(task["plan"]) + 1
    assert sum(m["role"] == "tool" for m in right) == len(task["plan"])
    for tokens, masks, messages in zip(
        group["tokens"], group["masks"], group["messages"], strict=True
    ):
        check_sequence(tokens, masks, messages, tokenizer)


def check_process(groups: list[dict], run: Run) -> None:
    for group in groups:
        check_group(group, run.tokenizer)
    # the stream is the seed's: tasks 0, 1 and 2 of seed 0
    assert [g["messages"][0][1]["content"] for g in groups] == [
        task_for(0, i)["question"] for i in range(3)
    ]
    loops = [
        (score, m)
        for g in groups
        for score, m in zip(g["scores"], g["messages"], strict=True)
        if LOOP in m[2]["content"]
    ]
    assert len(loops) == 3
    for score, messages in loops:  # stopped at the turn limit, its last results unsent
        assert score == -0.2 and messages[-1]["role"] == "assistant"
        assert sum(m["role"] == "assistant" for m in messages) == 4


def check_serve(groups: list[dict], run: Run) -> None:
    for group in groups:
        check_group(group, run.tokenizer)


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    assert {s["kind"] for s in samples} == {"lookup"}
    # four distinct questions, each asked once: all get the first behaviour, the plan,
    # unless two tasks share a question (then the second gets the wrong answer)
    questions = Counter(s["question"] for s in samples)
    right = sum(1 for s in samples if s["correct"])
    assert right == len(questions)
    assert results["eval/accuracy"] == pytest.approx(right / 4)
    assert results["eval/malformed_rate"] == 0.0
    assert results["eval/tool_calls_per_episode"] == pytest.approx(right / 4)
    assert all(s["calls"][0]["name"] == "country_info" for s in samples if s["correct"])


# The questions every env is asked (tests/environments/test_env_table.py): whole
# episodes in `process` and `serve`, `evaluate`'s metrics and samples. A fresh policy
# per run: its per-prompt counters start at zero.
POLICY = scripted(new_policy=Policy)
PROCESS = ProcessRow(
    env=ToolUseMultiturnEnv,
    model=POLICY,
    group_size=4,
    steps=3,
    scores=None,
    args=lambda run: ["--env.max_turns", "4"],
    check=check_process,
)
SERVE = ServeRow(
    env=ToolUseMultiturnEnv,
    model=POLICY,
    group_size=4,
    batch_size=8,
    max_token_len=8192,
    groups=4,
    args=lambda run: ["--env.max_turns", "4"],
    check=check_serve,
)
EVALUATE = EvaluateRow(
    env=ToolUseMultiturnEnv,
    model=POLICY,
    samples=4,
    args=lambda run: [
        *("--env.max_turns", "4", "--env.eval_size", "4", "--env.task_kinds", "lookup"),
    ],
    check=check_evaluate,
)
