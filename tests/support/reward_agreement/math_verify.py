r"""Seeded adversarial (gold, completion) pairs for "math_verify", and upstream's verdict.

The reference is math-verify (0.9.0, with latex2sympy2_extended 1.11.0) called the way
upstream Atropos calls it (NousResearch/atropos at 296a0bc55760, `environments/`):

- the gold answer is wrapped as `\boxed{gold}` unless it already holds a `\boxed`
  (`math_server.py` lines 328 and 755-759; `gsm8k_server.py` lines 140 and 231 always
  wrap), then parsed with `parse(gold, extraction_mode="first_match",
  extraction_config=[LatexExtractionConfig()])` (`gsm8k_server.py` lines 275-279,
  `math_server.py` lines 104-108); a gold that does not parse scores nothing
  (`gsm8k_server.py` line 280 returns no group);
- the reply is cut to the text after its last `</think>` (`.split("</think>")[-1]`,
  `gsm8k_server.py` line 286, `math_server.py` lines 329 and 678), so a reply with no
  `</think>` (an unclosed `<think>` included) is graded whole. (Other upstream
  environments score that reply wrong, as the reward does: `tool_use_interleaved_thinking.py`
  lines 598-599.)
- that text is parsed with `LatexExtractionConfig(normalization_config=
  NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True,
  equations=True, boxed="all", units=True), boxed_match_priority=0,
  try_extract_without_anchor=False)` in `extraction_mode="first_match"`
  (`gsm8k_server.py` lines 285-303; `math_server.py` lines 114-131 is the same call
  without `equations=True`);
- and the verdict is `verify(answer_parsed, gold_parsed)`, the answer passed first
  (`gsm8k_server.py` line 305, `math_server.py` line 143).

The replies are boxed and unboxed answers, equivalent forms (fractions, decimals,
percentages, units, thousands separators, sets, intervals, relations), several boxes,
hedging, a set answered one element to a box, nested, unclosed, spaced and escaped
braces, answers inside and after `<think>`, unclosed and reopened `<think>`, empty
replies, huge numbers and LaTeX junk. Where the reward differs, `_explanation` names the
documented rule that accounts for it (the rule's shape must be the case's, or upstream's
call changed by the rule must give the reward's verdict); the per-box rewrite splits the
boxes with the reward's own `boxed_contents`, which its unit tests check directly.

math-verify bounds each `parse` and `verify` call with its own SIGALRM timeouts (5 s by
default), which work only on the main thread: off it the reference switches them off,
as the reward does, rather than have math-verify refuse to run. The generated cases
avoid the few inputs (towers of powers) that would spend those seconds.
"""

from __future__ import annotations

import logging
import random
import re
import threading
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from tests.support.reward_agreement import Agreement

# gold, answers math-verify should count equal to it, answers it should not
FAMILIES: list[tuple[str, list[str], list[str]]] = [
    (r"\frac{1}{2}", ["0.5", "1/2", r"\frac12", r"\dfrac{1}{2}", r"\frac{2}{4}", ".5"], ["2"]),
    ("0.75", [r"\frac{3}{4}", "3/4", r"\tfrac34", r"75\%"], ["0.7", "7.5", r"\frac{4}{3}"]),
    ("16", ["16", "16.0", r"\text{16}", r"16 \text{ dollars}", r"\$16", "x=16"], ["17", "-16"]),
    ("1234", ["1,234", "1234", "1234.0", r"1{,}234"], ["1235", "123.4", "12,34"]),
    (r"\sqrt{3}", [r"\sqrt3", "3^{1/2}", r"\sqrt{3}"], ["3", r"\sqrt{2}", "1.732"]),
    (r"\frac{\sqrt{3}}{2}", [r"\frac{\sqrt3}{2}", r"\frac{1}{2}\sqrt{3}", r"\sqrt{3}/2"], ["1"]),
    (r"\{1,2,3\}", [r"\{3,2,1\}", "1,2,3", r"\{1, 2, 3\}"], [r"\{1,2\}", r"\{1,2,4\}"]),
    (r"\{-1,4\}", ["-1, 4", r"\{4,-1\}", "4,-1"], [r"\{4\}", "-1", r"\{-1,4,5\}"]),
    ("(1,2]", ["(1, 2]", r"\left(1,2\right]", r"1 < x \leq 2"], ["[1,2]", "(1,2)", "(1,3]"]),
    (r"[0,\infty)", [r"[0, \infty)", r"x \geq 0"], [r"(0,\infty)", r"(-\infty,0]"]),
    (r"x \geq 0", [r"[0,\infty)", r"x \geq 0", r"0 \leq x"], [r"x > 0", r"(0,\infty)"]),
    (r"50\%", ["50", r"50\%", "0.5", r"\frac{1}{2}"], ["5", "500", r"5\%"]),
    ("10^{100}", ["10^{100}", r"10^{10^2}"], ["10^{99}", "100"]),
    ("123456789012345678901234567890", ["123456789012345678901234567890"], ["1.2345e29"]),
    ("2^{64}", ["18446744073709551616", "2^{64}"], ["18446744073709551615", "2^{63}"]),
    (r"\pi", [r"\pi", r"\frac{2\pi}{2}"], ["3.14", r"2\pi", "3.14159"]),
    ("x^2+2x+1", ["(x+1)^2", "x^{2}+2x+1", "1+2x+x^2"], ["x^2+1", "(x-1)^2"]),
    ("-3", ["-3", "- 3", "-3.0"], ["3", "-(-3)"]),
    ("x=5", ["5", "x=5", "x = 5"], ["x=6", "y=6"]),
    (r"\frac{1}{3}", ["1/3", r"\frac{2}{6}", "0.333333333"], ["0.33", "3"]),
    (r"\text{(B)}", ["B", r"\text{B}", r"\text{(B)}"], ["C", r"\text{(C)}"]),
    ("0", ["0", "0.0", "-0"], ["1", "O"]),
    (r"\begin{pmatrix} 3 \\ 1 \end{pmatrix}", [r"\begin{pmatrix}3\\1\end{pmatrix}"], ["3"]),
    (r"\boxed{7}", ["7", "7.0"], ["8"]),
]
JUNK = [
    "",
    " ",
    r"\\",
    r"\frac{}{}",
    "$16$",
    r"\text{I don't know}",
    r"\left(",
    "}{",
    r"\begin{align} x &= 1 \end{align}",
    r"\sqrt",
    "1+",
    "?????",
    r"\infty",
    r"\emptyset",
    "NaN",
    r"\boxed{}",
]
REASONING = [
    "",
    "Let me compute. ",
    "First simplify the expression; then check the edge cases.\n\n",
    r"We have $a = 3$ and $b = 4$, so $c^2 = 25$. ",
    "The answer is 16. ",
]
SHAPES = [
    "boxed",
    "boxed",
    "boxed wrong",
    "unboxed",
    "think",
    "think only",
    "unclosed think",
    "reopened think",
    "several boxes",
    "one box per item",
    "hedged",
    "too many boxes",
    "nested braces",
    "unclosed box",
    "empty",
    "junk",
    "huge",
    "delimiters",
    "spaced box",
    "escaped braces",
]


@dataclass(frozen=True)
class Case:
    gold: str
    completion: str
    shape: str


def _box(answer: str) -> str:
    return rf"\boxed{{{answer}}}"


def _completion(rng: random.Random, shape: str, right: list[str], wrong: list[str]) -> str:
    good, bad = rng.choice(right), rng.choice(wrong + JUNK[:3])
    say = rng.choice(REASONING)
    if shape == "boxed":
        return f"{say}So the answer is {_box(good)}."
    if shape == "boxed wrong":
        return say + _box(bad)
    if shape == "unboxed":
        form = rng.choice(["The answer is ${}$.", "Final answer: {}", "{}", "**Answer:** ${}$"])
        return say + form.format(good)
    if shape == "think":
        inside = rng.choice(["", _box(bad), _box(good), "hmm"])
        after = rng.choice([_box(good), _box(bad), f"it is {good}"])
        gap = rng.choice(["", " ", "\n\n"])
        return f"<think>{say}{inside}</think>{gap}{after}"
    if shape == "think only":
        return f"<think>{say}{_box(good)}</think>" + rng.choice(["", " ", "Done."])
    if shape == "unclosed think":
        return f"<think>{say}{_box(rng.choice([good, bad]))}" + rng.choice(["", " ..."])
    if shape == "reopened think":
        first, second = rng.choice([(good, bad), (bad, good), (good, good)])
        tail = rng.choice(["", "</think>", "</think> done"])
        return f"<think>a</think> {_box(first)} <think>wait {_box(second)}{tail}"
    if shape == "several boxes":
        again = rng.choice(["", f" = {_box(good)}"])
        return f"{_box(good)}, i.e. {_box(rng.choice(right))}{again}"
    if shape == "one box per item":  # a set answered one element to a box
        return " and ".join(_box(item) for item in good.strip(r"\{}").split(","))
    if shape == "hedged":
        pair = [_box(good), _box(bad)]
        rng.shuffle(pair)
        return f"{say}{pair[0]} or {pair[1]}"
    if shape == "too many boxes":
        return " ".join([_box(good)] * rng.randint(4, 8))
    if shape == "nested braces":
        form = rng.choice(["{{{}}}", r"\text{{{}}}", "{{{{{}}}}}", r"\boxed{{{}}}"])
        return _box(form.format(good))
    if shape == "unclosed box":
        form = rng.choice([r"\boxed{{{}", r"\boxed{{{} }} \boxed{{", r"\boxed{{\frac{{{}}}"])
        return say + form.format(good)
    if shape == "empty":
        return rng.choice(["", " ", "\n", r"\boxed{}", "<think></think>", "</think>"])
    if shape == "junk":
        return say + _box(rng.choice(JUNK)) + rng.choice(["", _box(good)])
    if shape == "huge":
        return rng.choice(
            [
                _box("9" * rng.randint(50, 400)),
                _box(good + " " * 1200),
                _box("+".join(["1"] * 600)),
                _box(good) + " x" * rng.randint(1000, 20000),
            ]
        )
    if shape == "spaced box":  # LaTeX ignores the space before a command's argument
        return say + rng.choice([r"\boxed {}", "\\boxed\n{}", r"\boxed  {}"]).format(f"{{{good}}}")
    if shape == "escaped braces":  # \{ and \} are characters, not group delimiters
        form = rng.choice(
            [
                r"\boxed{{\{{{}}} \boxed{{{}}}",
                r"\boxed{{{}}} \boxed{{\{{}}",
                r"\boxed{{{} \}}}} \boxed{{{}}}",
            ]
        )
        return form.format(rng.choice([good, bad]), good)
    # delimiters around (or in place of) the box
    form = rng.choice(["${}$", r"\[{}\]", r"\({}\)", "$$ {} $$", "**{}**", r"\fbox{{{}}}"])
    return form.format(_box(good) if "fbox" not in form else good)


def cases(n: int = 400, seed: int = 27) -> list[Case]:
    """`n` seeded (gold, completion) pairs: a gold answer and a reply of a random shape."""
    rng = random.Random(seed)
    made = []
    for _ in range(n):
        shape = rng.choice(SHAPES)
        sets = shape == "one box per item"  # a set gold: its elements are the items
        gold, right, wrong = rng.choice(
            [f for f in FAMILIES if f[0].startswith("\\{")] if sets else FAMILIES
        )
        made.append(Case(gold, _completion(rng, shape, right, wrong), shape))
    return made


class _NoDeprecationWarning(logging.Filter):
    """Drops latex2sympy2_extended's warning that `equations=True` (upstream's setting) is
    deprecated, which it logs on every parse; its other records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is deprecated" not in record.getMessage()


_NORMALIZATION_LOG = logging.getLogger("latex2sympy2_extended.math_normalization")
_NORMALIZATION_LOG.addFilter(_NoDeprecationWarning())


def _timeout() -> int | None:
    return 5 if threading.current_thread() is threading.main_thread() else None


def reference_verdict(
    gold: str,
    completion: str,
    *,
    malformed_operators: bool = False,
    gold_first: bool = False,
) -> bool:
    """Upstream Atropos's verdict (see the module docstring). The keywords change the two
    settings the reward changes, to check that one of them explains a difference."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    wrapped = gold if "\\boxed" in gold else "\\boxed{" + gold + "}"
    gold_parsed = parse(
        wrapped,
        extraction_mode="first_match",
        extraction_config=[LatexExtractionConfig()],
        parsing_timeout=_timeout(),
    )
    if not gold_parsed:
        return False
    answer_parsed: list[Any] = parse(
        completion.split("</think>")[-1],
        extraction_config=[
            LatexExtractionConfig(
                normalization_config=NormalizationConfig(
                    nits=False,
                    malformed_operators=malformed_operators,
                    basic_latex=True,
                    equations=True,
                    boxed="all",
                    units=True,
                ),
                boxed_match_priority=0,
                try_extract_without_anchor=False,
            )
        ],
        extraction_mode="first_match",
        parsing_timeout=_timeout(),
    )
    pair = (gold_parsed, answer_parsed) if gold_first else (answer_parsed, gold_parsed)
    return bool(verify(*pair, timeout_seconds=_timeout()))


# The reward's documented rules (its module docstring) that upstream does not share.
# Rules of shape: they apply when the reply has that shape, and the reward then scores 0.
UNCLOSED_THINK = "an unclosed <think> earns nothing (upstream grades the whole reply)"
BOXED_ONLY = r"only \boxed{} answers are read (upstream also reads an anchored 'the answer is $x$')"
TOO_MANY_BOXES = "more boxed answers than max_boxed score 0 (upstream: no cap)"
TOO_LONG = "a boxed answer longer than max_answer_chars scores 0 (upstream: no cap)"
# Rules of reading: each explains a case only if upstream's call, changed by that rule
# (and by no undocumented one), gives the reward's verdict.
REOPENED_THINK = "a <think> reopened after the last </think> ends the answer (upstream reads on)"
MALFORMED_OPERATORS = r"malformed_operators is on, so \frac12 and \sqrt3 parse (upstream: off)"
GOLD_FIRST = "verify(gold, answer), as math-verify documents (upstream passes the answer first)"
EACH_BOX = "every boxed answer must equal the gold (upstream joins them into one set)"
SPACED_BOX = r"\boxed {x} with a space is a box, as in LaTeX (upstream does not read it)"
READING_RULES = [REOPENED_THINK, SPACED_BOX, MALFORMED_OPERATORS, GOLD_FIRST, EACH_BOX]
_SPACED_BOX = re.compile(r"\\boxed\s+\{")


def _read_as_documented(case: Case, rules: tuple[str, ...]) -> bool:
    """Upstream's verdict with `rules` (some of READING_RULES) applied."""
    from atroposlib.envs.reward_fns.math_verify_reward import boxed_contents, final_answer_region

    text = case.completion
    if REOPENED_THINK in rules:
        text = final_answer_region(text) or ""
    if SPACED_BOX in rules:
        text = _SPACED_BOX.sub(lambda _: "\\boxed{", text)
    options = {
        "malformed_operators": MALFORMED_OPERATORS in rules,
        "gold_first": GOLD_FIRST in rules,
    }
    if EACH_BOX in rules:
        return all(
            reference_verdict(case.gold, rf"\boxed{{{answer}}}", **options)
            for answer in boxed_contents(final_answer_region(text) or "")
        )
    return reference_verdict(case.gold, text, **options)


def _explanation(case: Case, ours: float) -> str | None:
    """The documented rule (or the fewest rules together) that accounts for the reward's
    verdict on `case` differing from upstream's; None if none does."""
    from atroposlib.envs.reward_fns.math_verify_reward import (
        MAX_ANSWER_CHARS,
        MAX_BOXED,
        boxed_contents,
        final_answer_region,
    )

    region = final_answer_region(case.completion)
    answers = boxed_contents(region or "")
    shape = None
    if region is None:
        shape = UNCLOSED_THINK
    elif not answers:
        shape = BOXED_ONLY
    elif len(answers) > MAX_BOXED:
        shape = TOO_MANY_BOXES
    elif any(len(answer) > MAX_ANSWER_CHARS for answer in answers):
        shape = TOO_LONG
    if shape:
        return shape if ours == 0.0 else None
    applicable = [
        rule
        for rule in READING_RULES
        if (rule != REOPENED_THINK or region != case.completion.split("</think>")[-1])
        and (rule != EACH_BOX or len(answers) > 1)
        and (rule != SPACED_BOX or _SPACED_BOX.search(region))
    ]
    for size in range(1, len(applicable) + 1):
        for rules in combinations(applicable, size):
            if float(_read_as_documented(case, rules)) == ours:
                return " + ".join(rules)
    return None


def math_verify_agreement(n: int = 400, seed: int = 27) -> Agreement:
    """The "math_verify" reward against math-verify called as upstream Atropos calls it."""
    from atroposlib.envs.reward_fns.math_verify_reward import MathVerifyReward

    reward = MathVerifyReward()
    agreement = Agreement(
        "math_verify", "math-verify 0.9.0 as upstream Atropos's gsm8k and math servers call it"
    )
    for case in cases(n, seed):
        ours = reward.compute([case.completion], answer=case.gold)[0]
        theirs = float(reference_verdict(case.gold, case.completion))
        why = _explanation(case, ours) if ours != theirs else None
        detail = f"{case!r}: ours {ours}, upstream {theirs}"
        agreement.add(ours == theirs, why, detail)
    return agreement
