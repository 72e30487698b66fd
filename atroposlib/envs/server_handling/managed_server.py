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
concurrently) are appended. With `track_tree=True` (upstream's tree mode) nodes
are instead keyed by full text and a prompt continues a node only on an exact match.

Tools (`tools=`, `tool_choice=`) need a `tool_parser` (upstream's rule: without one
they are dropped, here with a warning): the tools are rendered into the prompt (see
`chat_prompt`), the completion's calls come back in `message.tool_calls` with
finish_reason "tool_calls", and nodes keep the raw text the model wrote. Without
an explicit `tool_parser`, the wrapped server's `tool_parser` attribute is used, so
`server_manager.tool_parser = "hermes"` (as upstream environments set it) works.

`token_budget=N` bounds what the nodes hold: a request is sent only when its worst case,
`n` x (prompt ids + `max_tokens`), fits in what is left (a node it extends is freed),
with `max_tokens` cut to fit; else `TokenBudgetSpent`. The proxy gives each session one.

Like upstream: a fresh prompt is encoded with the tokenizer's special tokens
(BOS on Llama-style tokenizers) and a doubled BOS (a chat template that writes
one) is dropped; the suffix of an extended node is encoded without them.
"""

from __future__ import annotations

import logging
from typing import Any

from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

from atroposlib.envs.server_handling.chat_prompt import render_prompt, template_renders_tools
from atroposlib.envs.server_handling.dummy_managed_server import DummyManagedServer
from atroposlib.envs.server_handling.managed_server_adapter import ManagedServerAdapter
from atroposlib.envs.server_handling.sequence_node import SequenceNode
from atroposlib.envs.server_handling.server_baseline import APIServer
from atroposlib.envs.server_handling.tool_call_translator import ToolCallTranslator
from atroposlib.envs.server_handling.vllm_server import MAX_TOKEN_ALIASES, drop_doubled_bos
from atroposlib.utils.openai_shapes import chat_choice, completion_body, text_choice
from atroposlib.weight_sync.versions import oldest_version, weight_version_of

__all__ = [
    "DummyManagedServer",
    "ManagedServer",
    "ManagedServerAdapter",
    "SequenceNode",
    "TokenBudgetSpent",
]

logger = logging.getLogger("atroposlib.inference")

TOOL_KWARGS = ("tools", "tool_choice", "parallel_tool_calls")


class TokenBudgetSpent(ValueError):
    """The request's prompt and one token per choice do not fit in the token budget."""


NOT_FORWARDED = ("messages", "prompt", "input_ids", "logprobs")


class ManagedServer:
    """A server wrapper for one rollout that records exact tokens, masks and logprobs.

    Used as a context manager (`server.managed_server()`); its `SequenceNode`s become the
    group's tokens, masks and inference logprobs without re-tokenising any text.
    """

    warned_about_tools = False  # once per process: a managed server lives for one rollout

    def __init__(
        self,
        server: APIServer | Any,
        tokenizer: Any = None,
        track_tree: bool = False,
        tool_parser: str | None = None,
        preserve_think_blocks: bool = False,
        token_budget: int | None = None,
    ) -> None:
        """`server`: an APIServer or a ServerManager (anything with token-level calls).

        Without `tokenizer`, the server's is used (`tokenizer_name`, else `model_name`);
        ValueError if that cannot be loaded, or if `tool_parser` is not a known parser.
        `preserve_think_blocks=True` lets the chat template handle `<think>` blocks of
        earlier assistant turns itself (by default they are kept verbatim).
        `token_budget`: the most tokens the nodes may hold (module docstring).
        """
        self.server = server
        self.tokenizer: Any = (
            tokenizer if tokenizer is not None else getattr(server, "tokenizer", None)
        )
        if self.tokenizer is None:
            raise ValueError("ManagedServer needs a tokenizer: pass tokenizer=")
        self.track_tree = track_tree
        if tool_parser is None:
            tool_parser = getattr(server, "tool_parser", None)
        self._tool_parser_name = tool_parser
        self._translator = ToolCallTranslator(self.tokenizer, tool_parser) if tool_parser else None
        self._preserve_think_blocks = preserve_think_blocks
        self._native_tools: bool | None = None  # whether the chat template renders tools
        self.current_nodes: list[SequenceNode] = []
        self.sequences: dict[str, SequenceNode] = {}
        self.token_budget = token_budget
        self.response_nodes: dict[str, list[SequenceNode]] | None = None
        """Set to {} to keep, per answer's `id`, the node each of its choices was recorded
        in: a library that keeps the responses (verifiers' trajectory) then finds its
        sequences by them, not by the order samples finished in. Off by default: it keeps
        every turn's node alive (a proxy session's would grow with its turns)."""

    @property
    def nodes(self) -> list[SequenceNode]:
        return self.current_nodes

    def get_state(self) -> dict[str, Any]:
        """{"nodes": [...]}; in tree mode {"sequences": {text: node}, "tree": (the same)}."""
        if self.track_tree:
            return {"sequences": dict(self.sequences), "tree": dict(self.sequences)}
        return {"nodes": list(self.current_nodes)}

    def reset(self) -> None:
        self.current_nodes = []
        self.sequences = {}
        if self.response_nodes is not None:
            self.response_nodes = {}

    def _get_translator(self) -> ToolCallTranslator | None:
        return self._translator

    def _convert_messages_to_prompt(
        self, messages: list[Any], tools: list[dict] | None = None
    ) -> str:
        """The prompt text for `messages` (with `tools` rendered, when given)."""
        if tools and self._translator is not None:
            messages = self._translator.convert_messages_for_template(messages)
        if tools and self._native_tools is None:
            self._native_tools = template_renders_tools(self.tokenizer)
        return render_prompt(
            self.tokenizer,
            messages,
            tools=tools,
            native_tools=bool(self._native_tools),
            preserve_think_blocks=self._preserve_think_blocks,
        )

    async def chat_completion(
        self, messages: list[Any] | None = None, **kwargs: Any
    ) -> ChatCompletion:
        tools = kwargs.pop("tools", None)
        tool_choice = kwargs.pop("tool_choice", None)
        kwargs.pop("parallel_tool_calls", None)
        translator = self._translator if tools else None  # None: tools are not rendered
        use_tools = translator is not None
        if tools and not use_tools and not ManagedServer.warned_about_tools:
            ManagedServer.warned_about_tools = True
            logger.warning(
                "ManagedServer has no tool_parser: tools ignored (the prompt is rendered "
                "without them and calls stay in the text); pass tool_parser='hermes'"
            )
        prompt = self._convert_messages_to_prompt(messages or [], tools if use_tools else None)
        samples = await self._sample(prompt, kwargs, kind="chat")
        choices, all_calls = [], []
        for index, (output, finish, _) in enumerate(samples):
            calls = None
            if translator is not None:
                raw = translator.decode_with_tool_awareness(output, has_tools=True)
                choice_name = tool_choice if isinstance(tool_choice, str) else "auto"
                text, calls, _ = translator.parse_model_output(raw, choice_name, tools)
                finish = "tool_calls" if calls else finish
            else:
                text = self.tokenizer.decode(output, skip_special_tokens=True)
            choices.append(chat_choice(index, text, _openai_finish(finish)))
            all_calls.append(calls)
        body = completion_body("chat", self._model(kwargs), choices)
        answer = ChatCompletion.model_validate(body)
        self._remember(answer.id, samples)
        for choice, calls in zip(answer.choices, all_calls, strict=True):
            if calls:  # plain dicts, as upstream attaches them (see tool_call_translator)
                # ToolCall dicts read like openai's tool-call models, which the SDK names
                choice.message.tool_calls = calls
        return answer

    async def completion(self, prompt: str = "", **kwargs: Any) -> Completion:
        samples = await self._sample(prompt, kwargs, kind="completion")
        choices = [
            text_choice(i, self.tokenizer.decode(out, skip_special_tokens=True), _openai_finish(r))
            for i, (out, r, _) in enumerate(samples)
        ]
        answer = Completion.model_validate(completion_body("text", self._model(kwargs), choices))
        self._remember(answer.id, samples)
        return answer

    def _remember(self, answer_id: str, samples: list[tuple[Any, Any, SequenceNode]]) -> None:
        if self.response_nodes is not None:
            self.response_nodes[answer_id] = [node for _, _, node in samples]

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        """Prompt logprobs from the wrapped server's `get_logprobs` (`messages` are
        rendered to `prompt` first); NotImplementedError when it has none."""
        request = dict(kwargs)
        messages = request.pop("messages", None)
        if messages is not None:
            request["prompt"] = self._convert_messages_to_prompt(messages)
        get_logprobs = getattr(self.server, "get_logprobs", None)
        if get_logprobs is None:
            raise NotImplementedError(
                f"{type(self.server).__name__} does not implement get_logprobs: prompt "
                "logprobs need a backend that returns them (a vLLM-compatible server)"
            )
        return await get_logprobs(**request)

    def _model(self, kwargs: dict[str, Any]) -> str:
        return kwargs.get("model", self.server.config.model_name)

    def _encode(self, text: str, fresh: bool) -> list[int]:
        """A fresh prompt gets the tokenizer's special tokens (never a doubled BOS)."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=fresh))
        return (
            drop_doubled_bos(ids, getattr(self.tokenizer, "bos_token_id", None)) if fresh else ids
        )

    def held_tokens(self) -> int:
        """Tokens the nodes hold now (what `token_budget` bounds)."""
        nodes = self.sequences.values() if self.track_tree else self.current_nodes
        return sum(len(node.tokens) for node in nodes)

    def _fit_budget(
        self, prompt_ids: list[int], parent: SequenceNode | None, request: dict[str, Any]
    ) -> None:
        """Cut `max_tokens` so that `n` samples of it fit the budget, or refuse."""
        assert self.token_budget is not None
        n = max(int(request.get("n") or 1), 1)
        freed = len(parent.tokens) if parent is not None and not self.track_tree else 0
        room = self.token_budget - self.held_tokens() + freed
        per_choice = room // n - len(prompt_ids)
        if per_choice < 1:
            raise TokenBudgetSpent(
                f"{n} x ({len(prompt_ids)} prompt tokens + 1) do not fit in the "
                f"{room} tokens left of the budget of {self.token_budget}"
            )
        asked = request.get("max_tokens")
        request["max_tokens"] = per_choice if asked is None else min(int(asked), per_choice)

    def _find_parent(self, prompt: str) -> SequenceNode | None:
        if self.track_tree:
            return self.sequences.get(prompt)
        candidates = [n for n in self.current_nodes if prompt.startswith(n.full_text)]
        return max(candidates, key=lambda n: len(n.full_text), default=None)

    async def _sample(
        self, prompt: str, kwargs: dict[str, Any], kind: str
    ) -> list[tuple[list[int], str, SequenceNode]]:
        """(completion ids, finish reason, the node it is recorded in) per sample."""
        parent = self._find_parent(prompt)
        if parent is None:
            prefix_ids: list[int] = []
            prompt_ids = self._encode(prompt, fresh=True)
        else:
            prefix_ids = parent.tokens
            prompt_ids = prefix_ids + self._encode(prompt[len(parent.full_text) :], fresh=False)
        request = {k: v for k, v in kwargs.items() if k not in NOT_FORWARDED}
        for alias in MAX_TOKEN_ALIASES:  # chat spellings of max_tokens, as upstream's vLLM client
            if alias in request:
                request["max_tokens"] = request.pop(alias)
        if self.token_budget is not None:
            self._fit_budget(prompt_ids, parent, request)
        # Text and ids, as upstream: token-level servers send the ids, scripted ones
        # (ServerHarness) look the text up.
        _, outputs, logprobs, finishes = await self.server.tokens_and_logprobs_completion(
            prompt=prompt, input_ids=prompt_ids, **request
        )
        if self.track_tree or parent is None:  # tree mode masks the whole prompt, as upstream
            base_masks, base_logprobs = [-100] * len(prompt_ids), [1.0] * len(prompt_ids)
        else:
            new_prompt = len(prompt_ids) - len(prefix_ids)
            base_masks = parent.masked_tokens + [-100] * new_prompt
            base_logprobs = parent.logprobs + [1.0] * new_prompt
        # Found before the await: a concurrent branch may have replaced it meanwhile.
        slot = next((i for i, n in enumerate(self.current_nodes) if n is parent), None)
        samples = []
        for output, output_logprobs, finish in zip(outputs, logprobs, finishes, strict=True):
            if len(output_logprobs) != len(output):  # padding them would invent logprobs
                raise ValueError(
                    f"the engine answered {len(output)} tokens with {len(output_logprobs)} "
                    "logprobs: ManagedServer trains on each token's logprob, so it needs "
                    "exactly one per token (VAL-1 of the trainer review)"
                )
            output_logprobs = list(output_logprobs)
            version = weight_version_of(finish)
            if parent is not None and not self.track_tree:  # a turn of a longer sequence
                version = oldest_version((parent.metadata or {}).get("weight_version"), version)
            finish = finish.get("type", "stop") if isinstance(finish, dict) else finish
            metadata = {"finish_reason": finish, "kind": kind}
            if version is not None:
                metadata["weight_version"] = version
            node = SequenceNode(
                full_text=prompt + self.tokenizer.decode(output, skip_special_tokens=False),
                tokens=prompt_ids + output,
                masked_tokens=base_masks + output,
                logprobs=base_logprobs + output_logprobs,
                metadata=metadata,
            )
            if self.track_tree:
                self.sequences[node.full_text] = node
            elif slot is not None:
                self.current_nodes[slot] = node
                slot = None
            else:
                self.current_nodes.append(node)
            samples.append((output, finish, node))
        return samples


def _openai_finish(reason: str | None) -> str:
    return reason if reason in ("stop", "length", "tool_calls", "content_filter") else "stop"
