"""Upstream's trainer spellings that `atropos-grpo` accepts, each with the effect it has here."""

from __future__ import annotations

import pytest

from atroposlib.utils.flags import parse_settings
from example_trainer.config import TrainingConfig, build_parser


def parsed(*argv: str) -> TrainingConfig:
    config, _ = parse_settings(build_parser(), TrainingConfig, ["--model-name", "m", *argv])
    return config


def refusal(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as stop:
        parsed(*argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_gpu_memory_utilization_is_the_engines_memory_share():
    assert parsed("--gpu-memory-utilization", "0.3").engine.gpu_memory_utilization == 0.3
    assert parsed().engine.gpu_memory_utilization == 0.45
    both = parsed("--gpu-memory-utilization", "0.3", "--vllm-gpu-memory-utilization", "0.3")
    assert both.engine.gpu_memory_utilization == 0.3


def test_gpu_memory_utilization_that_disagrees_with_ours_is_refused(capsys):
    err = refusal(capsys, "--gpu-memory-utilization", "0.3", "--vllm-gpu-memory-utilization", "0.5")
    assert "--gpu-memory-utilization and --vllm-gpu-memory-utilization disagree" in err


def test_lora_target_modules_takes_upstreams_space_separated_list_and_ours():
    upstream = parsed("--lora-target-modules", "q_proj", "v_proj", "k_proj", "--lr", "2e-5")
    assert upstream.lora.lora_target_modules.split(",") == ["q_proj", "v_proj", "k_proj"]
    assert upstream.optim.lr == 2e-5  # the list ends at the next flag
    ours = parsed("--lora-target-modules", "q_proj,o_proj")
    assert ours.lora.lora_target_modules == "q_proj,o_proj"
    assert parsed().lora.lora_target_modules == "q_proj,v_proj"
    for spelling in ("q_proj v_proj", "q_proj,  v_proj", ["q_proj", "v_proj"]):
        config = TrainingConfig(model_name="m", lora_target_modules=spelling)
        assert config.lora.lora_target_modules == "q_proj,v_proj", spelling


def test_an_empty_module_list_is_refused(capsys):
    err = refusal(capsys, "--lora-target-modules", ",")
    assert "--lora-target-modules" in err and "name at least one module" in err


def test_no_reference_logprobs_is_a_ratio_against_the_trainers_own_logprobs():
    assert parsed().loss.ratio_reference == "inference"  # upstream's default: the rollout's
    config = parsed("--no-reference-logprobs")
    assert config.loss.ratio_reference == "trainer"
    both = parsed("--no-reference-logprobs", "--ratio-reference", "trainer")
    assert both.loss.ratio_reference == "trainer"


def test_no_reference_logprobs_with_the_rollouts_ratio_is_refused(capsys):
    err = refusal(capsys, "--no-reference-logprobs", "--ratio-reference", "inference")
    assert "--no-reference-logprobs is --ratio-reference trainer" in err


def test_help_lists_upstreams_spellings():
    text = build_parser().format_help()
    for flag in ("--gpu-memory-utilization", "--lora-target-modules MODULE [MODULE ...]"):
        assert flag in text
    assert "--no-reference-logprobs" in text
