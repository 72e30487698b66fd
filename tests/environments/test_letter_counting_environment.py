"""Letter counting: generated items over the shipped word list, scored exactly."""

from __future__ import annotations

import random
import re

from environments.letter_counting_environment import (
    WORDS,
    letter_count_score,
    load_words,
    make_item,
)
from tests.support.env_groups import assert_prompt_masked
from tests.support.library_envs import chat_flags, evaluate_files, process_groups
from tests.support.policy_server import policy_fixture
from tests.support.scripted_model import last_turn, scripted_model_fixture

QUESTION = re.compile(r"letter '(\w)' appear in '(\w+)'")


def true_count(prompt: str) -> int:
    letter, word = QUESTION.search(prompt).groups()
    return word.count(letter)


def tagged_policy(prompt: str, n: int) -> list[str]:
    count = true_count(last_turn(prompt))
    replies = [
        f"<think>spelling it out</think><answer>{count}</answer>",
        f"<answer>{count + 1}</answer>",
        f"<think><answer>{count}</answer></think>",  # only in the reasoning
        f"{count}",  # bare, not accepted in the tagged format
    ]
    return replies[:n]


scripted = scripted_model_fixture(tagged_policy)
judge_free_chat = policy_fixture(
    lambda messages, n: [f"<answer>{true_count(messages[-1]['content'])}</answer>"] * n
)


def test_the_word_list_ships_and_items_cover_absent_letters():
    words = load_words(WORDS)
    assert len(words) > 2500 and all(w.isalpha() and w.islower() for w in words)
    items = [make_item(random.Random(seed), words) for seed in range(400)]
    assert all(i["count"] == i["word"].count(i["letter"]) for i in items)
    assert 0.1 < sum(i["count"] == 0 for i in items) / len(items) < 0.4


def test_scores_in_both_answer_formats():
    assert letter_count_score("<answer>2</answer>", 2) == 1.0
    assert letter_count_score("2", 2) == 0.0
    assert letter_count_score("2", 2, "bare") == 1.0
    assert letter_count_score("it is 1, no, 2", 2, "bare") == 1.0
    assert letter_count_score("<think>2", 2, "bare") == 0.0


def test_process_scores_a_scripted_policy_exactly(scripted, tiny_model_path, tmp_path):
    groups = process_groups(
        "letter_counting_environment.py",
        tmp_path,
        tiny_model_path,
        scripted.flags(),
        *("--env.max_tokens", "64", "--env.max_token_length", "512"),
    )
    assert len(groups) == 2 and all(g["scores"] == [1.0, 0.0, 0.0, 0.0] for g in groups)
    from transformers import AutoTokenizer

    assert_prompt_masked(groups[0], AutoTokenizer.from_pretrained(str(tiny_model_path)))


def test_process_on_the_tiny_model_in_the_bare_format(inference_server, tiny_model_path, tmp_path):
    groups = process_groups(
        "letter_counting_environment.py",
        tmp_path,
        tiny_model_path,
        [
            *("--openai.base_url", f"{inference_server.url}/v1", "--openai.model_name", "tiny"),
            *("--openai.server_type", "vllm", "--openai.api_key", "x"),
        ],
        *("--env.answer_format", "bare", "--env.max_tokens", "4"),
        *("--env.max_token_length", "128"),
    )
    assert all(set(g["scores"]) <= {0.0, 1.0} for g in groups)
    assert "Answer with the number only." in str(groups[0]["messages"][0])


def test_evaluate_writes_accuracy_and_samples(judge_free_chat, tiny_model_path, tmp_path):
    metrics, samples = evaluate_files(
        "letter_counting_environment.py",
        tmp_path,
        tiny_model_path,
        chat_flags(judge_free_chat.url),
        *("--env.eval_size", "12"),
    )
    results = metrics["results"]["all"]
    assert results["eval/accuracy"] == 1.0 and len(samples) == 12
    assert all(s["count"] == s["word"].count(s["letter"]) for s in samples)
