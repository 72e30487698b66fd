"""`DummyManagedServer`: the managed-server interface over endpoints without token ids.

Hosted OpenAI-compatible APIs return text only. For evaluation or smoke tests an
environment written against `managed_server()` can still run if it accepts nodes whose
tokens, masks and logprobs are fixed placeholders (`metadata["dummy_tokens"] = True`);
`ServerManager.managed_server()` hands one out only when
`ATROPOS_ALLOW_DUMMY_MANAGED_SERVER=1`, because such nodes must never reach a trainer.
"""

from __future__ import annotations

from typing import Any

from atroposlib.envs.server_handling.sequence_node import SequenceNode

ALLOW_DUMMY_ENV = "ATROPOS_ALLOW_DUMMY_MANAGED_SERVER"


class DummyManagedServer:
    DUMMY_TOKENS = list(range(128))
    DUMMY_MASKED_TOKENS = [-100, *range(1, 128)]
    DUMMY_LOGPROBS = [-0.5] * 128

    def __init__(self, server: Any, tokenizer: Any = None, track_tree: bool = False) -> None:
        """`tokenizer` is accepted for signature compatibility and not used."""
        self.server = server
        self.track_tree = track_tree
        self.current_nodes: list[SequenceNode] = []
        self.sequences: dict[str, SequenceNode] = {}

    def _record(self, full_text: str, finish_reason: str | None) -> None:
        node = SequenceNode(
            full_text=full_text,
            tokens=list(self.DUMMY_TOKENS),
            masked_tokens=list(self.DUMMY_MASKED_TOKENS),
            logprobs=list(self.DUMMY_LOGPROBS),
            metadata={"finish_reason": finish_reason or "stop", "dummy_tokens": True},
        )
        if self.track_tree:
            self.sequences[full_text] = node
        else:
            self.current_nodes.append(node)

    async def chat_completion(self, **kwargs: Any) -> Any:
        """The server's chat answer, unchanged; each choice recorded as a placeholder node."""
        messages = kwargs.get("messages", [])
        response = await self.server.chat_completion(**kwargs)
        for choice in response.choices:
            turns = [*messages, {"role": "assistant", "content": choice.message.content or ""}]
            text = "\n\n".join(f"{_get(m, 'role')}:{_get(m, 'content')}" for m in turns)
            self._record(text, choice.finish_reason)
        return response

    async def completion(self, **kwargs: Any) -> Any:
        """The server's completion answer, unchanged; each choice recorded as above."""
        prompt = kwargs.get("prompt", "")
        response = await self.server.completion(**kwargs)
        for choice in response.choices:
            self._record(f"{prompt}{choice.text or ''}", choice.finish_reason)
        return response

    def get_state(self) -> dict[str, Any]:
        if self.track_tree:
            return {"sequences": dict(self.sequences), "tree": dict(self.sequences)}
        return {"nodes": list(self.current_nodes)}

    def reset(self) -> None:
        self.current_nodes.clear()
        self.sequences.clear()

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        raise NotImplementedError(
            "DummyManagedServer has no prompt logprobs (its endpoint returns text only); "
            "use a vLLM-compatible server for get_logprobs"
        )


def _get(message: Any, key: str) -> Any:
    return message.get(key) if isinstance(message, dict) else getattr(message, key, None)
