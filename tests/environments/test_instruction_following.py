"""The instruction-following env: row conversion, `process` and `evaluate` end to end, the hub.

The scripted policy answers by what the prompt asks, so the scores in the written groups
are exact; one run on the real tiny model checks the shape on the shipped sample.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from pathlib import Path

import pytest

from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.data_source import read_jsonl
from atroposlib.envs.reward_fns._ifeval_checks import (
    NEEDS_PUNKT,
    UnsupportedInstruction,
    compile_constraints,
    punkt_installed,
)
from atroposlib.envs.reward_fns.ifeval_reward import constraints_of
from environments.instruction_following import (
    SAMPLE_DIR,
    InstructionFollowingConfig,
    InstructionFollowingEnv,
    instruction_results,
    item_from_row,
    items_from_rows,
)
from tests.support.compat_runs import failure, run_env, tiny_flags
from tests.support.env_groups import assert_prompt_masked
from tests.support.policy_server import PolicyChatServer
from tests.support.scripted_model import last_turn, scripted_model_fixture

SCRIPT = str(Path(__file__).resolve().parents[2] / "environments" / "instruction_following.py")

ROWS = [
    {
        "key": 1,
        "prompt": "Write about rain. Do not use commas. Include the word rain. End with: The end.",
        "instruction_id_list": [
            "punctuation:no_comma",
            "keywords:existence",
            "startend:end_checker",
        ],
        "kwargs": [{"keywords": None}, {"keywords": ["rain"]}, {"end_phrase": "The end."}],
    },
    {
        "key": 2,
        "prompt": "Give a motto. Wrap your entire response in double quotation marks.",
        "instruction_id_list": ["startend:quotation"],
        "kwargs": [{}],
    },
    {
        "key": 3,
        "prompt": "Describe a storm in all capital letters.",
        "instruction_id_list": ["change_case:english_capital"],
        "kwargs": [{}],
    },
]
# per prompt: the replies a group gets, and what each scores
REPLIES = {
    "Write about rain": (["Rain falls softly. The end.", "Rain falls, softly."], [1.0, 1 / 3]),
    "Give a motto": (['"Bake it better."', "Bake it better."], [1.0, 0.0]),
    "Describe a storm": (
        ["<think>THUNDER</think>THUNDER AND RAIN FILL THE NIGHT SKY.", "<think>ROAR"],
        [1.0, 0.0],
    ),
}
EVAL_REPLIES = {
    "Write about rain": "Rain falls softly. The end.",  # strict and loose
    "Give a motto": 'Sure, here it is:\n"Bake it better."',  # loose only (first line dropped)
    "Describe a storm": "A storm.",  # neither
}


def item_ids(row: dict) -> list[str]:
    if "instruction_id_list" in row:
        return row["instruction_id_list"]
    return [i for i, _ in constraints_of(ground_truth=row["ground_truth"])]


def replies_for(text: str) -> list[str]:
    return next(replies for start, (replies, _) in REPLIES.items() if start in text)


scripted = scripted_model_fixture(lambda prompt, n: replies_for(last_turn(prompt))[:n])


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "ifeval.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def test_the_shipped_sample_converts_completely_but_for_missing_punkt_data():
    for split in ("train", "test"):
        rows = read_jsonl(SAMPLE_DIR / f"{split}.jsonl")
        needs_punkt = [r for r in rows if NEEDS_PUNKT & set(item_ids(r))]
        converted = items_from_rows(rows, split)
        skipped = 0 if punkt_installed() else len(needs_punkt)
        assert len(converted) == len(rows) - skipped >= 15
    assert sum(p.stat().st_size for p in SAMPLE_DIR.iterdir()) < 1 << 20


def test_both_hub_shapes_become_the_same_item():
    rlvr = {
        "messages": [{"role": "user", "content": "Describe tea. Answer with at most 9 words."}],
        "ground_truth": json.dumps(
            {
                "func_name": "validate_word_constraint",
                "N": 9,
                "quantifier": "at most",
                "letter": None,
            }
        ),
        "dataset": "ifeval",
        "constraint_type": "Length Constraints",
        "constraint": "Answer with at most 9 words.",
    }
    item = item_from_row(rlvr)
    assert item["prompt"].startswith("Describe tea.")
    assert item["constraints"] == [
        ["length_constraints:number_words", {"num_words": 9, "relation": "at most"}]
    ]
    assert item_from_row(ROWS[0])["constraints"][2] == [
        "startend:end_checker",
        {"end_phrase": "The end."},
    ]
    unsupported = {
        "key": 9,
        "prompt": "Mention a word.",
        "instruction_id_list": ["keywords:existence"],
        "kwargs": [{"keywords": None}],  # lm-eval would pick random keywords
    }
    with pytest.raises(UnsupportedInstruction, match=r"random one .* for each of \[.keywords.\]"):
        item_from_row(unsupported)
    assert len(items_from_rows([unsupported, ROWS[1]], "train")) == 1


def test_loose_reading_forgives_a_preamble_line_only():
    checks = compile_constraints([("startend:quotation", {})])
    assert instruction_results('Sure:\n"Hi."', checks) == {"strict": [False], "loose": [True]}
    assert instruction_results("", checks) == {"strict": [False], "loose": [False]}


def test_process_scores_a_scripted_policy_exactly(scripted, rows_file, tiny_model_path, tmp_path):
    out = tmp_path / "groups.jsonl"
    done = run_env(
        SCRIPT,
        "process",
        tmp_path,
        *("--env.dataset_path", str(rows_file), "--env.tokenizer_name", str(tiny_model_path)),
        *("--env.group_size", "2", "--env.total_steps", "3", "--env.seed", "1"),
        *("--env.use_wandb", "false", "--env.data_path_to_save_groups", str(out)),
        *("--env.max_token_length", "512", "--env.max_tokens", "64"),
        *scripted.flags(),
    )
    assert done.returncode == 0, failure(done)
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 3 and out.with_suffix(".html").is_file()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    seen = set()
    for group in groups:
        assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == 2
        prompt = group["messages"][0][1]["content"]
        start = next(s for s in REPLIES if prompt.startswith(s))
        seen.add(start)
        assert group["scores"] == pytest.approx(REPLIES[start][1])
        assert [m[-1]["content"] for m in group["messages"]] == REPLIES[start][0]
        assert_prompt_masked(group, tokenizer)
    assert seen == set(REPLIES)


def test_process_on_the_tiny_model_uses_the_sample(inference_server, tiny_model_path, tmp_path):
    out = tmp_path / "groups.jsonl"
    done = run_env(
        SCRIPT,
        "process",
        tmp_path,
        *("--env.group_size", "2", "--env.total_steps", "2", "--env.max_tokens", "8"),
        *("--env.use_wandb", "false", "--env.data_path_to_save_groups", str(out)),
        *("--env.max_token_length", "512", "--env.ensure_scores_are_not_same", "false"),
        *tiny_flags(tiny_model_path, f"{inference_server.url}/v1", server_type="vllm"),
    )
    assert done.returncode == 0, failure(done)
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2
    prompts = {row["messages"][0]["content"] for row in read_jsonl(SAMPLE_DIR / "train.jsonl")}
    for group in groups:
        assert len(group["tokens"]) == 2 and all(0.0 <= s <= 1.0 for s in group["scores"])
        assert group["messages"][0][1]["content"] in prompts


def test_evaluate_writes_ifeval_metrics_and_samples(rows_file, tiny_model_path, tmp_path):
    def policy(messages, n):
        text = messages[-1]["content"]
        return [next(r for s, r in EVAL_REPLIES.items() if text.startswith(s))] * n

    with PolicyChatServer(policy) as server:
        done = run_env(
            SCRIPT,
            "evaluate",
            tmp_path,
            *("--env.dataset_path", str(rows_file), "--env.use_wandb", "false"),
            *("--env.data_dir_to_save_evals", str(tmp_path / "evals")),
            *tiny_flags(tiny_model_path, server.url),
        )
    assert done.returncode == 0, failure(done)
    results = json.loads((tmp_path / "evals" / "metrics.json").read_text())["results"]["all"]
    assert results["eval/prompt_level_strict_acc"] == pytest.approx(1 / 3)
    assert results["eval/prompt_level_loose_acc"] == pytest.approx(2 / 3)
    assert results["eval/inst_level_strict_acc"] == pytest.approx(3 / 5)
    assert results["eval/inst_level_loose_acc"] == pytest.approx(4 / 5)
    samples = read_jsonl(tmp_path / "evals" / "samples.jsonl")
    assert sorted(s["key"] for s in samples) == ["1", "2", "3"]
    assert {s["key"]: s["follow_instruction_list"] for s in samples}["1"] == [True] * 3


@pytest.fixture
def fake_hub(monkeypatch):
    calls = []

    def load_dataset(name, subset=None, split=None):
        calls.append((name, subset, split))
        if name == "google/IFEval":
            return ROWS
        truth = {"func_name": "validate_lowercase", "N": None}
        return [
            {
                "messages": [{"role": "user", "content": "say hi in lowercase"}],
                "ground_truth": json.dumps(truth),
                "dataset": "ifeval",
                "constraint_type": "Change Cases",
                "constraint": "lowercase",
            }
        ]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_hub_rows_load_and_convert(fake_hub, tiny_model_path):
    config = InstructionFollowingConfig(
        data_source="hub", tokenizer_name=str(tiny_model_path), use_wandb=False
    )
    env = InstructionFollowingEnv(config, APIServerConfig(model_name="tiny"), testing=True)
    asyncio.run(env.setup())
    assert fake_hub == [("allenai/RLVR-IFeval", None, "train"), ("google/IFEval", None, "train")]
    assert env.train_items[0]["constraints"] == [["change_case:english_lowercase", {}]]
    assert env.score("hi there", env.train_items[0]) == 1.0
    assert [item["key"] for item in env.eval_items] == ["1", "2", "3"]
