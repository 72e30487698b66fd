"""A model directory that cannot load is named before torch is imported."""

from __future__ import annotations

import pytest

from atroposlib.cli.inference_server import main as inference_server_main
from atroposlib.utils.model_files import local_model_problem


def saved_model(tmp_path, *files: str):
    where = tmp_path / "model"
    where.mkdir()
    for name in files:
        (where / name).write_text("{}")
    return where


@pytest.mark.parametrize(
    "files",
    [
        ("config.json", "model.safetensors"),
        ("config.json", "model.safetensors.index.json"),
        ("config.json", "pytorch_model.bin"),
        ("adapter_config.json", "adapter_model.safetensors"),
    ],
)
def test_a_saved_model_passes(tmp_path, files):
    assert local_model_problem(str(saved_model(tmp_path, *files))) is None


def test_hub_ids_are_left_to_from_pretrained(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert local_model_problem("Qwen/Qwen2.5-0.5B-Instruct") is None
    assert local_model_problem("gpt2") is None


@pytest.mark.parametrize(
    ("files", "says"),
    [
        (("config.json", "tokenizer.json"), "holds no weights"),
        (("tokenizer.json", "model.safetensors"), "no config.json"),
    ],
)
def test_a_directory_that_cannot_load_says_why(tmp_path, files, says):
    problem = local_model_problem(str(saved_model(tmp_path, *files)))
    assert problem is not None and says in problem


def test_a_missing_path_and_a_file_are_refused(tmp_path):
    assert "no such directory" in local_model_problem(str(tmp_path / "gone"))
    assert "no such directory" in local_model_problem("./gone-model")
    (tmp_path / "weights.safetensors").write_text("")
    assert "not a model directory" in local_model_problem(str(tmp_path / "weights.safetensors"))


def test_the_inference_server_refuses_at_once(tmp_path, capsys):
    model = saved_model(tmp_path, "config.json")
    assert inference_server_main(["--model", str(model), "--port", "0"]) == 1
    assert "holds no weights" in capsys.readouterr().err
