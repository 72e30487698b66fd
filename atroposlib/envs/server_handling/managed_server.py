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
whose every assistant turn is trained on. The first sample replaces the node in
place and further samples (n > 1, or another branch of the same node sampled
concurrently) are appended.

Like upstream: a fresh prompt is encoded with the tokenizer's special tokens
(BOS on Llama-style tokenizers) and a doubled BOS (a chat template that writes
one) is dropped; the suffix of an extended node is encoded without them.
`tools` / `tool_choice` are dropped (upstream handles them only with a vLLM
tool-call parser, which this package does not have), with a warning.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

from atroposlib.envs.server_handling.server_baseline import APIServer
from atroposlib.envs.server_handling.vllm_server import encode_prompt
from atroposlib.utils.openai_shapes import chat_choice, completion_body, text_choice

logger = logging.getLogger("atroposlib.inference")

TOOL_KWARGS = ("tools", "tool_choice", "parallel_tool_calls")


@dataclass
class SequenceNode:
    full_text: str
    tokens: list[int]
    masked_tokens: list[int]
    logprobs: list[float]
    metadata: dict[str, Any] = field(default_factory=dict)


class ManagedServer:
    warned_about_tools = False  # once per process: a managed server lives for one rollout

    def __init__(self, server: APIServer | Any, tokenizer: Any = None) -> None:
        """`server`: an APIServer or a ServerManager (anything with token-level calls).

        Without `tokenizer`, the server's is used (`tokenizer_name`, else `model_name`);
        ValueError if that cannot be loaded.
        """
        self.server = server
        self.tokenizer = tokenizer if tokenizer is not None else getattr(server, "tokenizer", None)
        if self.tokenizer is None:
            raise ValueError("ManagedServer needs a tokenizer: pass tokenizer=")
        self.nodes: list[SequenceNode] = []

    def get_state(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes)}

    def reset(self) -> None:
        self.nodes = []

    async def chat_completion(
        self, messages: list[dict[str, Any]], **kwargs: Any
    ) -> ChatCompletion:
        dropped = [name for name in TOOL_KWARGS if kwargs.pop(name, None) is not None]
        if dropped and not ManagedServer.warned_about_tools:
            ManagedServer.warned_about_tools = True
            logger.warning(
                "ManagedServer has no tool-call parser: %s ignored (the prompt is rendered "
                "without tools and tool calls stay in the text)",
                ", ".join(dropped),
            )
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

    def _encode_suffix(self, text: str) -> list[int]:
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
            prompt_ids = encode_prompt(self.tokenizer, prompt)
        else:
            prefix_ids = parent.tokens
            prompt_ids = prefix_ids + self._encode_suffix(prompt[len(parent.full_text) :])
        skip = ("messages", "prompt", "input_ids", "logprobs")
        kwargs = {k: v for k, v in kwargs.items() if k not in skip}
        _, outputs, logprobs, finishes = await self.server.tokens_and_logprobs_completion(
            prompt=prompt_ids, **kwargs
        )
        new_prompt = len(prompt_ids) - len(prefix_ids)
        base_masks = (parent.masked_tokens if parent else []) + [-100] * new_prompt
        base_logprobs = (parent.logprobs if parent else []) + [1.0] * new_prompt
        # Found before the await: a concurrent branch may have replaced it meanwhile.
        slot = next((i for i, n in enumerate(self.nodes) if n is parent), None)
        samples = []
        for output, output_logprobs, finish in zip(outputs, logprobs, finishes, strict=True):
            raw_text = self.tokenizer.decode(output, skip_special_tokens=False)
            node = SequenceNode(
                full_text=prompt + raw_text,
                tokens=prompt_ids + output,
                masked_tokens=base_masks + output,
                logprobs=base_logprobs + output_logprobs,
                metadata={"finish_reason": finish, "kind": kind},
            )
            if slot is not None:
                self.nodes[slot] = node
                slot = None
            else:
                self.nodes.append(node)
            samples.append((self.tokenizer.decode(output, skip_special_tokens=True), finish))
        return samples


def _openai_finish(reason: str | None) -> str:
    return reason if reason in ("stop", "length", "tool_calls", "content_filter") else "stop"
