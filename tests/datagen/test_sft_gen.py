"""atropos-sft-gen: upstream's rejection rules, TRL-ready output, and bad input, for real."""

from __future__ import annotations

import json
import signal

import httpx
import pytest

from atroposlib.datagen.groups import GroupProblem, Scored, sequences, text_sequences
from atroposlib.datagen.pull import BatchPuller
from atroposlib.datagen.sft import keep_best, sft_record
from atroposlib.datagen.writer import JsonlWriter
from atroposlib.utils.ports import free_port
from atroposlib.utils.tiny_model_training import SYSTEM_PROMPT
from tests.support.datagen import (
    SYSTEM,
    DataTool,
    chat_group,
    finished_run,
    post_groups,
    read_jsonl,
    trained_text,
    trl_sft_dataset,
)
from tests.support.processes import ApiProcess, EnvProcess, serve_args
from tests.support.text_groups import text_group
from tests.support.waiting import wait_until

PROMPT = "Question: what is 3 + 4?\nAnswer:"
ANSWERS = [" 1", " 0", " 3", " -1", " 2"]
SCORES = [1.0, 0.0, 3.0, -1.0, 2.0]


def scored(*scores: float) -> list[Scored]:
    return [Scored(score, "p", f"c{i}") for i, score in enumerate(scores)]


def names(kept: list[Scored]) -> list[str]:
    return [seq.completion for seq in kept]


def test_keep_best_follows_upstreams_rules():
    group = scored(*SCORES)
    assert names(keep_best(group, 3)) == ["c2", "c4", "c0"]  # best first, <= 0 dropped
    assert names(keep_best(group, 2)) == ["c2", "c4"]
    assert names(keep_best(group, 9, allow_negative_scores=True)) == ["c2", "c4", "c0", "c1", "c3"]
    # more than 3.5 above the group's lowest (-1, a dropped sequence) means above 2.5
    assert names(keep_best(group, 9, minimum_score_diff_max_min=3.5)) == ["c2"]
    assert names(keep_best(group, 9, minimum_score_diff_max_min=3.0)) == ["c2"]  # 4 > 3, 3 is not
    assert names(keep_best(scored(1.0, 1.0, 0.5), 9, minimum_score_diff_max_min=0.5)) == []
    assert names(keep_best(scored(2.0, 5.0, 2.0), 9)) == ["c1", "c0", "c2"]  # ties keep order


def test_records_in_trl_and_atropos_keys():
    seq = Scored(2.0, "Q:", " A")
    assert sft_record(seq, messages=False) == {"prompt": "Q:", "completion": " A"}
    assert sft_record(seq, False, "atropos") == {"prefix": "Q:", "completion": " A", "score": 2.0}
    chat = Scored(1.0, [{"role": "user", "content": "q"}], [{"role": "assistant", "content": "a"}])
    # conversational prompt/completion: TRL's loss is on the completion, as for text
    assert sft_record(chat, messages=True) == {"prompt": chat.prompt, "completion": chat.completion}
    assert sft_record(chat, True, "atropos") == {"messages": chat.whole, "score": 1.0}


def test_text_split_stops_at_the_masked_prompt(tiny_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    group = text_group(tok, PROMPT, [" 42", " 45"], [1.0, 0.0])  # completions share " 4"
    split = text_sequences(group, tok)
    assert [(s.prompt, s.completion) for s in split] == [(PROMPT, " 42"), (PROMPT, " 45")]
    unmasked = {**group, "masks": [list(t) for t in group["tokens"]]}
    shared = text_sequences(unmasked, tok)  # no masked prompt: the shared tokens are the prompt
    assert all(
        s.prompt + s.completion == PROMPT + c for s, c in zip(shared, [" 42", " 45"], strict=True)
    )
    assert len(shared[0].prompt) > len(PROMPT)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"scores": [1.0]}, "scores has 1 entries for 2 sequences"),
        ({"masks": [[-100, 1]]}, "masks has 1 sequences, tokens has 2"),
        ({"masks": [[-100, 1], [-100]]}, "mask length 1 differs from token length 2"),
        ({"scores": [1.0, float("nan")]}, "score must be finite, got nan"),
        ({"tokens": "not a list"}, "the group does not parse: tokens"),
        ({"messages": [[{"role": "user"}], []]}, "every message needs 'role' and 'content'"),
    ],
)
def test_a_group_with_mismatched_lengths_is_a_group_problem(change, why):
    group = {"tokens": [[5, 1], [5, 2]], "masks": [[-100, 1], [-100, 2]], "scores": [1.0, 0.0]}
    with pytest.raises(GroupProblem, match=why):
        sequences({**group, **change}, tokenizer=None, messages=True)


def test_messages_mode_needs_messages():
    group = {"tokens": [[5, 1]], "masks": [[-100, 1]], "scores": [1.0]}
    with pytest.raises(GroupProblem, match="--env.include_messages true"):
        sequences(group, tokenizer=None, messages=True)


def sft_tool(tmp_path, out, api_url, *extra, env=None) -> DataTool:
    args = [str(out), "--api-url", api_url, "--group-size", "5", "--tasks-per-step", "1", *extra]
    return DataTool("sft", tmp_path, *args, env=env)


def test_text_records_follow_the_rules_and_feed_trls_sft_trainer(
    api, wire_client, tmp_path, tiny_model_path
):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    out = tmp_path / "sft.jsonl"
    # an earlier run's file, its last line without a newline: --append-to-previous keeps
    # it, and the new record equal to it is dropped as a duplicate (a tool process costs
    # about 4 s of CPU, so this run asks that too)
    out.write_text(json.dumps({"prompt": PROMPT, "completion": " 3"}))
    tool = sft_tool(
        tmp_path,
        out,
        api.url,
        "--append-to-previous",
        "--tokenizer",
        tiny_model_path,
        "--num-seqs-to-save",
        "3",
    )
    try:
        post_groups(wire_client, [text_group(tok, PROMPT, ANSWERS, SCORES)])
        post_groups(
            wire_client,
            [
                text_group(
                    tok, "Say hi:", [" hi", " no", " yo", " x", " y"], [0.0, 0.0, 5.0, 0.0, 0.0]
                )
            ],
        )
        assert tool.wait() == 0, tool.log()
    finally:
        tool.stop()
    records = read_jsonl(out)
    assert records == [
        {"prompt": PROMPT, "completion": " 3"},
        {"prompt": PROMPT, "completion": " 2"},
        {"prompt": PROMPT, "completion": " 1"},
        {"prompt": "Say hi:", "completion": " yo"},
    ]
    assert "wrote 3 seqs" in tool.log()
    assert "1 identical duplicate seqs dropped" in tool.log()
    prepared = trl_sft_dataset(out, tiny_model_path, tmp_path / "trl")
    assert len(prepared) == 4
    assert trained_text(tok, prepared[1]).startswith(" 2")
    assert tok.decode(prepared[1]["input_ids"]).startswith(PROMPT)


def test_messages_and_atropos_keys(api, wire_client, tmp_path, tiny_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    question = [{"role": "user", "content": "3 + 4?"}]
    group = text_group(tok, PROMPT, ANSWERS, SCORES)
    group["messages"] = [question + [{"role": "assistant", "content": a.strip()}] for a in ANSWERS]
    out, upstream_out = tmp_path / "chat.jsonl", tmp_path / "upstream.jsonl"
    tool = sft_tool(
        tmp_path,
        out,
        api.url,
        "--save-messages",
        "--num-seqs-to-save",
        "3",
        "--tokenizer",
        "/nonexistent/not-loaded-with-messages",
    )
    try:
        post_groups(wire_client, [group])
        assert tool.wait() == 0, tool.log()
    finally:
        tool.stop()
    assert [r["completion"] for r in read_jsonl(out)] == [
        [{"role": "assistant", "content": a}] for a in "321"
    ]
    assert all(r["prompt"] == question for r in read_jsonl(out))
    prepared = trl_sft_dataset(out, tiny_model_path, tmp_path / "trl")
    assert len(prepared) == 3
    for row, answer in zip(prepared, "321", strict=True):  # trained: the answer alone
        trained = trained_text(tok, row)
        assert trained.startswith(answer) and "3 + 4?" not in trained

    tool = sft_tool(
        tmp_path,
        upstream_out,
        api.url,
        "--format",
        "atropos",
        "--save-messages",
        "false",  # the group carries messages: decoded text only when asked
        "--tokenizer",
        tiny_model_path,
        "--num-seqs-to-save",
        "1",
        "--minimum-score-diff-max-min",
        "3.5",
    )
    try:
        post_groups(wire_client, [group])
        assert tool.wait() == 0, tool.log()
    finally:
        tool.stop()
    assert read_jsonl(upstream_out) == [{"prefix": PROMPT, "completion": " 3", "score": 3.0}]


def test_bad_output_paths_are_refused_before_registering(api, wire_client, tmp_path):
    missing = tmp_path / "no-such-dir" / "out.jsonl"
    tool = sft_tool(tmp_path, missing, api.url)
    assert tool.wait() == 1
    assert f"mkdir -p {missing.parent}" in tool.log()
    assert not missing.parent.exists()
    existing = tmp_path / "old.jsonl"
    existing.write_text('{"prompt": "kept", "completion": "!"}\n')
    tool = sft_tool(tmp_path, existing, api.url)
    assert tool.wait() == 1
    assert "already exists: pass --append-to-previous" in tool.log()
    assert existing.read_text() == '{"prompt": "kept", "completion": "!"}\n'
    assert wire_client.get("/info").json()["batch_size"] == -1  # nobody registered


# --append-to-previous: test_text_records_follow_the_rules_and_feed_trls_sft_trainer


def test_a_tokenizer_that_cannot_be_loaded_names_the_flag(api, wire_client, tmp_path):
    out = tmp_path / "out.jsonl"
    tool = sft_tool(tmp_path, out, api.url, "--tokenizer", str(tmp_path / "missing-tokenizer"))
    assert tool.wait() == 1
    assert "cannot load the tokenizer" in tool.log() and "--tokenizer" in tool.log()
    assert not out.exists()
    assert wire_client.get("/info").json()["batch_size"] == -1


def test_unreachable_api_and_a_key_protected_one(api_factory, tmp_path):
    # --save-messages: no tokenizer to load before the API is asked (transformers' import)
    url = f"http://127.0.0.1:{free_port()}"
    tool = sft_tool(tmp_path, tmp_path / "a.jsonl", url, "--save-messages")
    assert tool.wait() == 1
    assert f"is run-api running at {url}?" in tool.log()
    locked = api_factory("--api-key", "k")
    tool = sft_tool(tmp_path, tmp_path / "b.jsonl", locked.url, "--save-messages")
    assert tool.wait() == 1
    assert "wants a token" in tool.log() and "ATROPOS_API_KEY" in tool.log()
    assert "Traceback" not in tool.log()


def test_ctrl_c_leaves_whole_lines_and_a_summary(api, wire_client, tmp_path, tiny_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    out = tmp_path / "out.jsonl"
    tool = sft_tool(
        tmp_path,
        out,
        api.url,
        "--tokenizer",
        tiny_model_path,
        "--save-top-n-per-group",
        "5",
        "--allow-negative-scores",
        "--keep-duplicates",  # the same group three times: 15 lines
        "--num-seqs-to-save",
        "1000",
    )
    try:
        post_groups(wire_client, [text_group(tok, PROMPT, ANSWERS, SCORES)] * 3)
        wait_until(lambda: out.exists() and out.read_text().count("\n") >= 15, 120, "no lines")
        tool.proc.send_signal(signal.SIGINT)
        assert tool.wait() == 0, tool.log()
    finally:
        tool.stop()
    assert len(read_jsonl(out)) == 15
    assert "wrote 15 seqs" in tool.log() and "stopped early on request" in tool.log()
    assert httpx.get(f"{api.url}/health").status_code == 200


@pytest.mark.integration
@pytest.mark.parametrize(
    ("module", "flags"),
    [
        (
            "atroposlib.cli.sft",
            {
                "--api-url": "'http://localhost:8000'",
                "--group-size": "2",
                "--max-token-len": "2048",
                "--tokenizer": "'NousResearch/DeepHermes-3-Llama-3-8B-Preview'",
                # --save-messages: unset by default (messages when the groups carry them)
                "--save-top-n-per-group": "3",
                "--num-seqs-to-save": "100",
                "--allow-negative-scores": "False",
                "--minimum-score-diff-max-min": "0.0",
                "--append-to-previous": "False",
                "--tasks-per-step": "64",
            },
        ),
        (
            "atroposlib.cli.dpo",
            {"--save-n-pairs-per-group": "3", "--minimum-score-diff-max-min": "0.5"},
        ),
    ],
)
def test_help_lists_upstreams_flags_and_defaults(module, flags):
    import re
    import subprocess
    import sys

    shown = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True
    ).stdout
    flat = re.sub(r"\s+", " ", shown)
    for flag, default in flags.items():
        assert re.search(
            rf"{re.escape(flag)} [A-Z_\[\]]+ .*?\(default: {re.escape(default)}\)", flat
        ), flag


def test_upstream_style_switches_before_the_path():
    from atroposlib.datagen.settings import switches_first

    switches = {"--save-messages", "--append-to-previous"}
    assert switches_first(["--save-messages", "out.jsonl"], switches) == [
        "--save-messages=true",
        "out.jsonl",
    ]
    assert switches_first(["--save-messages", "false", "o"], switches) == [
        "--save-messages",
        "false",
        "o",
    ]
    assert switches_first(["o", "--append-to-previous"], switches) == ["o", "--append-to-previous"]


def test_run_api_restarted_under_a_serving_env_and_the_tool_stalls_neither(
    api_factory, inference_server, tmp_path, tiny_model_path
):
    """An env paced by an earlier trainer's batch of 4, then sft-gen asking for 16, then
    run-api killed and started again without its state: the env follows the new batch
    size (from /status-env, then /info after it registers again), the tool registers
    again, says what it waits for, and finishes. Before, the env kept the batch size it
    first read and queued at most max_batches_offpolicy x 4 sequences: the tool sat at 0%.

    It is also the real environment's run: arith_env serving on the tiny model, sft-gen
    pulling, and TRL preparing what it wrote (each such run starts an env and the tool,
    about 12 s of CPU, so one run asks both)."""
    api = api_factory()
    with BatchPuller(api.url, 4, 2048, tool="atropos-sft-gen") as earlier:
        earlier.register()  # the earlier trainer, same run, batches of 4
        assert earlier.next_batch() is None  # started: envs may register
    env = EnvProcess(
        tmp_path, "serve", *serve_args(api.url, inference_server.url, "--env.fixed_score", "1.0")
    )
    restarted = ApiProcess(tmp_path / "fresh-state", port=api.port)
    out = tmp_path / "served.jsonl"
    tool = None
    try:
        wait_until(
            lambda: httpx.get(f"{api.url}/status").json()["queued_sequences"] >= 4,
            180,
            f"the env queued nothing:\n{env.log()}",
        )
        tool = sft_tool(
            tmp_path,
            out,
            api.url,
            "--group-size",
            "4",
            "--tasks-per-step",
            "4",  # batches of 16
            "--tokenizer",
            tiny_model_path,
            # 24 groups: more than the tool can have taken (2 batches) plus the env's
            # window (3 batches) when the API is killed after the first one is written,
            # so groups made after the restart are needed
            "--num-seqs-to-save",
            "48",
            "--save-top-n-per-group",
            "2",
        )
        wait_until(lambda: out.exists() and read_jsonl(out), 300, f"no batch:\n{tool.log()}")
        api.kill()
        restarted.start()
        assert tool.wait(300) == 0, tool.log() + env.log()
    finally:
        if tool is not None:
            tool.stop()
        env.stop()
        restarted.stop()
    assert "API holds " in tool.log() and "/16 sequences of the next batch" in tool.log()
    assert "registered again" in tool.log()
    assert "the trainer's batch size is now 16 (was 4)" in env.log()
    assert "registered again as env_id" in env.log()
    records = read_jsonl(out)
    assert len(records) == 48 and all(set(r) == {"prompt", "completion"} for r in records)
    # the env sends messages, so by default the records are conversations, each once
    assert "the groups carry chat messages, so the records are messages" in tool.log()
    system = {"role": "system", "content": SYSTEM_PROMPT}
    assert all(r["prompt"][0] == system for r in records)
    assert all([m["role"] for m in r["completion"]] == ["assistant"] for r in records)
    assert len({json.dumps(r, sort_keys=True) for r in records}) == 48
    prepared = trl_sft_dataset(out, tiny_model_path, tmp_path / "trl")
    assert len(prepared) == 48  # the prompt masked, the answer trained
    assert all(row["labels"][0] == -100 and row["labels"][-1] != -100 for row in prepared)


def test_identical_records_are_written_once_unless_asked(tmp_path):
    out = tmp_path / "sft.jsonl"
    out.write_text('{"prefix": "Q", "completion": " A", "score": 1.0}\n')  # an earlier run's
    with JsonlWriter(out, append=True) as writer:
        assert not writer.write({"prefix": "Q", "completion": " A", "score": 2.0})  # score aside
        assert writer.write({"completion": " B", "prefix": "Q"})
        assert not writer.write({"prefix": "Q", "completion": " B"})  # key order aside
        assert (writer.count, writer.duplicates) == (1, 2)
    with JsonlWriter(out, append=True, keep_duplicates=True) as writer:
        assert writer.write({"prefix": "Q", "completion": " B"})
    assert [r["completion"] for r in read_jsonl(out)] == [" A", " B", " B"]


def test_a_run_that_cannot_be_read_is_one_line_and_exit_2(tmp_path, capsys):
    from atroposlib.cli.dpo import main as dpo_main
    from atroposlib.cli.sft import main

    no_messages = {"tokens": [[5, 1], [5, 2]], "masks": [[-100, 1], [-100, 2]], "scores": [1, 0]}
    (tmp_path / "empty").mkdir()
    loose = tmp_path / "groups.jsonl"  # groups outside a run directory: no config.yaml
    loose.write_text(json.dumps(no_messages) + "\n")
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b'{"tokens": [[5\n\xff\xfe\n[1, 2]\n')
    cases = [
        (tmp_path / "missing", f"{tmp_path / 'missing'} does not exist"),
        (tmp_path / "empty", "holds no rollouts: no rollouts/*.jsonl"),
        (cut, f"{cut} holds no groups yet, 3 unreadable line(s) skipped"),
        (loose, "so the tokenizer that decodes its tokens is unknown: pass --tokenizer"),
        (finished_run(tmp_path / "run", {"env": [no_messages]}, model=None), "names no model"),
    ]
    out = tmp_path / "out.jsonl"
    for source, said in cases:
        assert main([str(out), "--from-run", str(source)]) == 2, source
        errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
        assert len(errors) == 1 and said in errors[0], (source, errors)
        assert errors[0].startswith("atropos-sft-gen: error: ")
        assert not out.exists()
    assert dpo_main([str(out), "--from-run", str(tmp_path / "missing")]) == 2
    assert "atropos-dpo-gen: error: " in capsys.readouterr().err


def test_a_finished_runs_groups_feed_trls_sft_trainer(tmp_path, tiny_model_path, capsys):
    """A run directory as atropos-launch leaves it: two environments, groups of different
    sizes, the same best answer three times in a group and again in another environment,
    an unusable group and a line cut by a crash; no API, no --tokenizer, no --group-size."""
    from atroposlib.cli.sft import main
    from atroposlib.utils.tokenizers import load_tokenizer

    tok = load_tokenizer(str(tiny_model_path))
    first, second = "What is 3 + 9 mod 10?", "What is 1 + 1 mod 10?"
    unusable = chat_group(tok, "What is 4 + 4 mod 10?", ["8", "9"], [1.0, 0.0], "c")
    run = finished_run(
        tmp_path / "run",
        {
            "arith": [
                chat_group(tok, first, ["2", "2", "2", "5"], [1.0, 1.0, 1.0, 0.0], "a"),
                chat_group(tok, second, ["2", "3"], [1.0, 0.0], "b"),
            ],
            "mod": [{**unusable, "scores": [1.0]}, chat_group(tok, first, ["2"], [1.0], "d")],
        },
        tail='{"tokens": [[1, 2',
    )
    out = tmp_path / "sft.jsonl"
    assert main([str(out), "--from-run", str(run), "--group-size", "8"]) == 0
    said = capsys.readouterr().err
    answer = [{"role": "assistant", "content": "2"}]
    assert read_jsonl(out) == [
        {"prompt": [SYSTEM, {"role": "user", "content": q}], "completion": answer}
        for q in (first, second)
    ]
    for line in (
        "--group-size ignored",
        "the groups carry chat messages, so the records are messages",
        "arith.jsonl: skipped 1 unreadable line(s) (line 3",
        f"wrote 2 seqs to {out} from 4 of 4 groups in {run} (2 environments); 1 groups "
        "skipped as unusable; 3 identical duplicate seqs dropped; 2 unreadable lines skipped",
    ):
        assert line in said, said
    # `atropos-rollouts export --format sft` writes the same records (its groups come
    # through the same rules), and it is that file TRL prepares here
    from atroposlib.cli.rollouts import main as rollouts

    exported = tmp_path / "exported.jsonl"
    assert rollouts(["export", str(run), "--format", "sft", "--out", str(exported)]) == 0
    assert exported.read_text() == out.read_text()
    prepared = trl_sft_dataset(exported, tiny_model_path, tmp_path / "trl")
    assert [first in tok.decode(row["input_ids"]) for row in prepared] == [True, False]
    for row in prepared:  # TRL's loss: on the answer, not the system prompt or question
        assert trained_text(tok, row).startswith("2<|im_end|>")

    text = tmp_path / "text.jsonl"  # the old form: decoded by the run's model (config.yaml)
    flags = ["--save-messages", "false", "--num-seqs-to-save", "1"]
    assert main([str(text), "--from-run", str(run), *flags]) == 0
    (record,) = read_jsonl(text)
    assert record["prompt"].startswith("<|im_start|>system") and first in record["prompt"]
    assert record["completion"].startswith("2")

    before = out.read_text()  # again onto the same file: every record is there already
    assert main([str(out), "--from-run", str(run), "--append-to-previous"]) == 0
    assert out.read_text() == before
    assert "wrote 0 seqs" in (said := capsys.readouterr().err) and "5 identical" in said, said
