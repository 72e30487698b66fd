"""Mistakes a launch finds before it starts anything: --set overrides, the model, each
environment's own flags and tokenizer, and what --resume needs."""

from __future__ import annotations

import json

import pytest
import yaml

from atroposlib.cli.launch import main
from atroposlib.launch.checks import check_model_name
from atroposlib.launch.config import ConfigError, apply_override, load_config
from atroposlib.launch.resume import LaunchRecord, resume_target, write_record
from atroposlib.utils.tiny_model import TINY_MODEL_NAMES
from tests.support.launch import LAUNCHED_AS_SHIPPED, launch_config, shipped, write_config
from tests.support.source import REPO, SINGLE_TURN_SECTION, documented_block


def test_set_overrides_any_key_and_reads_the_value_as_yaml():
    data = {"trainer": {"args": {"lr": 0.1}}, "environments": [{"env": {}}]}
    apply_override(data, "trainer.args.lr=1e-5")
    apply_override(data, "environments.0.env.group_size=8")
    apply_override(data, "trainer.args.lora_target_modules=[q_proj, v_proj]")
    apply_override(data, "api.port=auto")
    assert data["trainer"]["args"] == {"lr": 1e-5, "lora_target_modules": ["q_proj", "v_proj"]}
    assert data["environments"][0]["env"] == {"group_size": 8}
    assert data["api"] == {"port": "auto"}


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("trainer.args.lr", "write KEY=VALUE"),
        ("trainer..lr=1", "write KEY=VALUE"),
        ("environments.3.env.x=1", "needs an index below 1"),
        ("environments.first.env.x=1", "needs an index below 1"),
        ("trainer.args.lr.x=1", "trainer.args.lr is a value, not a section"),
        ("trainer.args.lr=[1", "the value is not YAML"),
    ],
)
def test_a_set_that_cannot_apply_says_why(override, said):
    data = {"trainer": {"args": {"lr": 0.1}}, "environments": [{"env": {}}]}
    with pytest.raises(ConfigError, match="--set") as caught:
        apply_override(data, override)
    assert said in str(caught.value)


def test_a_set_key_the_config_does_not_have_is_refused_like_one_in_the_file(tmp_path):
    path = write_config(tmp_path / "c.yaml", launch_config(tmp_path / "r"))
    with pytest.raises(ConfigError, match="unknown key 'trainer.nprocs'"):
        load_config(path, ["trainer.nprocs=2"])
    assert load_config(path, ["trainer.nproc=2", "seed=7"]).seed == 7


def test_every_unknown_key_is_named_at_once_with_the_nearest_known_one(tmp_path):
    from atroposlib.launch.resolving import validated
    from example_trainer.config import TrainingConfig

    path = write_config(tmp_path / "c.yaml", launch_config(tmp_path / "r"))
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["trainer.lr=1e-4", "environments.0.envv.x=1", "sed=3"])
    said = str(caught.value)
    assert "unknown key 'trainer.lr'; did you mean trainer.args.lr?" in said
    assert "unknown key 'environments.0.envv'; did you mean environments.0.env?" in said
    assert "unknown key 'sed'; did you mean seed?" in said
    with pytest.raises(ConfigError) as caught:
        validated("trainer.args", {"training_step": 4, "lrr": 1.0, "zzz": 1}, TrainingConfig)
    assert str(caught.value).split("; ") == [
        "unknown key 'trainer.args.lrr' (not a TrainingConfig field)",
        "did you mean trainer.args.lr?",
        "unknown key 'trainer.args.training_step' (not a TrainingConfig field)",
        "did you mean trainer.args.training_steps?",
        "unknown key 'trainer.args.zzz' (not a TrainingConfig field)",
    ]


def test_the_model_is_a_directory_a_hub_name_or_tiny(tmp_path):
    for fine in ("tiny", "Qwen/Qwen2.5-0.5B-Instruct", "gpt2", str(tmp_path)):
        check_model_name(fine)
    (tmp_path / "weights.bin").write_text("")
    refused = {
        str(tmp_path / "missing"): "no directory",
        "./models/mine": "no directory",
        "~/models/mine": "no directory",
        "org/name/extra": "no directory",
        "org/na me": "no directory",
        str(tmp_path / "weights.bin"): "is a file",
    }
    for model, said in refused.items():
        with pytest.raises(ConfigError, match=said):
            check_model_name(model)


def test_a_missing_model_directory_stops_the_launch_in_one_line(tmp_path, capsys):
    config = launch_config(tmp_path / "r", model=str(tmp_path / "no-such-model"))
    code = main([str(write_config(tmp_path / "c.yaml", config)), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no directory" in err, err
    assert not (tmp_path / "r").exists()


def test_resume_needs_a_run_directory_with_its_record(tmp_path):
    with pytest.raises(ConfigError, match="no such run directory"):
        resume_target(tmp_path / "absent", None, [])
    (tmp_path / "old").mkdir()
    with pytest.raises(ConfigError, match="give its YAML too"):
        resume_target(tmp_path / "old", None, [])
    write_record(tmp_path / "old", LaunchRecord(config=str(tmp_path / "gone.yaml")))
    with pytest.raises(ConfigError, match="is gone; give it again"):
        resume_target(tmp_path / "old", None, [])
    (tmp_path / "old" / "launch.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read"):
        resume_target(tmp_path / "old", None, [])


def test_resume_keeps_the_runs_overrides_and_adds_new_ones(tmp_path):
    config = write_config(tmp_path / "c.yaml", launch_config(tmp_path / "r"))
    (tmp_path / "r").mkdir()
    write_record(tmp_path / "r", LaunchRecord(config=str(config), sets=["seed=3"]))
    record = resume_target(tmp_path / "r", None, ["trainer.args.training_steps=8"])
    assert record.config == str(config)
    assert record.sets == ["seed=3", "trainer.args.training_steps=8"]
    assert json.loads((tmp_path / "r" / "launch.json").read_text())["sets"] == ["seed=3"]


@pytest.mark.integration
def test_set_reaches_the_trainers_command(tmp_path, capsys):
    path = write_config(tmp_path / "c.yaml", launch_config(tmp_path / "r"))
    code = main([str(path), "--set", "trainer.args.lr=2e-5", "--set", "seed=11", "--dry-run"])
    out = capsys.readouterr().out
    trainer = next(line for line in out.splitlines() if line.startswith("trainer:")).split()
    assert code == 0
    assert trainer[trainer.index("--lr") + 1] == "2e-05"
    assert trainer[trainer.index("--seed") + 1] == "11"


@pytest.mark.integration
def test_an_environment_key_typo_stops_the_launch_before_anything_starts(tmp_path, capsys):
    """The env's own parser, run as a check: its one line, exit 2, no run directory."""
    config = launch_config(tmp_path / "r")
    config["environments"][0]["env"]["group_sise"] = 4
    code = main([str(write_config(tmp_path / "c.yaml", config)), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "environment arith_env:" in err
    assert "unknown key environments.0.env.group_sise" in err
    assert "did you mean environments.0.env.group_size?" in err
    assert "Traceback" not in err and not (tmp_path / "r").exists()


@pytest.mark.integration
def test_a_tokenizer_that_cannot_load_stops_the_launch_in_one_line(tmp_path, capsys):
    config = launch_config(tmp_path / "r")
    config["environments"][0]["env"]["tokenizer_name"] = str(tmp_path / "no-tokenizer")
    code = main([str(write_config(tmp_path / "c.yaml", config)), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "environment arith_env:" in err and "cannot load the tokenizer" in err
    assert str(tmp_path / "no-tokenizer") in err


def test_every_shipped_cpu_config_is_launched_from_its_file_by_an_e2e_test():
    """Such a launch runs the config's checks as a user's does (each environment's command
    included, which for two engines reads the engines' list the run directory holds),
    and then the run: a new config on the tiny model gets a launch, not only a check."""
    tiny = {
        path.name
        for path in (REPO / "configs").glob("*.yaml")
        if yaml.safe_load(path.read_text()).get("model") in TINY_MODEL_NAMES
    }
    assert tiny == set(LAUNCHED_AS_SHIPPED)


@pytest.mark.integration
def test_the_documented_environment_is_refused_naming_max_tokens_and_its_yaml_fits(
    tmp_path, capsys
):
    """docs/environments.md's 40-line task under the quickstart's config: its default
    max_tokens (512) cannot fit the engine's 128 tokens, and the run would wait forever
    on refused requests; the page's own YAML fits."""
    script = tmp_path / "capitals_env.py"
    script.write_text(documented_block("environments.md", SINGLE_TURN_SECTION, "python"))
    quickstart = shipped("quickstart_cpu.yaml")
    quickstart["environments"] = [{"script": str(script), "env": {"group_size": 8}}]
    quickstart["run_dir"] = str(tmp_path / "r")
    code = main([str(write_config(tmp_path / "q.yaml", quickstart)), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "environments.0.env.max_tokens 512 leaves no room for a prompt" in err
    assert "context of 128 tokens (trainer.args.seq_len)" in err
    assert not (tmp_path / "r").exists()

    documented = yaml.safe_load(documented_block("environments.md", SINGLE_TURN_SECTION, "yaml"))
    documented["environments"][0]["script"] = str(script)
    documented["run_dir"] = str(tmp_path / "r")
    code = main([str(write_config(tmp_path / "d.yaml", documented)), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0
    assert "checked: environment capitals_env, the model's context" in out


@pytest.mark.integration
@pytest.mark.parametrize("name", ["grpo_qwen05b_vllm.yaml", "grpo_qwen05b_cpu.yaml"])
def test_a_dry_run_of_a_hub_config_prints_the_plan_offline_and_names_what_it_skipped(
    name, tmp_path, capsys, monkeypatch
):
    """A hub model this machine does not hold: its flags are checked, the tokenizer and
    the model's context are skipped, and what this machine lacks is named, not refused
    (the GPU config's CUDA here; the CPU bridge to it needs nothing)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # whatever the machine's network
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # and whatever its cache holds
    config = shipped(name)
    config["run_dir"] = str(tmp_path / "r")
    code = main([str(write_config(tmp_path / "g.yaml", config)), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert [line.split(":", 1)[0] for line in lines[:3]] == ["api", "trainer", "gsm8k_server"]
    assert "checked: environment gsm8k_server" in lines
    model = "Qwen/Qwen2.5-0.5B-Instruct is not on this machine (a launch downloads it)"
    assert f"skipped: the model's context: {model}" in lines
    assert f"skipped: the tokenizers: {model}" in lines
    machine = [line for line in lines if line.startswith("not on this machine")]
    import torch  # what this machine has decides which needs are named

    lacks_cuda = "vllm" in name and not torch.cuda.is_available()
    assert any("trainer.args.device cuda" in line for line in machine) == lacks_cuda
    assert not (tmp_path / "r").exists()
