"""The tiny model kit: real, offline, deterministic, cached."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from atroposlib.utils.tiny_model import (  # noqa: E402
    BUILD_RECORD,
    TinyModelCheckFailed,
    TinyModelSpec,
    build_tiny_model,
    check_reading,
    default_cache_dir,
    ensure_tiny_model,
    read_build_record,
)
from atroposlib.utils.tiny_model_training import Questions, answer_targets, measure  # noqa: E402

# too few steps to learn anything, for the determinism and failure paths: each step (all
# 100 questions, on one thread) costs about 0.3 s of CPU, and three of them already take
# the optimizer past its first step, whose state the later ones use
QUICK = TinyModelSpec(max_steps=3, corpus_size=200)


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


@pytest.mark.learning
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


@pytest.mark.learning
def test_the_built_model_reads_the_question(tiny_model_path):
    """Re-measured from the saved files, the model is what its build record says."""
    tokenizer, model = load(tiny_model_path)
    record = read_build_record(tiny_model_path)
    spec = TinyModelSpec(**record["spec"])
    questions = Questions.for_tokenizer(tokenizer)
    reading = measure(model, questions, answer_targets(questions, len(tokenizer), spec))
    assert check_reading(reading, spec) == []
    assert reading.greedy_accuracy >= 0.3 and 0.25 <= reading.p_right <= 0.35
    assert reading.p_right == pytest.approx(record["reading"]["p_right"], abs=1e-4)
    assert record["converged"] and record["machine"]["torch_cpu_capability"]
    # sampled at temperature 1, as the quickstart's environment does
    torch.manual_seed(0)
    with torch.no_grad():
        probs = torch.softmax(model(questions.ids).logits[:, -1], -1)
    drawn = torch.multinomial(probs, 20, replacement=True)
    sampled = (drawn == questions.right[:, None]).float().mean().item()
    assert 0.2 < sampled < 0.4, sampled


@pytest.mark.integration
def test_same_seed_same_model_other_seed_other_model(tmp_path):
    first = load(build_tiny_model(tmp_path / "a", QUICK, verify=False))[1].state_dict()
    again = load(build_tiny_model(tmp_path / "b", QUICK, verify=False))[1].state_dict()
    other_spec = QUICK.model_copy(update={"seed": 1})
    other = load(build_tiny_model(tmp_path / "c", other_spec, verify=False))[1]
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(
        first["model.embed_tokens.weight"], other.state_dict()["model.embed_tokens.weight"]
    )


@pytest.mark.integration
def test_a_model_that_does_not_read_is_never_cached(tmp_path):
    with pytest.raises(TinyModelCheckFailed) as failure:
        ensure_tiny_model(QUICK, cache_dir=tmp_path)
    message = str(failure.value)
    assert "does not read the question after 3 steps" in message
    assert "greedy accuracy is 0." in message and "question-blind model gets 0.10" in message
    assert "p(right) is 0." in message and "torch kernels" in message
    assert [p.name for p in tmp_path.iterdir()] == [f"{QUICK.cache_key()}.lock"]


def test_the_cache_is_built_once_and_keyed_by_kit_version(tiny_model_path):
    """The session's model came from an empty cache (conftest) and is reused as is."""
    assert tiny_model_path.parent == default_cache_dir()
    assert tiny_model_path.name.startswith("tiny-v3-")
    stamp = os.stat(tiny_model_path / "model.safetensors").st_mtime_ns
    assert ensure_tiny_model() == tiny_model_path
    assert os.stat(tiny_model_path / "model.safetensors").st_mtime_ns == stamp
    assert (tiny_model_path / BUILD_RECORD).exists()
    assert not [p for p in default_cache_dir().iterdir() if p.name.startswith(".building-")]


def test_without_a_directory_the_command_shows_the_cached_models_figures(tiny_model_path):
    """What the quickstart prints before its run: the session's model, found, not rebuilt."""
    stamp = os.stat(tiny_model_path / "model.safetensors").st_mtime_ns
    result = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.make_tiny_model"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    _, model = load(tiny_model_path)
    record = read_build_record(tiny_model_path)
    # a model cached before build_seconds was recorded shows its training's seconds
    seconds = record.get("build_seconds", record["seconds"])
    assert result.stdout.splitlines() == [
        f"tiny model found: {model.num_parameters():,} parameters, vocab "
        f"{model.config.vocab_size}, context {model.config.max_position_embeddings} (build: "
        f"{seconds:.0f} s, {record['steps']} steps, greedy accuracy "
        f"{record['reading']['greedy_accuracy']:.2f})",
        f"  {tiny_model_path}",
    ]
    assert 0 < record["seconds"] <= seconds
    assert os.stat(tiny_model_path / "model.safetensors").st_mtime_ns == stamp


@pytest.mark.integration
def test_command_line(tmp_path, capsys):
    """A build that fails its check: exit 1, the reason, nothing written. It runs through
    the command's `main` in this process (a subprocess would import torch and
    transformers again, about 7 s of CPU); the command as a process is the bad flag's
    run below and test_without_a_directory_the_command_shows_the_cached_models_figures."""
    from atroposlib.cli import make_tiny_model

    argv = [str(tmp_path / "m"), "--max-steps", "2", "--corpus-size", "50"]
    assert make_tiny_model.main(argv) == 1
    said = capsys.readouterr().err
    assert "atropos-make-tiny-model: error: " in said
    assert "does not read the question after 2 steps" in said
    assert not (tmp_path / "m").exists()
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
    assert "Traceback" not in bad.stderr and not (tmp_path / "x").exists()
