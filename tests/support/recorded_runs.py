"""A finished run's rollouts, written as an `atropos-launch` run's environments write them.

Each group is built by the environments' own code (`group_from_chat`, as a single-turn
environment sends a prompt's samples; `append_groups`, the `data_path_to_save_groups`
writer) with the fields `kept_groups` adds (env_id, group id). Token ids are a byte-level
"tokenizer" (one id per UTF-8 byte, `ByteDecoder` reads them back), so the tests know
exactly what decoding shows without loading a model.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from atroposlib.envs.scored_data import group_from_chat
from atroposlib.envs.sending import append_groups
from atroposlib.protocol import GROUP_ID_FIELD
from tests.support.text_groups import MASKED, png_base64

SYSTEM = "Answer with one digit."
ARITHMETIC = [
    ("What is 3 + 9 mod 10?", ["2", "12", "2", "7"], [1.0, 0.0, 1.0, 0.0]),
    ("What is 4 + 4 mod 10?", ["8", "8", "0", "8"], [1.0, 1.0, 0.0, 1.0]),
    ("What is 7 + 6 mod 10?", ["1", "3", "13", "1"], [0.5, 0.0, 0.0, 1.0]),
]
COUNTING = [
    ("How many shapes are in the picture?", ["3", "4"], [1.0, 0.0], (200, 30, 30)),
    ("How many shapes are in the picture?", ["2", "2"], [1.0, 1.0], (30, 30, 200)),
]
BAD_LINES = [b'{"tokens": [[1, 2]], "sco\n', b"\xff\xfe not utf-8\n", b"[1, 2]\n"]
"""A line a crash cut short, bytes that are not UTF-8, JSON that is not a group."""


class ByteDecoder:
    """Reads back the byte-level ids of this module's groups."""

    def decode(self, token_ids: list[int]) -> str:
        return bytes(token_ids).decode("utf-8", errors="replace")


def _ids(text: str) -> list[int]:
    return list(text.encode())


def chat_group(
    question: str, replies: list[str], scores: list[float], env_id: int = 0
) -> dict[str, Any]:
    """One prompt's samples as a single-turn environment sends them."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    prompt = _ids(f"<system>{SYSTEM}\n<user>{question}\n<assistant>")
    nodes = [
        SimpleNamespace(
            tokens=prompt + _ids(reply),
            masked_tokens=[MASKED] * len(prompt) + _ids(reply),
            logprobs=[1.0] * len(prompt) + [-0.5] * len(_ids(reply)),
            metadata=None,
        )
        for reply in replies
    ]
    group: dict[str, Any] = dict(group_from_chat(messages, list(replies), nodes, scores))
    group["env_id"] = env_id
    group[GROUP_ID_FIELD] = uuid.uuid4().hex
    return group


def write_run(run_dir: Path) -> Path:
    """`run_dir` as a two-environment launch leaves it (arithmetic, then a picture-counting
    environment whose groups carry images), with three bad lines in the first file."""
    rollouts = run_dir / "rollouts"
    append_groups(str(rollouts / "mod_arithmetic.jsonl"), [chat_group(*row) for row in ARITHMETIC])
    with open(rollouts / "mod_arithmetic.jsonl", "ab") as out:
        out.writelines(BAD_LINES)
    counting = []
    for question, replies, scores, colour in COUNTING:
        group = chat_group(question, replies, scores, env_id=1)
        group["images"] = [png_base64(colour, size=10)] * len(replies)
        counting.append(group)
    append_groups(str(rollouts / "multimodal_counting.jsonl"), counting)
    (run_dir / "config.yaml").write_text("model: tiny\n")
    return run_dir
