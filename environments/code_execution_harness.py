"""The test harness of the code-execution env: one sandboxed program per answer.

How a run is judged. The program is this file's `HARNESS` with three literals filled
in: the model's code, the problem's hidden tests (HumanEval's `def check(candidate):`)
and the entry point. It is run by `atroposlib.envs.sandbox.run_python` with a fresh
random nonce on stdin. Before any of the model's code runs, the harness reads the nonce,
duplicates the stdout file descriptor and keeps private references to the builtins it
uses. Then it executes the model's code in its own namespace, and the tests in another
one with a copy of the builtins taken before the model ran. Each top-level statement
of `check`'s body that contains an `assert` is one case; the others (imports, helper
variables) are setup. Each passing case writes `<nonce> PASS <i>` to the saved
descriptor; the score is the share of distinct cases reported that way.

What this stops: a fake tally (the model does not know the nonce), `sys.exit(0)` or
`os._exit(0)` (an early exit reports no further cases, and `SystemExit` inside a case
is a failure), replacing `sys.stdout` or builtins such as `abs` (the harness and the
tests use their own), and results that cheat comparisons (the candidate is wrapped:
a result that is not plain data, ints, floats, strings, None and lists, tuples, sets
or dicts of them, fails the case, so an object whose `__eq__` always says True cannot
pass). A hanging case is cut by a per-case timer and the rest still run; the sandbox's
wall clock bounds the whole run, and cases reported before it still count.

What it does not stop: the solution and the tests share one interpreter, so code that
walks the harness's frames to read the nonce, patches shared modules the tests import,
or ignores the timer signal is not defended against; the sandbox contains what such
code can do to the machine, not to the score.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from atroposlib.envs.reward_fns._ifeval_checks import THINK_CLOSE, THINK_OPEN
from atroposlib.envs.sandbox import SandboxLimits, SandboxResult, run_python_async

FENCE = re.compile(r"```(?:python|py|Python|python3)?[ \t]*\n(.*?)```", re.DOTALL)

HARNESS = r"""
import ast as _ast, builtins as _builtins, os as _os, signal as _signal, sys as _sys

def _harness(solution, tests, entry_point, case_timeout):
    nonce = _sys.stdin.readline().strip()
    out = _os.dup(1)
    write, exec_, compile_, type_, len_ = _os.write, exec, compile, type, len
    list_, all_, dict_, str_, setitimer = list, all, dict, str, _signal.setitimer
    clean = dict(_builtins.__dict__)
    scalars = (int, float, complex, str, bytes, bool, type(None))
    sequences = (list, tuple, set, frozenset)

    def plain(value, depth=0):
        kind = type_(value)
        if kind in scalars:
            return True
        if depth > 100:
            return False
        if kind in sequences:
            return all_(plain(v, depth + 1) for v in value)
        if kind is dict:
            return all_(plain(k, depth + 1) and plain(v, depth + 1) for k, v in value.items())
        return False

    class CaseTimeout(BaseException):
        pass

    def on_alarm(signum, frame):
        raise CaseTimeout()

    tree = _ast.parse(tests)
    check = [n for n in tree.body if isinstance(n, _ast.FunctionDef) and n.name == "check"]
    if not check:
        raise SystemExit("the tests define no check(candidate)")
    check = check[-1]
    param = check.args.args[0].arg
    header = _ast.Module(body=[n for n in tree.body if n is not check], type_ignores=[])
    statements = check.body
    is_case = [any(isinstance(n, _ast.Assert) for n in _ast.walk(s)) for s in statements]
    if not any(is_case):
        is_case = [False] * (len(statements) - 1) + [True]

    space = {"__name__": "solution", "__builtins__": _builtins}
    try:
        exec_(compile_(solution, "solution.py", "exec"), space)
        candidate = space[entry_point]
    except BaseException:
        return
    if not callable(candidate):
        return

    def guarded(*args, **kwargs):
        result = candidate(*args, **kwargs)
        if not plain(result):
            raise TypeError("the result is not plain data")
        return result

    scope = {"__name__": "tests", "__builtins__": clean}
    try:
        exec_(compile_(header, "tests.py", "exec"), scope)
    except BaseException:
        return
    scope[param] = guarded
    _signal.signal(_signal.SIGALRM, on_alarm)
    index = 0
    for statement, case in zip(statements, is_case):
        code = compile_(_ast.Module(body=[statement], type_ignores=[]), "check.py", "exec")
        setitimer(_signal.ITIMER_REAL, case_timeout)
        try:
            exec_(code, scope)
            passed = True
        except BaseException:
            passed = False
        finally:
            setitimer(_signal.ITIMER_REAL, 0)
        if case:
            if passed:
                write(out, (nonce + " PASS " + str_(index) + "\n").encode())
            index += 1
        elif not passed:
            return
"""


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
    """Cases in HumanEval-style tests: top-level statements of check() holding an assert."""
    import ast

    checks = [n for n in ast.parse(tests).body if isinstance(n, ast.FunctionDef)]
    checks = [n for n in checks if n.name == "check"]
    if not checks:
        raise ValueError("the tests define no check(candidate)")
    cases = sum(any(isinstance(n, ast.Assert) for n in ast.walk(s)) for s in checks[-1].body)
    return cases or 1


def extract_code(completion: str) -> str:
    """The last ```python fence of the response (after any reasoning), else the response.

    The response keeps its indentation: a bare function body is a valid answer.
    """
    closes = list(THINK_CLOSE.finditer(completion))
    if closes:
        response = completion[closes[-1].end() :]
    elif THINK_OPEN.search(completion):
        return ""
    else:
        response = completion
    fences = FENCE.findall(response)
    return (fences[-1] if fences else response).lstrip("\n").rstrip()


def program_for(code: str, prompt: str, entry_point: str) -> str:
    """The code to test: the answer, or the prompt + answer when it is only a body."""
    if re.search(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        return code
    return prompt + code


def harness_source(solution: str, tests: str, entry_point: str, case_timeout_s: float) -> str:
    """The full sandboxed program for one answer (its parts as Python literals)."""
    arguments = ", ".join(map(repr, (solution, tests, entry_point, float(case_timeout_s))))
    return f"{HARNESS}\n_harness({arguments})\n"


def passed_cases(stdout: str, nonce: str, total: int) -> int:
    """Distinct case indices reported with this run's nonce."""
    found = re.findall(rf"^{re.escape(nonce)} PASS (\d+)$", stdout, re.MULTILINE)
    return len({int(i) for i in found if int(i) < total})


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
    nonce = secrets.token_hex(16)
    source = harness_source(program, problem["test"], problem["entry_point"], case_timeout_s)
    result = await run_python_async(source, limits=limits, stdin=nonce + "\n")
    return CodeRun(passed_cases(result.stdout, nonce, total), total, result)
