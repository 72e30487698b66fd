"""tokenize_for_trainer on the tiny model kit's real ChatML tokenizer."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")  # the tiny model kit builds its model with torch

from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer  # noqa: E402

SYSTEM = {"role": "system", "content": "Answer with one digit."}
USER = {"role": "user", "content": "What is 3 + 4 mod 10?"}
ANSWER = {"role": "assistant", "content": "7"}
CHAT = [SYSTEM, USER, ANSWER]
TWO_TURNS = [
    SYSTEM,
    USER,
    ANSWER,
    {"role": "user", "content": "What is 9 + 9 mod 10?"},
    {"role": "assistant", "content": "8"},
]


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return transformers.AutoTokenizer.from_pretrained(tiny_model_path)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def trained(out):
    return [t for t, m in zip(out["tokens"], out["masks"], strict=True) if m != -100]


def test_default_trains_on_last_message_only(tok):
    out = tokenize_for_trainer(tok, CHAT)
    assert set(out) == {"tokens", "masks"}
    full = tok.apply_chat_template(CHAT, tokenize=False)
    assert full.endswith("<|im_start|>assistant\n7<|im_end|>\n")
    assert out["tokens"] == ids(tok, full)
    prefix = tok.apply_chat_template(CHAT[:-1], tokenize=False, add_generation_prompt=True)
    n = len(ids(tok, prefix))
    assert 0 < n < len(out["tokens"])
    assert out["masks"][:n] == [-100] * n
    assert out["masks"][n:] == out["tokens"][n:]
    assert tok.decode(trained(out)) == "7<|im_end|>\n"


def test_include_messages(tok):
    out = tokenize_for_trainer(tok, CHAT, include_messages=True)
    assert out["messages"] == CHAT
    assert out["tokens"] == tokenize_for_trainer(tok, CHAT)["tokens"]


def test_default_with_two_turns_trains_only_the_last(tok):
    out = tokenize_for_trainer(tok, TWO_TURNS)
    assert len(out["tokens"]) == len(out["masks"])
    assert tok.decode(trained(out)) == "8<|im_end|>\n"


def test_all_assistant_turns(tok):
    out = tokenize_for_trainer(tok, TWO_TURNS, train_on_all_assistant_turns=True)
    full = tok.apply_chat_template(TWO_TURNS, tokenize=False)
    assert out["tokens"] == ids(tok, full)
    assert tok.decode(trained(out)) == "7<|im_end|>\n8<|im_end|>\n"
    # The trained tokens form exactly two runs, one per assistant turn, and
    # everything else (system, user turns, role headers) is masked.
    runs, inside = [], False
    for pos, (t, m) in enumerate(zip(out["tokens"], out["masks"], strict=True)):
        assert m in (-100, t)
        if m != -100 and not inside:
            runs.append([pos])
        if m != -100:
            runs[-1].append(pos)
        inside = m != -100
    assert len(runs) == 2
    masked_text = tok.decode(
        [t for t, m in zip(out["tokens"], out["masks"], strict=True) if m == -100]
    )
    assert "Answer with one digit." in masked_text
    assert "What is 3 + 4 mod 10?" in masked_text and "What is 9 + 9 mod 10?" in masked_text
    assert masked_text.count("<|im_start|>assistant\n") == 2


def test_agent_role_counts_as_assistant(tok):
    chat = [USER, {"role": "agent", "content": "7"}, USER, ANSWER]
    out = tokenize_for_trainer(tok, chat, train_on_all_assistant_turns=True)
    # No generation prompt matches an "agent" turn, so its header is trained too.
    assert tok.decode(trained(out)) == "<|im_start|>agent\n7<|im_end|>\n7<|im_end|>\n"


def test_length_finish_drops_trailing_eos_and_newline(tok):
    """ChatML renders "<|im_end|>\\n": the EOS and the template's newline after it go."""
    plain = tokenize_for_trainer(tok, CHAT)
    out = tokenize_for_trainer(tok, CHAT, finish_reason="length")
    assert plain["tokens"][-2:] == [tok.eos_token_id, ids(tok, "\n")[0]]
    assert out["tokens"] == plain["tokens"][:-2]
    assert out["masks"] == plain["masks"][:-2]
    assert tok.decode(trained(out)) == "7"
    assert tok.eos_token_id not in trained(out)


def test_length_finish_without_trailing_eos_changes_nothing(tok):
    text_tok = transformers.AutoTokenizer.from_pretrained(tok.name_or_path)
    text_tok.chat_template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    plain = tokenize_for_trainer(text_tok, CHAT)
    assert tokenize_for_trainer(text_tok, CHAT, finish_reason="length") == plain
    assert tokenize_for_trainer(tok, CHAT, finish_reason="stop") == tokenize_for_trainer(tok, CHAT)


def test_boundary_merge_falls_back_to_offsets(tok):
    """A template whose prompt ends in a space: BPE merges it into the completion's first token."""
    text_tok = transformers.AutoTokenizer.from_pretrained(tok.name_or_path)
    text_tok.chat_template = (
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    )
    chat = [USER, {"role": "assistant", "content": "is 7"}]
    prefix = text_tok.apply_chat_template(chat[:-1], tokenize=False, add_generation_prompt=True)
    full = text_tok.apply_chat_template(chat, tokenize=False)
    prefix_ids, full_ids = ids(text_tok, prefix), ids(text_tok, full)
    assert full_ids[: len(prefix_ids)] != prefix_ids  # the case the fallback exists for
    out = tokenize_for_trainer(text_tok, chat)
    assert out["tokens"] == full_ids
    # The token straddling the boundary (" is") is trained; the prompt before it is not.
    assert text_tok.decode(trained(out)) == " is 7\n"
    assert text_tok.decode(
        [t for t, m in zip(out["tokens"], out["masks"], strict=True) if m == -100]
    ) == ("user: What is 3 + 4 mod 10?\nassistant:")
    two = [
        USER,
        {"role": "assistant", "content": "is 7"},
        USER,
        {"role": "assistant", "content": "is 8"},
    ]
    out = tokenize_for_trainer(text_tok, two, train_on_all_assistant_turns=True)
    assert out["tokens"] == ids(text_tok, text_tok.apply_chat_template(two, tokenize=False))
    assert text_tok.decode(trained(out)) == " is 7\n is 8\n"


def test_empty_chat_is_rejected(tok):
    with pytest.raises(ValueError):
        tokenize_for_trainer(tok, [])
