"""Groups from `/batch` as HTML: the prompt once, then each completion with its score.

The completions, their scores and the red-to-green colouring come from the static jsonl
viewer (`atroposlib.viewer.jsonl2html.create_html_for_group`), so the two viewers cannot
drift apart; this module only turns token ids into what that renderer takes. The prompt
is the start that every sequence shares and none trains on (mask -100), which is exact
where upstream's common *text* prefix would also swallow a shared first word of the
answers. Tokens masked later in a completion (tool output, earlier turns) are shown as
their own labelled segments, so one can see what the trainer learns from. Nothing here
needs Gradio, so it is tested without a browser.
"""

from __future__ import annotations

import base64
import binascii
import html
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from pydantic import BaseModel

from atroposlib.viewer.jsonl2html import CSS, create_html_for_group

MASKED = -100
"""The mask value of a token the trainer does not learn from."""

MASKED_ROLE = "masked (not trained)"
TRAINED_ROLE = "trained"
NO_MESSAGES = (
    "no messages with scores recorded: start the viewer with --tokenizer (the run's "
    "model) to decode this group's tokens"
)

SCOPE = ".atropos-view"

_EXTRA_CSS = """
.view-group { margin-bottom: 1.5em; }
.prompt { margin: 0.6em 1em; padding: 0.5em; border: 1px dashed #999; background: #fff; }
.images { margin: 0 1em; }
.images img { max-width: 320px; max-height: 320px; margin: 0.3em; border: 1px solid #ccc; }
.note { color: #555; font-style: italic; margin: 0.3em 1em; }
.notice { padding: 0.6em 1em; border-radius: 4px; margin-bottom: 1em; font-weight: bold; }
.notice-error { background: #fde2e2; color: #7a1010; }
.notice-waiting, .notice-warning { background: #fff4d6; color: #6b4e00; }
.notice-ok { background: #e2f5e2; color: #185c18; }
"""

_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


class Decoder(Protocol):
    """Anything with a Hugging Face tokenizer's `decode`."""

    def decode(self, token_ids: list[int]) -> str: ...


def scoped_css(css: str = CSS + _EXTRA_CSS, scope: str = SCOPE) -> str:
    """The viewer's one-rule-per-line CSS confined to `scope` (its `body` rule becomes `scope`).

    Inside a Gradio page the jsonl viewer's `body` rule would restyle the whole app.
    """
    rules = []
    for line in css.strip().splitlines():
        if "{" not in line:
            continue
        selectors, body = line.split("{", 1)
        scoped = [
            scope if s.strip() == "body" else f"{scope} {s.strip()}" for s in selectors.split(",")
        ]
        rules.append(f"{', '.join(scoped)} {{{body}")
    return "\n".join(rules)


def as_group_dict(group: Any) -> dict[str, Any]:
    """A group as a plain dict, whether it came as `ScoredData` or as parsed JSON."""
    if isinstance(group, BaseModel):
        return group.model_dump()
    return dict(group) if isinstance(group, dict) else {}


def _leading_masked(mask: Sequence[int]) -> int:
    count = 0
    for value in mask:
        if value != MASKED:
            break
        count += 1
    return count


def _common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    shortest = min(len(s) for s in sequences)
    for position in range(shortest):
        first = sequences[0][position]
        if any(s[position] != first for s in sequences[1:]):
            return position
    return shortest


def prompt_length(tokens: Sequence[Sequence[int]], masks: Sequence[Sequence[int]]) -> int:
    """How many leading tokens form the prompt shared by every sequence of a group.

    The masked start common to all sequences; without masks, the common token prefix
    (zero when it would leave a sequence with no completion at all).
    """
    if not tokens:
        return 0
    shared = _common_prefix_length(tokens)
    if masks and len(masks) >= len(tokens):
        masked = min(_leading_masked(mask) for mask in masks[: len(tokens)])
        if masked:
            return min(shared, masked)
    if len(tokens) < 2 or shared == min(len(t) for t in tokens):
        return 0
    return shared


def safe_decode(decoder: Decoder, token_ids: Sequence[int]) -> str:
    """Decoded text, or a bracketed note when the tokenizer cannot decode these ids."""
    if not token_ids:
        return ""
    try:
        return decoder.decode(list(token_ids))
    except Exception as error:
        return f"[{len(token_ids)} tokens could not be decoded: {error}]"


def completion_view(
    decoder: Decoder, tokens: Sequence[int], mask: Sequence[int], start: int
) -> str | list[dict[str, str]]:
    """The completion after `start`: its text, or labelled masked/trained segments.

    A completion the trainer learns from entirely is one text; otherwise each run of
    masked or trained tokens becomes a message whose role says which it is, which the
    jsonl viewer renders with that label.
    """
    rest = list(tokens[start:])
    flags = [
        (mask[start + i] == MASKED) if start + i < len(mask) else False for i in range(len(rest))
    ]
    if not any(flags):
        return safe_decode(decoder, rest)
    segments: list[dict[str, str]] = []
    run_start = 0
    for position in range(1, len(rest) + 1):
        if position == len(rest) or flags[position] != flags[run_start]:
            role = MASKED_ROLE if flags[run_start] else TRAINED_ROLE
            text = safe_decode(decoder, rest[run_start:position])
            segments.append({"role": role, "content": text})
            run_start = position
    return segments


def image_data_uri(value: Any) -> str | None:
    """A `data:` URI for an image given as base64 (raw or as a data URI); None otherwise."""
    if isinstance(value, dict):  # OpenAI content part: {"type": "image_url", "image_url": {...}}
        inner = value.get("image_url", value.get("url"))
        value = inner.get("url") if isinstance(inner, dict) else inner
    if not isinstance(value, str) or not value.strip():
        return None
    payload = value.strip()
    if payload.startswith("data:"):
        header, _, payload = payload.partition(",")
        if ";base64" not in header:
            return None
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None
    for magic, mime in _IMAGE_MAGIC:
        if raw.startswith(magic):
            return f"data:{mime};base64,{payload}"
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return f"data:image/webp;base64,{payload}"
    return None


def _flatten(value: Any) -> Iterable[Any]:
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flatten(item)
    elif value is not None:
        yield value


def group_images(group: dict[str, Any]) -> tuple[list[str], int]:
    """The group's displayable images as data URIs (each once), and how many were not."""
    shown: list[str] = []
    unusable = 0
    for value in _flatten(group.get("images")):
        uri = image_data_uri(value)
        if uri is None:
            unusable += 1
        elif uri not in shown:
            shown.append(uri)
    return shown, unusable


def _note(text: str) -> str:
    return f'<div class="note">{html.escape(text)}</div>'


def _images_html(group: dict[str, Any], show_images: bool) -> str:
    uris, unusable = group_images(group)
    parts = []
    if uris and show_images:
        tags = "".join(f'<img src="{uri}" alt="image {i}">' for i, uri in enumerate(uris))
        parts.append(f'<div class="images">{tags}</div>')
    elif uris:
        parts.append(_note(f"{len(uris)} image(s) attached: view-run-multimodal shows them"))
    if unusable:
        entries = "1 image entry is" if unusable == 1 else f"{unusable} image entries are"
        parts.append(_note(f"{entries} not base64 PNG/JPEG/GIF/WebP"))
    return "".join(parts)


def render_group(group: Any, index: int, decoder: Decoder, show_images: bool = False) -> str:
    """One group: its prompt and images once, then the jsonl viewer's scored completions."""
    data = as_group_dict(group)
    tokens = [list(t) for t in data.get("tokens") or []]
    masks = [list(m) for m in data.get("masks") or []]
    scores = list(data.get("scores") or [])
    notes = []
    if len(tokens) != len(scores) or (masks and len(masks) != len(tokens)):
        notes.append(
            f"mismatched lengths: {len(tokens)} token lists, {len(masks)} masks, "
            f"{len(scores)} scores; showing the first {min(len(tokens), len(scores))}"
        )
    start = prompt_length(tokens, masks)
    prompt = safe_decode(decoder, tokens[0][:start]) if tokens else ""
    completions = [
        completion_view(decoder, seq, masks[i] if i < len(masks) else [], start)
        for i, seq in enumerate(tokens)
    ]
    body = create_html_for_group({"messages": completions, "scores": scores}, index)
    if not body:
        notes.append("no sequences with scores to show")
    env = data.get("env_id")
    label = "Prompt" + (f" (env {env})" if env is not None else "")
    extras = (
        f'<div class="prompt"><span class="role">{html.escape(label)}:</span>'
        f'<div class="content">{html.escape(prompt) or "(no shared prompt)"}</div></div>'
        f"{_images_html(data, show_images)}{''.join(_note(n) for n in notes)}"
    )
    return _section(index, body, extras)


def _section(index: int, body: str, extras: str) -> str:
    inner = _after_header(body, extras)
    return f'<section class="view-group" id="view-group-{index}">{inner}</section>'


def render_recorded_group(group: Any, index: int, show_images: bool = False) -> str:
    """One group by the `messages` its environment recorded, so no tokenizer is needed:
    the jsonl viewer draws what every conversation starts with once, then each reply
    with its score. Images as `render_group` shows them."""
    data = as_group_dict(group)
    body = create_html_for_group(data, index)
    notes = "" if body else _note(NO_MESSAGES)
    return _section(index, body, _images_html(data, show_images) + notes)


def render_recorded(
    group: Any, index: int, decoder: Decoder | None, show_images: bool = False
) -> str:
    """A group from a run's files, in the viewer's scope: its tokens decoded when a
    tokenizer was given, else the messages its environment recorded."""
    if decoder is not None:
        inner = render_group(group, index, decoder, show_images)
    else:
        inner = render_recorded_group(group, index, show_images)
    return f'<div class="{SCOPE[1:]}">{inner}</div>'


def _after_header(group_html: str, extras: str) -> str:
    """`extras` placed inside the jsonl viewer's group box, right under its header."""
    header = group_html.find('class="group-header"')
    end = group_html.find("</div>", header) if header >= 0 else -1
    if end < 0:
        return extras + group_html
    cut = end + len("</div>")
    return group_html[:cut] + extras + group_html[cut:]


def render_batch(groups: Sequence[Any], decoder: Decoder, show_images: bool = False) -> str:
    """Every group of one batch, inside the element the scoped CSS applies to."""
    count = sum(len(as_group_dict(g).get("tokens") or []) for g in groups)
    header = f"<p>{len(groups)} group(s), {count} sequence(s)</p>"
    rendered = "".join(
        render_group(group, i, decoder, show_images) for i, group in enumerate(groups)
    )
    return f'<div class="{SCOPE[1:]}">{header}{rendered}</div>'


def render_notice(kind: str, message: str) -> str:
    """A status line: kind is "error", "waiting", "warning" or "ok"."""
    return (
        f'<div class="{SCOPE[1:]}"><div class="notice notice-{html.escape(kind)}">'
        f"{html.escape(message)}</div></div>"
    )
