"""Run reward cases given as JSON and print each outcome: scores, or the exception raised.

Imported, `outcome` runs a case against this project's rewards. Run as a program (the
text is passed to `python -c`), it runs them against the package in the folder named by
its first argument, upstream Atropos in `.venv/reference`, which has this project's
import name; so that folder goes first on the path and the import is checked.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from typing import Any


def outcome(package: str, case: dict[str, Any]) -> dict[str, Any]:
    """{"scores": [...]} from the case's class (its compute) or function, or {"raises": ...}."""
    module = importlib.import_module(f"{package}.envs.reward_fns.{case['module']}")
    target = getattr(module, case["target"])
    try:
        if isinstance(target, type):
            scores = target(**case["init"]).compute(case["completions"], **case["kwargs"])
        else:
            scores = target(case["completions"], **case["kwargs"])
        return {"scores": [float(score) for score in scores]}
    except Exception as exc:  # the reference may raise; that is an outcome to compare
        return {"raises": f"{type(exc).__name__}: {exc}"[:300]}


if __name__ == "__main__":
    reference = sys.argv[1]
    sys.path.insert(0, reference)
    logging.disable(logging.CRITICAL)  # upstream logs every score at INFO and WARNING
    import atroposlib

    assert atroposlib.__file__.startswith(reference), f"not the reference: {atroposlib.__file__}"
    print(json.dumps([outcome("atroposlib", case) for case in json.load(sys.stdin)]))
