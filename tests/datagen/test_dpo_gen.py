"""atropos-dpo-gen: upstream's pairing rules and TRL-ready preference data, for real."""

from __future__ import annotations

import random

import pytest

from atroposlib.datagen.dpo import dpo_record, pair_up
from atroposlib.datagen.groups import Scored
from tests.support.datagen import (
    SYSTEM,
    DataTool,
    chat_group,
    finished_run,
    post_groups,
    read_jsonl,
    trl_dpo_dataset,
)
from tests.support.text_groups import text_group

PROMPT = "Question: what is 3 + 4?\nAnswer:"


def scored(*scores: float) -> list[Scored]:
    return [Scored(score, "p", f"c{i}") for i, score in enumerate(scores)]


def named(pairs: list[tuple[Scored, Scored]]) -> list[tuple[str, str]]:
    return [(chosen.completion, rejected.completion) for chosen, rejected in pairs]


def test_pairs_need_a_gap_above_the_minimum_difference():
    assert named(pair_up(scored(3.0, 1.0, 0.0), 2, minimum_score_diff_max_min=2.5)) == [
        ("c0", "c2")
    ]
    assert named(pair_up(scored(1.0, 0.0), 3)) == [("c0", "c1")]
    assert named(pair_up(scored(1.0, 0.6), 3)) == []  # a gap of 0.4 is not above 0.5
    assert named(pair_up(scored(1.0, 0.5), 3)) == []  # nor is exactly 0.5
    assert named(pair_up(scored(0.0, -1.0), 3)) == []  # chosen must score above 0
    assert named(pair_up(scored(0.0, -1.0), 3, allow_negative_scores=True)) == [("c0", "c1")]
    assert named(pair_up(scored(3.0, 2.0, 1.0, 0.0), 0)) == []


@pytest.mark.parametrize("seed", range(20))
def test_random_pairing_keeps_upstreams_invariants(seed):
    group = scored(3.0, 0.0, 2.0, 0.2, 1.0, -1.0)
    pairs = pair_up(group, 3, minimum_score_diff_max_min=0.5, rng=random.Random(seed))
    rejected = [r.completion for _, r in pairs]
    assert len(rejected) == len(set(rejected)), "a rejected sequence is used once"
    assert set(rejected) <= {"c5", "c1", "c3"}, "rejected come from the 3 lowest"
    assert [c.completion for c, _ in pairs] == ["c0", "c2", "c4"][: len(pairs)]
    assert all(c.score - r.score > 0.5 for c, r in pairs)
    assert len(pairs) == 3  # here every chosen finds a candidate whatever the draws


def test_records_in_trl_and_atropos_keys():
    chosen, rejected = Scored(2.0, "Q:", " yes"), Scored(0.0, "Q:", " no")
    assert dpo_record(chosen, rejected, False) == {
        "prompt": "Q:",
        "chosen": " yes",
        "rejected": " no",
    }
    assert dpo_record(chosen, rejected, False, "atropos") == {
        "prefix": "Q:",
        "pos": " yes",
        "neg": " no",
        "score": 2.0,
    }


def dpo_tool(tmp_path, out, api_url, *extra) -> DataTool:
    args = [str(out), "--api-url", api_url, "--group-size", "3", "--tasks-per-step", "1", *extra]
    return DataTool("dpo", tmp_path, *args)


def test_text_pairs_feed_trls_dpo_trainer(api, wire_client, tmp_path, tiny_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    out = tmp_path / "dpo.jsonl"
    tool = dpo_tool(
        tmp_path,
        out,
        api.url,
        "--tokenizer",
        tiny_model_path,
        "--minimum-score-diff-max-min",
        "2.5",
        "--num-seqs-to-save",
        "2",
    )
    try:
        post_groups(wire_client, [text_group(tok, PROMPT, [" 7", " 6", " 1"], [3.0, 1.0, 0.0])])
        post_groups(wire_client, [text_group(tok, "Hi:", [" a", " b", " c"], [1.0, 1.0, 1.0])])
        post_groups(wire_client, [text_group(tok, "Yo:", [" x", " y", " z"], [0.0, 3.0, 0.6])])
        assert tool.wait() == 0, tool.log()
    finally:
        tool.stop()
    records = read_jsonl(out)
    assert records == [
        {"prompt": PROMPT, "chosen": " 7", "rejected": " 1"},
        {"prompt": "Yo:", "chosen": " y", "rejected": " x"},
    ]
    assert "wrote 2 pairs" in tool.log()
    prepared = trl_dpo_dataset(out, tiny_model_path, tmp_path / "trl")
    assert len(prepared) == 2
    assert tok.decode(prepared[0]["chosen_ids"]).startswith(" 7")
    assert tok.decode(prepared[0]["rejected_ids"]).startswith(" 1")


def test_message_pairs_feed_trls_dpo_trainer(api, wire_client, tmp_path, tiny_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    question = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3 + 4?"}]
    group = text_group(tok, PROMPT, [" 7", " 6", " 9"], [1.0, 0.0, 0.0])
    group["messages"] = [question + [{"role": "assistant", "content": a}] for a in "769"]
    out, upstream_out = tmp_path / "chat.jsonl", tmp_path / "upstream.jsonl"
    tool = dpo_tool(tmp_path, out, api.url, "--save-messages", "--num-seqs-to-save", "1")
    try:
        post_groups(wire_client, [group])
        assert tool.wait() == 0, tool.log()
    finally:
        tool.stop()
    (record,) = read_jsonl(out)
    assert record["prompt"] == question
    assert record["chosen"] == [{"role": "assistant", "content": "7"}]
    assert record["rejected"] in (
        [{"role": "assistant", "content": "6"}],
        [{"role": "assistant", "content": "9"}],
    )
    prepared = trl_dpo_dataset(out, tiny_model_path, tmp_path / "trl")
    assert len(prepared) == 1 and prepared[0]["prompt_ids"] and prepared[0]["chosen_ids"]

    tool = dpo_tool(
        tmp_path,
        upstream_out,
        api.url,
        "--save-messages",
        "--format",
        "atropos",
        "--num-seqs-to-save",
        "1",
        "--seed",
        "1",
    )
    try:
        post_groups(wire_client, [group])
        assert tool.wait() == 0, tool.log()
    finally:
        tool.stop()
    (upstream,) = read_jsonl(upstream_out)
    assert set(upstream) == {"pos", "neg", "score"} and upstream["score"] == 1.0
    assert upstream["pos"] == group["messages"][0] and upstream["neg"] in group["messages"][1:]


def test_pairs_from_a_finished_run_feed_trls_dpo_trainer(tmp_path, tiny_model_path, capsys):
    """A run directory's groups as message pairs: the same pair twice in a group and
    again in another environment is written once, and counted."""
    from atroposlib.cli.dpo import main
    from atroposlib.utils.tokenizers import load_tokenizer

    tok = load_tokenizer(str(tiny_model_path))
    first, second = "What is 3 + 4 mod 10?", "What is 1 + 1 mod 10?"
    run = finished_run(
        tmp_path / "run",
        {
            "arith": [
                chat_group(tok, first, ["7", "6"], [1.0, 0.0], "a"),
                chat_group(tok, second, ["2", "2", "5", "5"], [1.0, 1.0, 0.0, 0.0], "b"),
            ],
            "mod": [chat_group(tok, first, ["7", "6"], [1.0, 0.0], "c")],
        },
    )
    out = tmp_path / "dpo.jsonl"
    assert main([str(out), "--from-run", str(run / "rollouts")]) == 0
    said = capsys.readouterr().err

    def pair(question: str, good: str, bad: str) -> dict[str, list[dict[str, str]]]:
        return {
            "prompt": [SYSTEM, {"role": "user", "content": question}],
            "chosen": [{"role": "assistant", "content": good}],
            "rejected": [{"role": "assistant", "content": bad}],
        }

    assert read_jsonl(out) == [pair(first, "7", "6"), pair(second, "2", "5")]
    assert "wrote 2 pairs" in said and "2 identical duplicate pairs dropped" in said, said
    prepared = trl_dpo_dataset(out, tiny_model_path, tmp_path / "trl")
    assert first in tok.decode(prepared[0]["prompt_ids"])
    assert tok.decode(prepared[0]["chosen_ids"]).startswith("7")
    assert tok.decode(prepared[0]["rejected_ids"]).startswith("6")

    text = tmp_path / "text.jsonl"  # decoded by the run's model, found from rollouts/
    assert main([str(text), "--from-run", str(run / "rollouts"), "--save-messages", "false"]) == 0
    records = read_jsonl(text)
    assert [(r["chosen"][:1], r["rejected"][:1]) for r in records] == [("7", "6"), ("2", "5")]
    assert all(r["prompt"].startswith("<|im_start|>system") for r in records)
