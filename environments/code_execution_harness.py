"""The test harness of the code-execution env: a solution and a judge in two sandboxes.

How an answer is judged (`code_execution_programs.py` holds both programs and says
why there are two): the model's code runs in one sandbox and answers calls over a
pipe; the problem's hidden tests run in a second sandbox, which the solution cannot
see, and report each passing case on their own stdout. Each top-level statement of
HumanEval's `check(candidate)` that holds a non-constant `assert` is a case; the others
are setup, and a setup statement that fails ends the run. The score is the share of
cases passed.

What this stops (each is a test in tests/environments/test_code_execution_server.py):
fake tallies and early exits, patched builtins or stdout, results whose `__eq__` always
says True, reading the tests from the program file, reading the dataset from the
disk (neither sandbox mode shows it), and `assert True` lines counted as cases. A
correct solution that prints a lot still scores 1: its output goes to its own files.

What it does not do: arguments and results must be plain data (numbers, strings,
bytes, None and lists, tuples, sets and dicts of them); a case that passes a function
or checks that the candidate mutated its argument fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from atroposlib.envs.reward_fns import after_thinking
from atroposlib.envs.sandbox import SandboxLimits, SandboxResult, sandboxed_python
from environments.code_execution_programs import case_flags, check_function

FENCE = re.compile(r"```(?:python|py|Python|python3)?[ \t]*\n(.*?)```", re.DOTALL)
SOLUTION_EXIT_S = 1.0  # the solution ends once the judge hangs up
PROGRAMS = (Path(__file__).resolve().parent / "code_execution_programs.py").read_text()


@dataclass(frozen=True)
class CodeRun:
    """What one answer earned: cases passed of the total, and how the run ended."""

    passed: int
    total: int
    result: SandboxResult | None

    @property
    def score(self) -> float:
        return self.passed / self.total if self.total else 0.0


def count_cases(tests: str) -> int:
    """Cases in HumanEval-style tests (see `case_flags`)."""
    return sum(case_flags(check_function(tests).body))


def extract_code(completion: str) -> str:
    """The last ```python fence of the response (after any reasoning), else the response.

    The response keeps its indentation: a bare function body is a valid answer.
    """
    response = after_thinking(completion)
    if response is None:
        return ""
    fences = FENCE.findall(response)
    return (fences[-1] if fences else response).lstrip("\n").rstrip()


def program_for(code: str, prompt: str, entry_point: str) -> str:
    """The code to test: the answer, or the prompt + answer when it is only a body."""
    if re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        return code
    return prompt + code


def passed_cases(stdout: str, total: int) -> int:
    """Distinct case indices the judge reported."""
    found = re.findall(r"^PASS (\d+)$", stdout, re.MULTILINE)
    return len({int(i) for i in found if int(i) < total})


def judge_program(
    program: str, tests: str, entry_point: str, limits: SandboxLimits, case_timeout_s: float
) -> tuple[int, SandboxResult]:
    """(cases passed, the solution's run): the two sandboxes joined by two pipes."""
    total = count_cases(tests)
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    open_fds = [requests_read, requests_write, replies_read, replies_write]
    job = {"tests": tests, "case_timeout": case_timeout_s, "ready_timeout": limits.wall_time_s}
    try:
        with (
            sandboxed_python(
                PROGRAMS,
                limits,
                stdin=program,
                pass_fds=(requests_read, replies_write),
                args=("solution", str(requests_read), str(replies_write), entry_point),
            ) as solution,
            sandboxed_python(
                PROGRAMS,
                limits,
                stdin=json.dumps(job),
                pass_fds=(requests_write, replies_read),
                args=("judge", str(requests_write), str(replies_read)),
            ) as judge,
        ):
            while open_fds:  # each end now lives only in its process: a death is an EOF
                os.close(open_fds.pop())
            verdict = judge.finish()
            return passed_cases(verdict.stdout, total), solution.finish(timeout=SOLUTION_EXIT_S)
    finally:
        for fd in open_fds:
            os.close(fd)


async def run_tests(
    completion: str,
    problem: dict[str, str],
    limits: SandboxLimits,
    case_timeout_s: float = 3.0,
) -> CodeRun:
    """Extract the answer's code, run it against the problem's hidden tests, count passes."""
    total = count_cases(problem["test"])
    code = extract_code(completion)
    if not code.strip():
        return CodeRun(0, total, None)
    program = program_for(code, problem["prompt"], problem["entry_point"])
    passed, result = await asyncio.to_thread(
        judge_program, program, problem["test"], problem["entry_point"], limits, case_timeout_s
    )
    return CodeRun(passed, total, result)
