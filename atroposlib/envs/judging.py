"""A second model as the reward: judge prompts, verdict parsing, and group scoring.

Design decisions:
- The judge is any OpenAI-compatible chat server in its own `ServerManager`, asked at
  temperature 0; only its text is read.
- Pairwise mode compares each completion with the next one in the group (a ring), in
  both orders, so a judge that prefers whatever comes first cancels out; a
  completion's score is its share of wins (a tie is half a win). That is 2n judge
  calls for n completions instead of n(n-1) for every pair.
- Rating mode asks for a 1-10 rating of each completion, normalised to [0, 1].
- A verdict the parser cannot read (garbled, or naming both sides) counts as a tie or a
  mid rating: a confused judge adds no signal, and never crashes a run. A judge that
  cannot be reached raises `JudgeUnavailable`, and the env drops that group. A judge
  whose context cannot hold the question is no outage: its refusal is raised as it is,
  so the rollout reports it once, as every context refusal is (`rollout_failures.py`).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Literal

from atroposlib.envs.rollout_failures import context_refusal

PAIRWISE_PROMPT = """You compare two assistant replies to the same conversation.

[Conversation]
{prompt}

[Reply A]
{first}

[Reply B]
{second}

Judge which reply is more helpful, correct and clear. Explain briefly, then end with \
your verdict: [[A]] if A is better, [[B]] if B is better, [[C]] for a tie."""

RATING_PROMPT = """You rate an assistant reply to a conversation.

[Conversation]
{prompt}

[Reply]
{reply}

Rate how helpful, correct and clear the reply is from 1 (useless) to 10 (excellent). \
Explain briefly, then end with the rating in double brackets, e.g. [[7]]."""

VERDICT = re.compile(r"\[\[\s*([ABC])\s*\]\]|verdict\s*[:=]?\s*\**\s*([ABC])\b", re.IGNORECASE)
RATING = re.compile(r"\[\[\s*(\d+(?:\.\d+)?)\s*\]\]|rating\s*[:=]\s*(\d+(?:\.\d+)?)", re.I)
NEUTRAL_RATING = 5.5  # the middle of 1..10: what an unreadable rating counts as


class JudgeUnavailable(RuntimeError):
    """The judge server did not answer."""


def parse_verdict(text: str) -> Literal["A", "B", "tie"] | None:
    """'A', 'B' or 'tie' from a judge's reply; None when it names both or neither."""
    found = {(a or b).upper() for a, b in VERDICT.findall(text or "")}
    stripped = (text or "").strip().strip(".*").upper()
    if not found and stripped in {"A", "B", "C"}:
        found = {stripped}
    if len(found) != 1:
        return None
    verdict = found.pop()
    return "tie" if verdict == "C" else verdict


def parse_rating(text: str) -> float | None:
    """The last 1-10 rating in a judge's reply, or None."""
    values = [float(a or b) for a, b in RATING.findall(text or "")]
    return values[-1] if values and 1.0 <= values[-1] <= 10.0 else None


def conversation_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


class GroupJudge:
    """Scores a group's completions with a judge `ServerManager`."""

    def __init__(self, judge: Any, mode: Literal["pairwise", "rating"] = "pairwise") -> None:
        self.judge = judge
        self.mode = mode
        self.unreadable = 0  # verdicts or ratings the parser could not read

    async def _ask(self, content: str, max_tokens: int = 512) -> str:
        try:
            chat = await self.judge.chat_completion(
                messages=[{"role": "user", "content": content}],
                temperature=0.0,
                max_tokens=max_tokens,
                split="eval",
            )
        except Exception as error:  # any transport failure: the judge is unavailable
            if context_refusal(error) is not None:
                raise
            raise JudgeUnavailable(f"the judge did not answer: {error}") from error
        return chat.choices[0].message.content or ""

    async def rate(self, prompt: list[dict[str, Any]], reply: str) -> float:
        """The reply's rating normalised to [0, 1]."""
        answer = await self._ask(
            RATING_PROMPT.format(prompt=conversation_text(prompt), reply=reply)
        )
        rating = parse_rating(answer)
        if rating is None:
            self.unreadable += 1
            rating = NEUTRAL_RATING
        return (rating - 1.0) / 9.0

    async def _wins(self, prompt: str, first: str, second: str) -> float:
        """First's share of this comparison: 1 win, 0.5 tie or unreadable, 0 loss."""
        answer = await self._ask(PAIRWISE_PROMPT.format(prompt=prompt, first=first, second=second))
        verdict = parse_verdict(answer)
        if verdict is None:
            self.unreadable += 1
        return {"A": 1.0, "B": 0.0}.get(verdict or "tie", 0.5)

    async def score_group(self, prompt: list[dict[str, Any]], replies: list[str]) -> list[float]:
        if self.mode == "rating" or len(replies) < 2:
            return list(await asyncio.gather(*(self.rate(prompt, r) for r in replies)))
        text = conversation_text(prompt)
        n = len(replies)
        pairs = [(i, (i + 1) % n) for i in range(n)] if n > 2 else [(0, 1)]
        tasks = []
        for i, j in pairs:
            tasks.append(self._wins(text, replies[i], replies[j]))
            tasks.append(self._wins(text, replies[j], replies[i]))
        outcomes = await asyncio.gather(*tasks)
        wins, games = [0.0] * n, [0] * n
        for (i, j), forward, backward in zip(pairs, outcomes[::2], outcomes[1::2], strict=True):
            wins[i] += forward + (1.0 - backward)
            wins[j] += (1.0 - forward) + backward
            games[i] += 2
            games[j] += 2
        return [w / g for w, g in zip(wins, games, strict=True)]
