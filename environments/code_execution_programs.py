"""The two sandboxed programs of the code grader, and the wire between them.

The grader runs each answer as two processes in two sandboxes, joined by two pipes:

- **The solution** (`python main.py solution REQUESTS REPLIES ENTRY`) reads the model's
  code from stdin, runs it, then answers calls: a request line names the arguments
  and a time limit, a reply line carries the result or an error.
- **The judge** (`python main.py judge REQUESTS REPLIES`) reads the hidden tests from
  stdin (they never sit in a file), runs HumanEval's `check(candidate)` with a
  `candidate` that forwards each call over the pipes, and writes `PASS <i>` to its own
  stdout for each case that passed.

Why two processes: in one interpreter, the model's code can patch builtins the harness
uses afterwards, walk its frames or read the tests from its own program file (review
findings SBX-1 and SBX-2). Here the solution holds no test, no expected value and no
way to write to the judge's stdout. What crosses the pipe is data: `encode` accepts
only plain values of exact built-in types, and `decode` builds fresh ones, so an object
whose `__eq__` always says True cannot arrive. A solution that answers garbage only
fails its own cases.

This file is stdlib-only: it runs under `python -I -S` in the sandbox, and the
environment imports it for `case_flags`.
"""

from __future__ import annotations

import ast
import json
import os
import select
import signal
import sys
import threading
import time

GRACE_S = 1.0  # how much longer the judge waits than the solution's own timer
MAX_LINE = 32 << 20  # longest reply the judge reads
MAX_DEPTH = 200  # deepest nesting the wire carries

SCALARS = {type(None): "n", bool: "b", int: "i", float: "f", complex: "c", str: "s", bytes: "y"}
CONTAINERS = {list: "l", tuple: "t", set: "S", frozenset: "F", dict: "d"}
BUILDERS = {"l": list, "t": tuple, "S": set, "F": frozenset}


def encode(value: object, depth: int = 0) -> list:
    """Plain data as tagged JSON; anything else (subclasses too) raises TypeError."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise TypeError("nested too deeply")
    if kind in SCALARS:
        tag = SCALARS[kind]
        if tag == "f":
            return [tag, repr(value)]
        if tag == "c":
            return [tag, repr(value.real), repr(value.imag)]
        if tag == "y":
            return [tag, value.hex()]
        return [tag] if tag == "n" else [tag, value]
    if kind is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    if kind in CONTAINERS:
        return [CONTAINERS[kind], [encode(v, depth + 1) for v in value]]
    raise TypeError(f"not plain data: {kind.__name__}")


def decode(item: object, depth: int = 0) -> object:
    """The value `encode` described; anything malformed raises ValueError."""
    if type(item) is not list or not item or type(item[0]) is not str or depth > MAX_DEPTH:
        raise ValueError("malformed value")
    tag, rest = item[0], item[1:]
    if tag == "n" and not rest:
        return None
    if len(rest) == 1:
        (body,) = rest
        if tag == "b" and type(body) is bool:
            return body
        if tag == "i" and type(body) is int:
            return body
        if tag == "f" and type(body) is str:
            return float(body)
        if tag == "s" and type(body) is str:
            return body
        if tag == "y" and type(body) is str:
            return bytes.fromhex(body)
        if tag in BUILDERS and type(body) is list:
            return BUILDERS[tag](decode(v, depth + 1) for v in body)
        if tag == "d" and type(body) is list:
            pairs = [p for p in body if type(p) is list and len(p) == 2]
            if len(pairs) != len(body):
                raise ValueError("malformed dict")
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in pairs}
    if tag == "c" and len(rest) == 2 and all(type(p) is str for p in rest):
        return complex(float(rest[0]), float(rest[1]))
    raise ValueError(f"malformed value tagged {tag!r}")


def case_flags(statements: list[ast.stmt]) -> list[bool]:
    """Which statements of `check`'s body are cases: those holding a non-constant assert.

    `assert True, "..."` (HumanEval's debugging lines) passes for any candidate, so it
    is not a case. Without any case, the last statement is the one case.
    """
    flags = [
        any(isinstance(n, ast.Assert) and not isinstance(n.test, ast.Constant) for n in ast.walk(s))
        for s in statements
    ]
    if statements and not any(flags):
        flags[-1] = True
    return flags


PARSING = threading.Lock()
"""The grader judges answers in threads, and two `ast.parse` calls at once can raise
SystemError ("AST constructor recursion depth mismatch") on CPython before 3.11.8 and
3.12.1 (gh-106905): one parse at a time."""


def check_function(tests: str) -> ast.FunctionDef:
    """The last `def check(candidate)` of the tests."""
    with PARSING:
        tree = ast.parse(tests)
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    checks = [n for n in checks if n.name == "check" and n.args.args]
    if not checks:
        raise ValueError("the tests define no check(candidate)")
    return checks[-1]


def _send(fd: int, message: dict) -> None:
    data = (json.dumps(message, allow_nan=True) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


class _Lines:
    """Reads newline-ended messages from a pipe, each by a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer = fd, bytearray()

    def next(self, deadline: float | None) -> dict | None:
        """The next message; None at end of file, past the deadline or past MAX_LINE."""
        while b"\n" not in self.buffer:
            left = None if deadline is None else deadline - time.monotonic()
            if (left is not None and left <= 0) or len(self.buffer) > MAX_LINE:
                return None
            if not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer = bytearray(rest)
        try:
            message = json.loads(line)
        except ValueError:
            return {}
        return message if type(message) is dict else {}


class _CallTimeout(BaseException):
    pass


def _on_alarm(signum: int, frame: object) -> None:
    raise _CallTimeout()


def serve_solution(requests: int, replies: int, entry_point: str) -> None:
    """Run the model's code from stdin, then answer calls until the judge hangs up."""
    space: dict = {"__name__": "solution"}
    try:
        exec(compile(sys.stdin.read(), "solution.py", "exec"), space)
        candidate = space[entry_point]
        ready = callable(candidate)
    except BaseException:
        ready = False
    _send(replies, {"ready": ready})
    if not ready:
        return
    signal.signal(signal.SIGALRM, _on_alarm)
    lines = _Lines(requests)
    while True:
        request = lines.next(None)
        if request is None:
            return
        reply: dict = {"seq": request.get("seq")}
        signal.setitimer(signal.ITIMER_REAL, max(0.001, float(request.get("timeout", 1))))
        try:
            result = candidate(*decode(request["args"]), **decode(request["kwargs"]))
            signal.setitimer(signal.ITIMER_REAL, 0)
            reply["result"] = encode(result)
        except BaseException as error:
            signal.setitimer(signal.ITIMER_REAL, 0)
            reply = {"seq": request.get("seq"), "error": type(error).__name__}
        _send(replies, reply)


class CaseFailed(Exception):
    """A call that did not return plain data in time."""


def judge(requests: int, replies: int) -> None:
    """Run the hidden tests from stdin against the solution on the other end of the pipes."""
    job = json.loads(sys.stdin.read())
    out = os.dup(1)
    sys.stdout = sys.stderr  # the tests' own prints cannot look like a tally
    check = check_function(job["tests"])
    tree = ast.parse(job["tests"])
    header = ast.Module(body=[n for n in tree.body if n is not check], type_ignores=[])
    flags = case_flags(check.body)
    lines = _Lines(replies)
    hello = lines.next(time.monotonic() + job["ready_timeout"])
    if not hello or hello.get("ready") is not True:
        return
    state = {"seq": 0, "deadline": 0.0}

    def candidate(*args: object, **kwargs: object) -> object:
        state["seq"] += 1
        left = state["deadline"] - time.monotonic()
        if left <= 0:
            raise CaseFailed("the case's time is up")
        request = {"seq": state["seq"], "args": encode(list(args)), "kwargs": encode(dict(kwargs))}
        _send(requests, {**request, "timeout": left})
        while True:
            reply = lines.next(time.monotonic() + left + GRACE_S)
            if reply is None:
                raise CaseFailed("no reply")
            if reply.get("seq") == state["seq"]:
                break
        if "result" not in reply:
            raise CaseFailed(f"the solution raised {reply.get('error')}")
        return decode(reply["result"])

    scope: dict = {"__name__": "tests"}
    exec(compile(header, "tests.py", "exec"), scope)
    scope[check.args.args[0].arg] = candidate
    index = 0
    for statement, case in zip(check.body, flags, strict=True):
        state["deadline"] = time.monotonic() + job["case_timeout"]
        try:
            exec(compile(ast.Module(body=[statement], type_ignores=[]), "check.py", "exec"), scope)
            passed = True
        except Exception:
            passed = False
        if case:
            if passed:
                os.write(out, f"PASS {index}\n".encode())
            index += 1
        elif not passed:
            return


if __name__ == "__main__":
    role, requests_fd, replies_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if role == "solution":
        serve_solution(requests_fd, replies_fd, sys.argv[4])
    else:
        judge(requests_fd, replies_fd)
