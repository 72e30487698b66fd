"""The tiny model kit: real, offline, deterministic, cached."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from atroposlib.utils.tiny_model import TinyModelSpec, build_tiny_model, ensure_tiny_model  # noqa: E402

QUICK = TinyModelSpec(teach_steps=10, train_steps=15, corpus_size=200)


def load(path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    return tokenizer, model


def test_reloads_offline_with_chat_template(tiny_model_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer, model = load(tiny_model_path)
    assert model.config.model_type == "llama"
    assert model.config.head_dim == 32
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    messages = [{"role": "user", "content": "What is 2 + 3 mod 10?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nWhat is 2 + 3 mod 10?<|im_end|>\n<|im_start|>assistant\n"
    text = "Ünïcode & emoji 🙂 round-trip"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_samples_are_well_formed_answers(tiny_model_path):
    tokenizer, model = load(tiny_model_path)
    system = {"role": "system", "content": "Answer with one digit."}
    for a, b in [(1, 2), (7, 8), (4, 4)]:
        user = {"role": "user", "content": f"What is {a} + {b} mod 10?"}
        ids = tokenizer.apply_chat_template(
            [system, user], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        out = model.generate(ids, max_new_tokens=6, do_sample=False)
        completion = tokenizer.decode(out[0, ids.shape[1] :])
        assert completion[0].isdigit() and completion[1:] == "<|im_end|>", completion


def test_same_seed_same_model_other_seed_other_model(tmp_path):
    first = load(build_tiny_model(tmp_path / "a", QUICK))[1].state_dict()
    again = load(build_tiny_model(tmp_path / "b", QUICK))[1].state_dict()
    other = load(build_tiny_model(tmp_path / "c", QUICK.model_copy(update={"seed": 1})))[1]
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(
        first["model.embed_tokens.weight"], other.state_dict()["model.embed_tokens.weight"]
    )


def test_cache_builds_once(tmp_path):
    path = ensure_tiny_model(QUICK, cache_dir=tmp_path)
    stamp = os.stat(path / "model.safetensors").st_mtime_ns
    assert ensure_tiny_model(QUICK, cache_dir=tmp_path) == path
    assert os.stat(path / "model.safetensors").st_mtime_ns == stamp
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".building-")]


def test_command_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "atroposlib.cli.make_tiny_model",
            str(tmp_path / "m"),
            "--teach-steps",
            "5",
            "--train-steps",
            "5",
            "--corpus-size",
            "50",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "m" / "config.json").exists() and (
        tmp_path / "m" / "tokenizer.json"
    ).exists()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "atroposlib.cli.make_tiny_model",
            str(tmp_path / "x"),
            "--seed",
            "one",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--seed 'one'" in bad.stderr
