"""`ManagedServer`: completions that remember exactly which tokens were sampled.

Environments need, for every rollout, the token ids the policy saw and produced,
which of them to train on, and the sampling logprobs. Re-tokenising text after
the fact can split tokens differently from how they were sampled, so this
wrapper works in token ids end to end: it renders the prompt (chat template),
sends token ids to a vLLM-compatible server, and records per sample a
`SequenceNode` with

- `tokens` = prompt ids + completion ids,
- `masked_tokens` = -100 on prompt positions, the token id on completion ones,
- `logprobs` = 1.0 on prompt positions, the sampling logprob on completion ones.

Multi-turn: when a new prompt's text starts with an existing node's full text,
that node is extended (its tokens, masks and logprobs are kept, the new prompt
suffix is appended masked), so an agent's whole conversation is one sequence
whose every assistant turn is trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

from atroposlib.envs.server_handling.server_baseline import APIServer
from atroposlib.utils.openai_shapes import chat_choice, completion_body, text_choice


@dataclass
class SequenceNode:
    full_text: str
    tokens: list[int]
    masked_tokens: list[int]
    logprobs: list[float]
    metadata: dict[str, Any] = field(default_factory=dict)


class ManagedServer:
    def __init__(self, server: APIServer | Any, tokenizer: Any) -> None:
        """`server`: an APIServer or a ServerManager (anything with token-level calls)."""
        self.server = server
        self.tokenizer = tokenizer
        self.nodes: list[SequenceNode] = []

    def get_state(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes)}

    def reset(self) -> None:
        self.nodes = []

    async def chat_completion(
        self, messages: list[dict[str, Any]], **kwargs: Any
    ) -> ChatCompletion:
        prompt = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        samples = await self._sample(prompt, kwargs, kind="chat")
        choices = [chat_choice(i, text, _openai_finish(r)) for i, (text, r) in enumerate(samples)]
        return ChatCompletion.model_validate(completion_body("chat", self._model(kwargs), choices))

    async def completion(self, prompt: str, **kwargs: Any) -> Completion:
        samples = await self._sample(prompt, kwargs, kind="completion")
        choices = [text_choice(i, text, _openai_finish(r)) for i, (text, r) in enumerate(samples)]
        return Completion.model_validate(completion_body("text", self._model(kwargs), choices))

    def _model(self, kwargs: dict[str, Any]) -> str:
        return kwargs.get("model", self.server.config.model_name)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _find_parent(self, prompt: str) -> SequenceNode | None:
        candidates = [n for n in self.nodes if prompt.startswith(n.full_text)]
        return max(candidates, key=lambda n: len(n.full_text), default=None)

    async def _sample(
        self, prompt: str, kwargs: dict[str, Any], kind: str
    ) -> list[tuple[str, str]]:
        parent = self._find_parent(prompt)
        if parent is None:
            prefix_ids: list[int] = []
            prompt_ids = self._encode(prompt)
        else:
            prefix_ids = parent.tokens
            prompt_ids = prefix_ids + self._encode(prompt[len(parent.full_text) :])
        kwargs = {k: v for k, v in kwargs.items() if k not in ("messages", "prompt", "logprobs")}
        _, outputs, logprobs, finishes = await self.server.tokens_and_logprobs_completion(
            prompt=prompt_ids, **kwargs
        )
        new_prompt = len(prompt_ids) - len(prefix_ids)
        base_masks = (parent.masked_tokens if parent else []) + [-100] * new_prompt
        base_logprobs = (parent.logprobs if parent else []) + [1.0] * new_prompt
        if parent is not None:
            self.nodes.remove(parent)
        samples = []
        for output, output_logprobs, finish in zip(outputs, logprobs, finishes, strict=True):
            raw_text = self.tokenizer.decode(output, skip_special_tokens=False)
            self.nodes.append(
                SequenceNode(
                    full_text=prompt + raw_text,
                    tokens=prompt_ids + output,
                    masked_tokens=base_masks + output,
                    logprobs=base_logprobs + output_logprobs,
                    metadata={"finish_reason": finish, "kind": kind},
                )
            )
            samples.append((self.tokenizer.decode(output, skip_special_tokens=True), finish))
        return samples


def _openai_finish(reason: str | None) -> str:
    return reason if reason in ("stop", "length", "tool_calls", "content_filter") else "stop"
