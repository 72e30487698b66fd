"""What a config needs of the model and of this machine (atroposlib/launch/needs.py):
one line naming the key, before anything starts."""

from __future__ import annotations

import sys

import pytest

from atroposlib.cli.launch import main
from atroposlib.launch.checks import as_yaml_keys
from atroposlib.launch.config import load_config
from atroposlib.launch.needs import context_finding, model_context, start_probes
from atroposlib.launch.plan import plan
from tests.support.launch import launch_config, write_config


def planned(tmp_path, **trainer_args):
    config = launch_config(tmp_path / "r")
    config["trainer"]["args"].update(trainer_args)
    path = write_config(tmp_path / "c.yaml", config)
    return plan(load_config(path), path)


@pytest.mark.integration
def test_a_token_limit_over_the_models_context_names_the_key(tmp_path, tiny_model_path):
    assert context_finding(planned(tmp_path)).problem is None  # the tiny model holds 512
    too_long = context_finding(planned(tmp_path, seq_len=1024)).problem
    assert too_long is not None and too_long.startswith(
        "trainer.args.seq_len 1024 is over the model's context of 512 tokens"
    )
    engine = context_finding(planned(tmp_path, max_model_len=600)).problem
    assert engine is not None and engine.startswith("trainer.args.max_model_len 600 is over")


def test_model_context_reads_each_familys_key_and_a_vlms_text_model():
    assert model_context({"max_position_embeddings": 4096}) == 4096
    assert model_context({"n_positions": 1024}) == 1024
    assert model_context({"text_config": {"max_position_embeddings": 8192}}) == 8192
    assert model_context({"vocab_size": 10}) is None


def test_an_environments_flags_read_as_the_yaml_keys_of_its_section():
    line = "env.py serve: unknown flag --env.group_sise; did you mean --env.group_size?"
    assert as_yaml_keys(line, 2) == (
        "env.py serve: unknown key environments.2.env.group_sise; "
        "did you mean environments.2.env.group_size?"
    )
    assert as_yaml_keys("lower --openai.timeout", 0) == "lower environments.0.openai.timeout"
    assert as_yaml_keys(line, None) == line


@pytest.mark.integration
def test_cuda_and_vllm_this_machine_lacks_are_named_with_the_key(tmp_path, tiny_model_path):
    import importlib.util

    import torch

    if torch.cuda.is_available() or importlib.util.find_spec("vllm"):
        pytest.skip("this machine has CUDA or vLLM: nothing is missing to name")
    needy = planned(tmp_path, device="cuda", inference_engine="vllm")
    findings = {f.check: f for f in (p.finding(60) for p in start_probes(needy))}
    cuda, vllm = findings["CUDA"], findings["vLLM"]
    assert cuda.machine and cuda.problem is not None
    assert cuda.problem.startswith("trainer.args.device cuda: torch ") and "no CUDA" in cuda.problem
    assert vllm.machine and vllm.problem is not None
    assert vllm.problem.startswith(f"trainer.args.inference_engine vllm: {sys.executable}")
    assert start_probes(planned(tmp_path)) == []  # a CPU config needs neither


@pytest.mark.integration
def test_a_launch_lists_every_problem_at_once(tmp_path, tiny_model_path, capsys):
    config = launch_config(tmp_path / "r")
    config["trainer"]["args"].update(seq_len=1024, device="cuda")
    config["environments"][0]["env"]["group_sise"] = 4
    code = main([str(write_config(tmp_path / "c.yaml", config))])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "environments.0.env.group_sise" in err and "trainer.args.seq_len 1024" in err
    import torch

    assert ("trainer.args.device cuda" in err) != torch.cuda.is_available()
    assert not (tmp_path / "r").exists()
