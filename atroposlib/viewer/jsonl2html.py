"""Render a jsonl of scored rollout groups as one self-contained HTML page.

`process` writes every scored group it produces to a jsonl file, one JSON object per line.
That format is convenient for machines but hard to read; this module turns it into a
static page (inline CSS, no scripts, no external assets) where each group shows its
sequences next to their scores, colored from red (worst in the group) to green (best), so
a human can quickly judge what the environment rewarded. A group is N completions of one
prompt, so the start its samples share is drawn once above them, not N times.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CSS = """
body { font-family: sans-serif; margin: 1.5em; background: #fafafa; color: #222; }
.group { border: 1px solid #ccc; border-radius: 6px; margin-bottom: 1.5em; background: #fff; }
.group-header { background: #eee; padding: 0.5em 1em; font-weight: bold; }
.item { margin: 0.6em 1em; padding: 0.5em; border-left: 6px solid #999; border-radius: 4px; }
.reward-positive { border-left-color: #2a2; }
.reward-negative { border-left-color: #c22; }
.score { font-weight: bold; margin-bottom: 0.3em; }
.message { margin: 0.3em 0; }
.role { font-weight: bold; color: #335; }
.content { white-space: pre-wrap; word-wrap: break-word; font-family: monospace; }
.shared-prompt { margin: 0.6em 1em; padding: 0.5em; border: 1px dashed #999; background: #f6f6fa; }
.shared-label { font-style: italic; color: #555; margin-bottom: 0.3em; }
"""

LINE_SLACK = 80
"""A text prompt is cut after its last line break unless that gives each completion back
more than this many characters of it; then after its last space."""

NEUTRAL_COLOR = "hsl(0, 0%, 94%)"


def get_score_class(score: Any) -> str:
    """The CSS class of a score by its sign; "" when it is not a number."""
    try:
        value = float(score)
    except (TypeError, ValueError):
        return ""
    if value > 0:
        return "reward-positive"
    if value < 0:
        return "reward-negative"
    return "reward-zero"


def _score_color(score: float, low: float, high: float) -> str:
    """A background color from red (low) to green (high); neutral when all scores are equal."""
    if high <= low:
        return NEUTRAL_COLOR
    fraction = (score - low) / (high - low)
    return f"hsl({round(120 * fraction)}, 70%, 88%)"


def _content_text(content: Any) -> str:
    """Plain text of a message content: a string, or a list of OpenAI content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if part.get("type", "text") == "text":
                    parts.append(str(part.get("text", "")))
                else:
                    parts.append(f"[{part.get('type')}]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return str(content)


def _render_message(message: Any) -> str:
    """One chat message with a capitalised role label, or a bare text."""
    if isinstance(message, dict):
        role = html.escape(str(message.get("role", "unknown")).capitalize())
        text = html.escape(_content_text(message.get("content")))
        return (
            f'<div class="message"><span class="role">{role}:</span>'
            f'<div class="content">{text}</div></div>'
        )
    return f'<div class="content">{html.escape(_content_text(message))}</div>'


def _render_sequence(sequence: Any) -> str:
    """A sequence is either a text or a conversation (a list of messages)."""
    if isinstance(sequence, list):
        return "".join(_render_message(message) for message in sequence)
    return _render_message(sequence)


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _shared_messages(sequences: Sequence[Any]) -> int:
    """How many leading messages every conversation shares, leaving each at least one."""
    if len(sequences) < 2 or not all(isinstance(s, list) and s for s in sequences):
        return 0
    shortest = min(len(s) for s in sequences)
    shared = 0
    while shared < shortest - 1 and all(s[shared] == sequences[0][shared] for s in sequences):
        shared += 1
    return shared


def _lone_user_texts(sequences: Sequence[Any]) -> list[str] | None:
    """Each sample's text when each is one user message (decoded prompt+completion tokens)."""
    if len(sequences) < 2:
        return None
    texts = []
    for sequence in sequences:
        if not (isinstance(sequence, list) and len(sequence) == 1):
            return None
        message = sequence[0]
        if not (isinstance(message, dict) and message.get("role") == "user"):
            return None
        texts.append(_content_text(message.get("content")))
    return texts


def shared_text_prefix(texts: Sequence[str]) -> str:
    """The longest start of every text that ends at a line or word boundary.

    A cut mid-word would give the prompt the first letters of the answers; a cut after the
    last line break (the chat template's "assistant" line) is preferred when it is near.
    """
    prefix = os.path.commonprefix(list(texts))
    if not prefix:
        return ""
    line = prefix.rfind("\n")
    if line >= 0 and len(prefix) - line - 1 <= LINE_SLACK:
        cut = prefix[: line + 1]
    elif prefix[-1].isspace() or all(
        len(text) == len(prefix) or text[len(prefix)].isspace() for text in texts
    ):
        cut = prefix
    else:
        space = max(prefix.rfind(" "), prefix.rfind("\t"))
        cut = prefix[: space + 1] if space >= 0 else ""
    return cut if cut.strip() else ""


def _item(position: int, body: str, score: float, raw_score: Any, low: float, high: float) -> str:
    classes = " ".join(filter(None, ["item", get_score_class(raw_score)]))
    return (
        f'<div class="{classes}" style="background: {_score_color(score, low, high)};">'
        f'<div class="score">#{position} &middot; score {html.escape(f"{score:.4g}")}</div>'
        f"{body}</div>"
    )


def _split_shared(sequences: Sequence[Any]) -> tuple[str, list[str]] | None:
    """The HTML of the shared start and of each sample's rest; None when nothing is shared."""
    shared = _shared_messages(sequences)
    if shared:
        return (
            _render_sequence(list(sequences[0][:shared])),
            [_render_sequence(list(sequence[shared:])) for sequence in sequences],
        )
    texts = _lone_user_texts(sequences)
    prefix = shared_text_prefix(texts) if texts else ""
    if not texts or not prefix:
        return None
    rests = [text[len(prefix) :] for text in texts]
    return (
        _render_message({"role": "user", "content": prefix}),
        [f'<div class="content">{html.escape(rest)}</div>' for rest in rests],
    )


def create_html_for_group(group_data: dict[str, Any], index: int) -> str:
    """The HTML of one group; the empty string when it has no messages or no scores.

    The messages every sample starts with (or, for samples that are one decoded user
    message each, their common text up to a line or word boundary) are drawn once as the
    group's prompt; each item then holds only what follows. With nothing shared, each
    item holds its whole sequence.
    """
    messages: Sequence[Any] = group_data.get("messages") or []
    raw_scores: Sequence[Any] = group_data.get("scores") or []
    count = min(len(messages), len(raw_scores))
    if count == 0:
        return ""
    sequences = list(messages[:count])
    scores = [_as_float(score) for score in raw_scores[:count]]
    low, high = min(scores), max(scores)
    mean = sum(scores) / count
    header = (
        f'<div class="group-header">Group {index} &middot; {count} sequences &middot; '
        f"mean {mean:.4g} &middot; min {low:.4g} &middot; max {high:.4g}</div>"
    )
    split = _split_shared(sequences)
    if split is None:
        prompt, bodies = "", [_render_sequence(sequence) for sequence in sequences]
    else:
        prompt = (
            f'<div class="shared-prompt"><div class="shared-label">Shared by all '
            f"{count} samples:</div>{split[0]}</div>"
        )
        bodies = split[1]
    items = [
        _item(position, body, scores[position], raw_scores[position], low, high)
        for position, body in enumerate(bodies)
    ]
    return f'<div class="group" id="group-{index}">{header}{prompt}{"".join(items)}</div>'


def read_groups(path: Path) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """The groups of a jsonl file, and (line number, why) for each line skipped.

    A line cut by a crash, bytes that are not UTF-8 or JSON that is not an object are
    skipped and counted rather than stopping the reader: a run's file may be read while
    it is written, or after the writer died mid-line. Blank lines are ignored.
    """
    groups: list[dict[str, Any]] = []
    skipped: list[tuple[int, str]] = []
    with path.open("rb") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                group = json.loads(line.decode("utf-8"))
            except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
                skipped.append((line_number, str(error)))
                continue
            if not isinstance(group, dict):
                skipped.append((line_number, "not an object"))
                continue
            groups.append(group)
    return groups, skipped


def _read_groups(path: Path) -> list[dict[str, Any]]:
    """Parse the jsonl, skipping blank lines and warning about (and skipping) bad ones."""
    groups, skipped = read_groups(path)
    for line_number, why in skipped:
        print(f"Warning: skipping line {line_number} of {path}: {why}", file=sys.stderr)
    return groups


def generate_html(input_path: str | Path, output_path: str | Path | None = None) -> Path:
    """Write the HTML page of every group in `input_path`; returns the output path."""
    source = Path(input_path)
    if not source.is_file():
        print(f"Error: input file not found: {source}", file=sys.stderr)
        sys.exit(1)
    target = Path(output_path) if output_path is not None else source.with_suffix(".html")
    groups = _read_groups(source)
    body = "\n".join(create_html_for_group(group, i) for i, group in enumerate(groups))
    title = html.escape(f"Rollouts: {source.name}")
    page = (
        '<!DOCTYPE html>\n<html>\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        f"<h1>{title}</h1>\n<p>{len(groups)} groups</p>\n{body}\n</body>\n</html>\n"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    return target


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``INPUT [OUTPUT]`` or ``INPUT --output OUTPUT``; prints the written path."""
    parser = argparse.ArgumentParser(description="Render a jsonl of scored groups as HTML.")
    parser.add_argument("input", help="jsonl file written by `process`")
    parser.add_argument("output", nargs="?", default=None, help="HTML path (default: INPUT.html)")
    parser.add_argument(
        "--output",
        "--output-path",
        "--output_path",
        "-o",
        dest="output_option",
        metavar="OUTPUT",
        default=None,
        help="HTML path, as an option",
    )
    args = parser.parse_args(argv)
    if args.output and args.output_option and args.output != args.output_option:
        parser.error(
            f"two different output paths given: {args.output!r} and --output {args.output_option!r}"
        )
    print(generate_html(args.input, args.output or args.output_option))


if __name__ == "__main__":
    main()
