"""The instruction-following env: row conversion, the hub, and its rows of the env table.

In the table (tests/environments/test_env_table.py) a scripted policy answers by what
the prompt asks, so the scores in the written groups are exact; the documented offline
command's groups on the real tiny model are checked on the shipped sample (`OFFLINE`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import types

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
from tests.support.env_groups import assert_prompt_masked
from tests.support.env_table import EvaluateRow, ProcessRow, Run, chat, scripted
from tests.support.scripted_model import last_turn

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


def write_rows(run: Run) -> str:
    path = run.tmp_path / "ifeval.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return str(path)


def start_of(group: dict) -> str:
    """The REPLIES key of the group's prompt."""
    return next(s for s in REPLIES if group["messages"][0][1]["content"].startswith(s))


def check_process(groups: list[dict], run: Run) -> None:
    for group in groups:
        assert [m[-1]["content"] for m in group["messages"]] == REPLIES[start_of(group)][0]
        assert_prompt_masked(group, run.tokenizer)
    assert {start_of(group) for group in groups} == set(REPLIES)


def eval_policy(messages: list[dict], n: int) -> list[str]:
    text = messages[-1]["content"]
    return [next(r for s, r in EVAL_REPLIES.items() if text.startswith(s))] * n


def check_evaluate(results: dict, samples: list[dict], run: Run) -> None:
    assert results["eval/prompt_level_strict_acc"] == pytest.approx(1 / 3)
    assert results["eval/prompt_level_loose_acc"] == pytest.approx(2 / 3)
    assert results["eval/inst_level_strict_acc"] == pytest.approx(3 / 5)
    assert results["eval/inst_level_loose_acc"] == pytest.approx(4 / 5)
    assert sorted(s["key"] for s in samples) == ["1", "2", "3"]
    assert {s["key"]: s["follow_instruction_list"] for s in samples}["1"] == [True] * 3


def check_offline(groups: list[dict]) -> None:
    """The documented command on the tiny model: the shipped sample's prompts, scored in [0, 1]."""
    prompts = {row["messages"][0]["content"] for row in read_jsonl(SAMPLE_DIR / "train.jsonl")}
    for group in groups:
        assert all(0.0 <= s <= 1.0 for s in group["scores"])
        assert group["messages"][0][1]["content"] in prompts


# The questions every env is asked (tests/environments/test_env_table.py).
PROCESS = ProcessRow(
    env=InstructionFollowingEnv,
    model=scripted(lambda prompt, n: replies_for(last_turn(prompt))[:n]),
    group_size=2,
    steps=3,
    scores=lambda group: REPLIES[start_of(group)][1],
    args=lambda run: [
        *("--env.dataset_path", write_rows(run), "--env.seed", "1"),
        *("--env.max_token_length", "512", "--env.max_tokens", "64"),
    ],
    check=check_process,
)
EVALUATE = EvaluateRow(
    env=InstructionFollowingEnv,
    model=chat(eval_policy),
    samples=3,
    args=lambda run: ["--env.dataset_path", write_rows(run)],
    check=check_evaluate,
)
OFFLINE = check_offline


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
