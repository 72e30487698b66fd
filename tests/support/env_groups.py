"""Checks every library environment's groups must pass, kept in one place.

A single-turn chat group is right when each sequence is the rendered prompt (the chat
template with the generation prompt) followed by the sampled completion, the prompt
masked with -100 and the completion trained on with its own ids.
"""

from __future__ import annotations

from typing import Any


def assert_prompt_masked(group: dict[str, Any], tokenizer: Any) -> None:
    """Masks are -100 exactly on the rendered prompt, the completion's own ids after it."""
    for tokens, masks, messages in zip(
        group["tokens"], group["masks"], group["messages"], strict=True
    ):
        rendered = tokenizer.apply_chat_template(
            messages[:-1], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer(rendered)["input_ids"]
        assert tokens[: len(prompt)] == prompt
        assert masks[: len(prompt)] == [-100] * len(prompt)
        assert masks[len(prompt) :] == tokens[len(prompt) :] and len(tokens) > len(prompt)
