"""What a sequence says of the policy that sampled it: its weight-version label, as
environments and the trainer read it, and a logprob per token (VER-2, VER-3 and VAL-1
of the trainer review)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from atroposlib.envs.server_handling.managed_server import ManagedServer
from atroposlib.weight_sync.versions import FinishReason

pytestmark = pytest.mark.unit


class LetterTokenizer:
    """One token per character: enough for ManagedServer's bookkeeping."""

    bos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


class ScriptedEngine:
    """Answers " 7" with the version of the weights it holds now."""

    config = SimpleNamespace(model_name="tiny")

    def __init__(self, logprobs_per_answer: int = 2) -> None:
        self.version = "3"
        self.logprobs_per_answer = logprobs_per_answer

    async def tokens_and_logprobs_completion(self, prompt, input_ids, **kwargs):
        out = [ord(c) for c in " 7"]
        logprobs = [-0.5] * self.logprobs_per_answer
        return None, [out], [logprobs], [FinishReason("stop", self.version)]


def test_a_multi_turn_sequence_carries_its_oldest_turns_version():
    """VER-2: turn 1 sampled by version 3, turn 2 by 7, and both trained: the sequence
    said 7, so --max-staleness let a turn 4 versions older through."""
    engine = ScriptedEngine()
    managed = ManagedServer(engine, tokenizer=LetterTokenizer())

    async def two_turns() -> None:
        await managed.completion(prompt="Q1:")
        engine.version = "7"  # the engine took new weights between the turns
        await managed.completion(prompt=managed.current_nodes[0].full_text + " Q2:")

    asyncio.run(two_turns())
    (node,) = managed.current_nodes
    trained = [i for i, m in enumerate(node.masked_tokens) if m != -100]
    assert len(trained) == 4  # both turns' two tokens
    assert node.metadata["weight_version"] == "3"


@pytest.mark.parametrize(
    ("first", "then", "oldest"),
    [
        ("3", "7", "3"),
        ("7", "3", "3"),  # a later turn on an engine still behind
        ("10", "9", "9"),  # numbers, not strings, are compared
        (None, "7", "7"),
        ("3", None, "3"),
        ("base", "7", "base"),  # no order between a name and a number: the earlier turn
    ],
)
def test_the_oldest_of_two_labels(first, then, oldest):
    from atroposlib.weight_sync.versions import oldest_version

    assert oldest_version(first, then) == oldest


def test_only_ascii_digits_name_a_step():
    """VER-3: the trainer took `str.isdigit()`, true for "²", which `int()` refuses."""
    from atroposlib.weight_sync.versions import version_number

    assert version_number("12") == 12
    for label in ("²", "١٢", "-1", "1.0", "", None, 3):
        assert version_number(label) is None


def test_the_trainer_reads_a_groups_labels_with_the_same_rule():
    pytest.importorskip("torch")
    from atroposlib.protocol import WEIGHT_VERSIONS_FIELD, ScoredData
    from example_trainer.data import sampled_versions

    group = ScoredData.model_validate(
        {
            "tokens": [[1, 2], [1, 3]],
            "masks": [[-100, 2], [-100, 3]],
            "scores": [1.0, 0.0],
            WEIGHT_VERSIONS_FIELD: ["²", "4"],
        }
    )
    assert sampled_versions(group) == [None, 4]


@pytest.mark.parametrize("given", [0, 1, 3])
def test_an_answer_with_another_number_of_logprobs_than_tokens_is_refused(given):
    """VAL-1: missing logprobs were padded with 1.0, which then trained as
    log-probabilities (a ratio off by e per token)."""
    managed = ManagedServer(ScriptedEngine(logprobs_per_answer=given), tokenizer=LetterTokenizer())
    with pytest.raises(ValueError, match=f"2 tokens with {given} logprobs"):
        asyncio.run(managed.completion(prompt="Q1:"))
    assert managed.current_nodes == []
