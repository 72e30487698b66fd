"""Turn a chat into trainer inputs: token ids plus a mask saying which tokens to train on.

A trainer learns only from what the model produced. The prompt (system line,
user turns, the chat template's role headers) must still be fed in as context,
but its positions must not contribute to the loss. ``tokenize_for_trainer``
renders a chat with the tokenizer's own chat template, tokenizes it once, and
returns ``masks`` aligned with ``tokens``: ``-100`` (the usual ignore index) on
positions not trained, and the token id itself on positions trained.

How the trained span is found: the chat is rendered in full, and the prompt
that precedes a trained message is rendered on its own (the messages before it,
with the generation prompt, i.e. the assistant header, when the message is an
assistant turn). When the prompt's text is a prefix of the full text and its
tokens are a prefix of the full tokens, the boundary is simply the number of
prompt tokens. When they are not (a BPE merge across the boundary, or a
template that renders earlier turns differently once later turns exist), the
boundary is found by character offsets instead: a token lying wholly before
the boundary character belongs to the prompt, and a token straddling it belongs
to the message after it (so the first completion token is trained even when
BPE merged it with the end of the prompt).

With ``finish_reason="length"`` the completion was cut off by the token limit,
so the end-of-sequence token that the chat template appends was never
generated. Training on it would teach the model to stop where it did not. The
trailing EOS is therefore dropped, together with any whitespace-only tokens the
template puts after it (ChatML renders ``<|im_end|>\\n``, so the EOS is followed
by a newline token). Nothing is dropped if the chat does not end that way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["tokenize_for_trainer", "IGNORE_INDEX"]

IGNORE_INDEX = -100
ASSISTANT_ROLES = ("assistant", "agent")


def _render(tokenizer: Any, messages: Sequence[dict], add_generation_prompt: bool) -> str:
    """The chat template's text for `messages`; "" for no messages if the template refuses."""
    try:
        return tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception:
        if messages:
            raise
        return ""


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _common_prefix_len(a: Sequence, b: Sequence) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class _Aligner:
    """Maps rendered prefixes of a chat to token positions in the full chat's tokens."""

    def __init__(self, tokenizer: Any, full_text: str) -> None:
        self.tokenizer = tokenizer
        self.full_text = full_text
        self.tokens = _ids(tokenizer, full_text)
        self._offsets: list[tuple[int, int]] | None = None

    def offsets(self) -> list[tuple[int, int]] | None:
        """Character offsets of the full tokens, or None if the tokenizer cannot give them."""
        if self._offsets is None:
            try:
                enc = self.tokenizer(
                    self.full_text, add_special_tokens=False, return_offsets_mapping=True
                )
            except NotImplementedError:  # slow (Python) tokenizers
                return None
            offsets = [tuple(o) for o in enc["offset_mapping"]]
            if list(enc["input_ids"]) != self.tokens:
                return None
            self._offsets = offsets
        return self._offsets

    def boundary(self, prefix_text: str) -> int:
        """Number of leading full tokens that belong to `prefix_text`."""
        prefix_tokens = _ids(self.tokenizer, prefix_text)
        is_text_prefix = self.full_text.startswith(prefix_text)
        n = len(prefix_tokens)
        if is_text_prefix and self.tokens[:n] == prefix_tokens:
            return n
        char_boundary = (
            len(prefix_text) if is_text_prefix else _common_prefix_len(prefix_text, self.full_text)
        )
        offsets = self.offsets()
        if offsets is None:
            return _common_prefix_len(prefix_tokens, self.tokens)
        for i, (_start, end) in enumerate(offsets):
            if end > char_boundary:
                return i
        return len(self.tokens)

    def message_start(self, chat: Sequence[dict], index: int) -> int:
        """First token of message `index`'s trained span: after the prompt that precedes it.

        For an assistant turn that prompt includes the generation prompt (the
        assistant header), which the model was given rather than produced. If
        the template's generation prompt does not match how this message is
        rendered (e.g. an "agent" role), the header is not known and the span
        starts right after the previous message.
        """
        with_header = _render(self.tokenizer, chat[:index], add_generation_prompt=True)
        if self.full_text.startswith(with_header):
            return self.boundary(with_header)
        return self.boundary(_render(self.tokenizer, chat[:index], add_generation_prompt=False))

    def message_end(self, chat: Sequence[dict], index: int) -> int:
        """One past the last token of message `index` (its template suffix included)."""
        if index == len(chat) - 1:
            return len(self.tokens)
        return self.boundary(
            _render(self.tokenizer, chat[: index + 1], add_generation_prompt=False)
        )


def strip_cut_off_eos(tokenizer: Any, tokens: list[int], masks: list[int]) -> None:
    """Drop a trailing EOS (and whitespace-only tokens after it) in place."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return
    j = len(tokens) - 1
    while j >= 0 and tokens[j] != eos and tokenizer.decode([tokens[j]]).strip() == "":
        j -= 1
    if j >= 0 and tokens[j] == eos:
        del tokens[j:]
        del masks[j:]


def tokenize_for_trainer(
    tokenizer: Any,
    chat: Sequence[dict],
    include_messages: bool = False,
    train_on_all_assistant_turns: bool = False,
    finish_reason: str = "",
) -> dict[str, Any]:
    """Tokenize `chat` with its chat template and mask what the trainer must not learn.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        chat: the messages (``{"role": ..., "content": ...}``), the completion last.
        include_messages: also return the chat under ``"messages"``.
        train_on_all_assistant_turns: train on every assistant (and "agent")
            turn instead of the last message only.
        finish_reason: the completion's finish reason; ``"length"`` drops the
            trailing EOS the template added (see the module docstring).

    Returns:
        ``{"tokens": [...], "masks": [...]}``, equal lengths; a mask is ``-100``
        where not trained and the token id where trained.
    """
    if not chat:
        raise ValueError("tokenize_for_trainer needs at least one message")
    messages = [dict(m) for m in chat]
    aligner = _Aligner(tokenizer, _render(tokenizer, messages, add_generation_prompt=False))
    tokens = list(aligner.tokens)
    masks = [IGNORE_INDEX] * len(tokens)

    if train_on_all_assistant_turns:
        trained = [i for i, m in enumerate(messages) if m.get("role") in ASSISTANT_ROLES]
    else:
        trained = [len(messages) - 1]
    for index in trained:
        start = aligner.message_start(messages, index)
        end = aligner.message_end(messages, index)
        for pos in range(start, end):
            masks[pos] = tokens[pos]

    if finish_reason == "length":
        strip_cut_off_eos(tokenizer, tokens, masks)

    result: dict[str, Any] = {"tokens": tokens, "masks": masks}
    if include_messages:
        result["messages"] = chat
    return result
