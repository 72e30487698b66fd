"""The tokenizer loader builds what `AutoTokenizer` builds, and an environment imports no torch.

`load_tokenizer` skips `AutoTokenizer` (and with it torch) only where the tokenizer's
files settle the class; these tests hold it to `AutoTokenizer`'s answer on the tiny
model, on a copy that `AutoTokenizer` reroutes, and on an environment's whole run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.utils import tokenizers
from atroposlib.utils.tokenizers import GENERIC_CLASS, builds_generic_class, load_tokenizer
from tests.support.compat_runs import env_vars, failure

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [
    {"role": "system", "content": "Answer with one digit."},
    {"role": "user", "content": "What is 3 + 9 mod 10?"},
    {"role": "assistant", "content": "2"},
]


def test_the_tables_are_read_from_the_installed_transformers():
    classes, rerouted = tokenizers.auto_tokenizer_tables()
    assert len(classes) > 100 and len(rerouted) > 5
    assert all(isinstance(name, str) for name in rerouted)


@pytest.mark.parametrize(
    ("tokenizer_config", "model_config", "generic"),
    [
        ({"tokenizer_class": GENERIC_CLASS}, {"model_type": "llama"}, True),
        ({"tokenizer_class": GENERIC_CLASS}, {}, True),
        ({"tokenizer_class": "Qwen2Tokenizer"}, {"model_type": "qwen2"}, False),
        ({"tokenizer_class": GENERIC_CLASS, "auto_map": {"AutoTokenizer": ["a", "b"]}}, {}, False),
        ({}, {"model_type": "llama"}, False),
    ],
)
def test_only_files_that_settle_the_class_skip_auto_tokenizer(
    tokenizer_config, model_config, generic
):
    assert builds_generic_class(tokenizer_config, model_config) is generic


def test_a_model_type_auto_tokenizer_reroutes_or_may_give_to_mistral_goes_through_it():
    classes, rerouted = tokenizers.auto_tokenizer_tables()
    mistral = next(t for t, names in classes.items() if "MistralCommonBackend" in names)
    for model_type in (next(iter(rerouted)), mistral):
        config = {"tokenizer_class": GENERIC_CLASS}
        assert not builds_generic_class(config, {"model_type": model_type}), model_type


def test_unreadable_tables_send_every_tokenizer_through_auto_tokenizer(monkeypatch):
    monkeypatch.setattr(tokenizers, "auto_tokenizer_tables", lambda: None)
    assert not builds_generic_class({"tokenizer_class": GENERIC_CLASS}, {"model_type": "llama"})


def assert_same_tokenizer(ours, theirs) -> None:
    assert type(ours) is type(theirs)
    text = "What is 3 + 9 mod 10? <|im_end|> ünïcode"
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    ids = theirs(text)["input_ids"]
    assert ours.decode(ids) == theirs.decode(ids)
    for prompt in (True, False):
        rendered = theirs.apply_chat_template(
            MESSAGES, tokenize=False, add_generation_prompt=prompt
        )
        assert ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=prompt) == (
            rendered
        )
    assert (ours.eos_token_id, ours.pad_token_id) == (theirs.eos_token_id, theirs.pad_token_id)
    assert ours.all_special_ids == theirs.all_special_ids and len(ours) == len(theirs)


@pytest.mark.integration
def test_the_tiny_models_tokenizer_is_auto_tokenizers_without_it(tiny_model_path):
    from transformers import AutoTokenizer

    assert tokenizers.load_generic_tokenizer(str(tiny_model_path)) is not None
    assert_same_tokenizer(
        load_tokenizer(str(tiny_model_path)), AutoTokenizer.from_pretrained(str(tiny_model_path))
    )


@pytest.mark.integration
def test_a_tokenizer_auto_tokenizer_reroutes_is_loaded_by_it(tiny_model_path, tmp_path):
    """The tiny tokenizer under a model type whose hub class AutoTokenizer corrects."""
    from transformers import AutoTokenizer

    _, rerouted = tokenizers.auto_tokenizer_tables()
    copy = Path(shutil.copytree(tiny_model_path, tmp_path / "rerouted"))
    config = json.loads((copy / "config.json").read_text())
    model_type = "qwen2" if "qwen2" in rerouted else sorted(rerouted)[0]
    (copy / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    assert tokenizers.load_generic_tokenizer(str(copy)) is None
    assert_same_tokenizer(load_tokenizer(str(copy)), AutoTokenizer.from_pretrained(str(copy)))


WITNESS = """
import atexit, runpy, sys
atexit.register(lambda: print("torch imported:", "torch" in sys.modules, file=sys.stderr))
# transformers.models scans every model's source as it is imported (over a second of CPU)
models = lambda: "transformers.models" in sys.modules
atexit.register(lambda: print("models imported:", models(), file=sys.stderr))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.integration
def test_an_environments_whole_process_run_imports_no_torch_and_no_model_sources(
    inference_server, tiny_model_path, tmp_path
):
    out = tmp_path / "groups.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", WITNESS, str(ROOT / "environments" / "mod_arithmetic.py")]
        + ["process", "--env.total_steps", "2", "--env.use_wandb", "false"]
        + ["--env.tokenizer_name", str(tiny_model_path)]
        + ["--env.data_path_to_save_groups", str(out)]
        + ["--openai.base_url", f"{inference_server.url}/v1", "--openai.model_name", "tiny"],
        cwd=tmp_path,
        env=env_vars(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, failure(done)
    assert len(out.read_text().splitlines()) == 2, failure(done)
    assert "torch imported: False" in done.stderr, failure(done)
    assert "models imported: False" in done.stderr, failure(done)
