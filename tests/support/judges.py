"""A scripted judge for the judge-model tests: it prefers replies that say GOOD."""

from __future__ import annotations

import re


def prefer_good(messages, n):
    """A judge that prefers the reply containing GOOD; unreadable for 'CONFUSE'."""
    text = messages[-1]["content"]
    if "[Reply A]" not in text:
        return ["[[9]]" if "GOOD" in text.split("[Reply]")[1] else "[[1]]"] * n
    first, second = re.search(
        r"\[Reply A\]\n(.*)\n\n\[Reply B\]\n(.*)\n\nJudge", text, re.S
    ).groups()
    if "CONFUSE" in first + second:
        return ["no idea"] * n
    if ("GOOD" in first) == ("GOOD" in second):
        return ["Equal. [[C]]"] * n
    return ["[[A]]" if "GOOD" in first else "Second is better: [[B]]"] * n
