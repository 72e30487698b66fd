"""Config mistakes fail fast, before anything starts, with a message naming the problem."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from atroposlib.cli.launch import main
from atroposlib.launch.config import load_config
from atroposlib.launch.plan import plan
from tests.support.launch import ARITH_ENV, launch_config, role_key, write_config
from tests.support.source import REPO


def run_main(tmp_path, config, capsys) -> tuple[int, str]:
    path = write_config(tmp_path / "c.yaml", config)
    code = main([str(path), "--dry-run"])
    return code, capsys.readouterr().err


def test_unknown_top_level_key(tmp_path, capsys):
    code, err = run_main(tmp_path, {**launch_config(tmp_path / "r"), "enviroments": []}, capsys)
    assert code == 2 and "unknown key 'enviroments'" in err


@pytest.mark.integration
def test_unknown_trainer_flag(tmp_path, capsys):
    config = launch_config(tmp_path / "r")
    config["trainer"]["args"]["learning_rate"] = 0.1
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and "unknown key 'trainer.args.learning_rate'" in err


@pytest.mark.integration
@pytest.mark.parametrize(
    ("key", "instead"), [("save_path", "set run_dir"), ("atropos_url", "api.port")]
)
def test_a_key_the_launcher_owns_is_refused_saying_what_to_set(tmp_path, capsys, key, instead):
    """It was dropped without a word: a run wrote its checkpoints elsewhere than asked."""
    config = launch_config(tmp_path / "r")
    config["trainer"]["args"][key] = "somewhere"
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and f"trainer.args.{key}: the launcher" in err and instead in err


@pytest.mark.integration
def test_bad_trainer_value(tmp_path, capsys):
    config = launch_config(tmp_path / "r")
    config["trainer"]["args"]["batch_size"] = 0
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and "batch_size" in err


@pytest.mark.integration
def test_missing_script(tmp_path, capsys):
    config = launch_config(tmp_path / "r", environments=[{"script": "nowhere/env.py"}])
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and "environment script not found: nowhere/env.py" in err


@pytest.mark.integration
def test_port_in_use(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = launch_config(tmp_path / "r", api={"port": port})
        code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and f"port {port} (api) is already in use" in err


def test_missing_file_and_bad_yaml(tmp_path, capsys):
    assert main([str(tmp_path / "absent.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    assert main([str(tmp_path / "bad.yaml")]) == 2
    assert "not valid YAML" in capsys.readouterr().err


def test_each_config_mistake_the_review_found_is_one_line_and_exit_2(tmp_path, capsys):
    """LCH-1: these gave tracebacks and exit 1, or started 100k processes."""
    (tmp_path / "latin1.yaml").write_bytes("model: caf\xe9\n".encode("latin-1"))
    assert main([str(tmp_path / "latin1.yaml"), "--dry-run"]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err
    code, err = run_main(tmp_path, launch_config(tmp_path / "r", api={"port": 99999}), capsys)
    assert code == 2 and "api.port" in err and "65535" in err
    many = launch_config(tmp_path / "r", environments=[{"script": str(ARITH_ENV), "copies": 10**5}])
    code, err = run_main(tmp_path, many, capsys)
    assert code == 2 and "copies" in err and "256" in err
    (tmp_path / "a-file").write_text("not a directory")
    code, err = run_main(tmp_path, launch_config(tmp_path / "a-file"), capsys)
    assert code == 2 and "is a file; pick another run_dir" in err
    assert "Traceback" not in err


@pytest.mark.integration
def test_plan_shares_one_url_and_model_with_every_process(tmp_path):
    config = launch_config(tmp_path / "run")
    config["environments"][0]["copies"] = 2
    resolved = plan(load_config(write_config(tmp_path / "c.yaml", config)), tmp_path / "c.yaml")
    trainer = resolved.trainer.command
    engine_url = f"http://127.0.0.1:{trainer[trainer.index('--vllm-port') + 1]}"
    assert trainer[trainer.index("--atropos-url") + 1] == resolved.api_url
    assert [e.name for e in resolved.environments] == ["arith_env-1", "arith_env-2"]
    for env in resolved.environments:
        command = env.command
        assert command[command.index("--openai.base_url") + 1] == f"{engine_url}/v1"
        assert command[command.index("--env.rollout_server_url") + 1] == resolved.api_url
        assert command[command.index("--env.tokenizer_name") + 1] == resolved.model
        assert env.env["ATROPOS_ENV_STATE_DIR"].startswith(str(tmp_path / "run"))
    assert trainer[trainer.index("--model-name") + 1] == resolved.model


@pytest.mark.integration
def test_exit_code_from_the_command_line(tmp_path):
    path = write_config(tmp_path / "c.yaml", {"model": "tiny"})
    done = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.launch", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert "environments: Field required" in done.stderr


@pytest.mark.parametrize("shipped", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(shipped):
    config = load_config(shipped)
    assert config.environments


def test_an_existing_run_directory_is_not_reused(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text("{}\n")
    code, err = run_main(tmp_path, launch_config(tmp_path / "r"), capsys)
    assert code == 2 and "already holds a run" in err


@pytest.mark.integration
def test_limits_agree_by_default_the_token_limit_reaches_every_process(tmp_path):
    config = launch_config(tmp_path / "run")
    config["engine"] = {"engine": "transformers"}
    resolved = plan(load_config(write_config(tmp_path / "c.yaml", config)), tmp_path / "c.yaml")
    seq_len = str(config["trainer"]["args"]["seq_len"])
    trainer, engine = resolved.trainer.command, resolved.engine.command
    assert trainer[trainer.index("--seq-len") + 1] == seq_len
    assert engine[engine.index("--max-model-len") + 1] == seq_len
    assert resolved.engine.fresh_seed and "--seed" not in engine  # one per start (RNG-1)
    for env in resolved.environments:
        assert env.command[env.command.index("--env.max_token_length") + 1] == seq_len


@pytest.mark.integration
@pytest.mark.parametrize("correcting", [True, False])
def test_a_corrected_runs_engine_reports_processed_logprobs(tmp_path, correcting):
    """IS-1: an engine the launcher starts for a run whose trainer corrects must report
    the logprobs of the distribution it drew from, as the trainer's own engines do."""
    config = launch_config(tmp_path / "run")
    config["engine"] = {"engine": "transformers"}
    config["trainer"]["args"]["vllm_importance_sampling_correction"] = correcting
    resolved = plan(load_config(write_config(tmp_path / "c.yaml", config)), tmp_path / "c.yaml")
    engine = resolved.engine.command
    assert ("--logprobs-mode" in engine) == correcting
    if correcting:
        assert engine[engine.index("--logprobs-mode") + 1] == "processed_logprobs"


@pytest.mark.integration
def test_an_environment_limit_over_the_trainers_is_named(tmp_path, capsys):
    config = launch_config(tmp_path / "r")
    config["environments"].append({"script": str(ARITH_ENV), "env": {"max_token_length": 4096}})
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2
    assert "environments[1] (arith_env): env.max_token_length 4096 is over" in err
    assert "seq_len 128" in err


@pytest.mark.integration
def test_a_shorter_environment_limit_is_allowed(tmp_path):
    config = launch_config(tmp_path / "r")
    config["environments"][0]["env"]["max_token_length"] = 64
    resolved = plan(load_config(write_config(tmp_path / "c.yaml", config)), tmp_path / "c.yaml")
    env = resolved.environments[0].command
    assert env[env.index("--env.max_token_length") + 1] == "64"


@pytest.mark.integration
def test_an_engine_shorter_than_the_trainer_is_named(tmp_path, capsys):
    config = launch_config(tmp_path / "r")
    config["engine"] = {"engine": "transformers", "max_model_len": 64}
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and "engine.max_model_len 64 is under the trainer's seq_len 128" in err


@pytest.mark.integration
def test_a_trainer_without_a_declared_config_must_be_given_its_run_length(tmp_path, capsys):
    config = launch_config(tmp_path / "r")
    config["trainer"] = {"module": "tests.support.minimal_trainer", "args": {"seq_len": 128}}
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and "trainer.args.training_steps is required" in err


@pytest.mark.integration
def test_an_unknown_trainer_module_is_named(tmp_path, capsys):
    config = launch_config(tmp_path / "r")
    config["trainer"]["module"] = "no_such_trainer.main"
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and "trainer module not found: no_such_trainer.main" in err


def _plan(tmp_path, config):
    path = write_config(tmp_path / "c.yaml", config)
    return plan(load_config(path), path)


@pytest.mark.integration
def test_every_child_gets_the_runs_fresh_key_in_its_environment_never_in_argv(tmp_path):
    """KEY-1, API-4: a launched run's API and engine had no key, so any local process or
    web page could take a batch or wipe the run."""
    config = launch_config(tmp_path / "run")
    config["engine"] = {"engine": "transformers"}
    first = _plan(tmp_path, config)
    config["run_dir"] = str(tmp_path / "run2")
    second = _plan(tmp_path, config)
    key = first.key
    assert key and len(key) >= 32 and key != second.key
    everyone = [first.api, first.trainer, first.engine, *first.environments]
    assert all(key not in " ".join(p.command) for p in everyone)
    # keys by role (issue 46): the run's key opens everything and stays with run-api and
    # the trainer; an environment holds run-api's environment key and the engine key
    env_key, engine_key = role_key(key, "env"), role_key(key, "engine")
    assert len({key, env_key, engine_key}) == 3
    assert first.api.env == {"ATROPOS_API_KEY": key, "ATROPOS_ENV_API_KEY": env_key}
    assert first.trainer.env["ATROPOS_API_KEY"] == key
    assert first.trainer.env["ATROPOS_ENGINE_API_KEY"] == engine_key
    assert first.engine.env == {"ATROPOS_ENGINE_API_KEY": engine_key, "VLLM_API_KEY": engine_key}
    (env,) = first.environments
    assert env.env["ATROPOS_API_KEY"] == env_key and key not in env.env.values()
    assert env.env["ATROPOS_ENGINE_API_KEY"] == engine_key
    # the engine key goes to the run's engine only (PRX-1 of the security review)
    assert env.env["ATROPOS_ENGINE_URLS"] == first.engine_url


@pytest.mark.integration
def test_keys_from_the_yaml_move_to_the_environment_and_none_turns_keys_off(tmp_path):
    config = launch_config(tmp_path / "run")
    config["api"]["args"]["api_key"] = "yaml-api-secret"
    config["environments"].append(
        {
            "script": str(ARITH_ENV),
            "name": "remote",
            "openai": {"base_url": "http://127.0.0.1:1/v1", "api_key": "yaml-engine-secret"},
        }
    )
    config["environments"].append(
        {"script": str(ARITH_ENV), "name": "elsewhere", "openai": {"base_url": "http://x/v1"}}
    )
    resolved = _plan(tmp_path, config)
    assert resolved.key == "yaml-api-secret"
    commands = " ".join(" ".join(p.command) for p in [resolved.api, *resolved.environments])
    assert "yaml-api-secret" not in commands and "yaml-engine-secret" not in commands
    own, remote, elsewhere = resolved.environments
    assert own.env["ATROPOS_ENGINE_API_KEY"] == role_key("yaml-api-secret", "engine")
    assert own.env["ATROPOS_ENGINE_URLS"] == resolved.engine_url
    assert remote.env["ATROPOS_ENGINE_API_KEY"] == "yaml-engine-secret"
    assert remote.env["ATROPOS_ENGINE_URLS"] == "http://127.0.0.1:1/v1"
    assert "ATROPOS_ENGINE_API_KEY" not in elsewhere.env  # the run's key stays home
    config = launch_config(tmp_path / "run3", keys="none")
    resolved = _plan(tmp_path, config)
    assert resolved.key is None and "ATROPOS_API_KEY" not in resolved.api.env


def test_secrets_in_the_yaml_are_redacted_from_what_the_run_keeps():
    from atroposlib.launch.config import REDACTED, redacted_text

    text = (
        "model: tiny\napi:\n  args:\n    api_key: s3cret\nenvironments:\n- openai:\n"
        "    api_key: other\n    model_name: m\n"
    )
    clean = redacted_text(text)
    assert "s3cret" not in clean and "other" not in clean and clean.count(REDACTED) == 2
    assert "model_name: m" in clean
    plain = "# a comment stays\nmodel: tiny\n"
    assert redacted_text(plain) == plain


@pytest.mark.integration
@pytest.mark.parametrize(
    "where, args",
    [
        ("engine", ["--host", "0.0.0.0"]),
        ("engine", ["--host=192.168.1.5"]),
        ("engine", ["--api-key", "visible-in-proc"]),
        ("trainer", "--host 0.0.0.0 --enforce-eager"),
    ],
)
def test_an_engine_flag_that_opens_it_or_shows_a_key_is_refused(where, args, tmp_path, capsys):
    """ENG-1: engine_args --host 0.0.0.0 silently overrode the loopback bind."""
    config = launch_config(tmp_path / "run")
    if where == "engine":
        config["engine"] = {"engine": "transformers", "args": args}
    else:
        config["trainer"]["args"]["engine_args"] = args
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "must bind loopback" in err or "readable by every local user" in err


@pytest.mark.integration
def test_several_engines_reach_every_environment_as_one_openai_list(tmp_path, capsys):
    """trainer.args.num_engines: consecutive free ports from --vllm-port, and every
    environment gets all of them (engines.yaml, an `openai:` list) instead of one URL."""
    import yaml

    config = launch_config(tmp_path / "run")
    config["trainer"]["args"]["num_engines"] = 3
    resolved = _plan(tmp_path, config)
    trainer = resolved.trainer.command
    first = int(trainer[trainer.index("--vllm-port") + 1])
    assert trainer[trainer.index("--num-engines") + 1] == "3"
    servers = yaml.safe_load(resolved.files["engines.yaml"])["openai"]
    assert servers == [{"base_url": f"http://127.0.0.1:{first + i}/v1"} for i in range(3)]
    (env,) = resolved.environments
    assert "--openai.base_url" not in env.command
    assert env.command[env.command.index("--config") + 1] == str(tmp_path / "run" / "engines.yaml")
    assert env.command[env.command.index("--openai.model_name") + 1] == "tiny"
    # one engine: no file, the URL as a flag, and no --num-engines for a trainer to refuse
    del config["trainer"]["args"]["num_engines"]
    config["run_dir"] = str(tmp_path / "run1")
    single = _plan(tmp_path, config)
    assert single.files == {} and "--num-engines" not in single.trainer.command
    # the launcher's own engine is one engine the trainer does not sync
    config["trainer"]["args"]["num_engines"] = 2
    config["engine"] = {"engine": "transformers"}
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and "num_engines" in err and "engine:" in err


LOSS_AND_OFF_POLICY_ARGS = {
    "loss_type": "cispo",
    "importance_sampling_level": "sequence",
    "advantage_estimator": "rloo",
    "entropy_coef": 0.01,
    "kl_coef": 0.05,
    "kl_reference": "model",
    "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "token_truncate",
    "vllm_importance_sampling_clip_max": 2.0,
    "max_staleness": 1,
}


@pytest.mark.integration
def test_every_loss_and_off_policy_flag_reaches_the_trainer_from_the_yaml(tmp_path):
    import argparse

    from atroposlib.utils.flags import add_model_flags, parse_settings
    from example_trainer.config import TrainingConfig

    config = launch_config(tmp_path / "run")
    config["trainer"]["args"].update(LOSS_AND_OFF_POLICY_ARGS)
    resolved = plan(load_config(write_config(tmp_path / "c.yaml", config)), tmp_path / "c.yaml")
    command = resolved.trainer.command
    parser = argparse.ArgumentParser()
    add_model_flags(parser, TrainingConfig)
    start = command.index("--model-name")
    parsed, _ = parse_settings(parser, TrainingConfig, command[start:])
    for key, value in LOSS_AND_OFF_POLICY_ARGS.items():
        assert parsed.flat(key) == value, key
    assert parsed.loss.ratio_reference == "trainer", "IS correction takes the trainer's ratio"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"loss_type": "cispo", "clip_eps_high": 0.28}, "cap of at least 1"),
        ({"loss_type": "sapo"}, "no loss named 'sapo'; registered:"),
        ({"loss_import_path": "my_losses:sapo"}, "no module 'my_losses'"),
    ],
)
def test_a_loss_setting_that_is_wrong_is_refused_before_the_run(tmp_path, capsys, args, message):
    config = launch_config(tmp_path / "r")
    config["trainer"]["args"].update(args)
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and message in err


def test_the_default_trainers_flags_model_is_read_where_it_declares_it():
    """DEFAULT_TRAINER_FLAGS spares each launch the trainer's torch import: only while
    the model read there is the trainer's own."""
    import importlib

    from atroposlib.launch.config import DEFAULT_TRAINER, DEFAULT_TRAINER_FLAGS

    declared = importlib.import_module(DEFAULT_TRAINER).LAUNCH_CONFIG
    assert declared is importlib.import_module(DEFAULT_TRAINER_FLAGS).LAUNCH_CONFIG


def test_every_section_takes_args_as_a_mapping_and_raw_flags_beside_them():
    from atroposlib.launch.config import EnvironmentSection, StandaloneEngineSection

    engine = StandaloneEngineSection(
        args={"num_threads": 1, "enforce_eager": True, "prefix_caching": False},
        extra_flags=["--seed", "3"],
    )
    assert engine.flags == [
        *("--num-threads", "1", "--enforce-eager", "--no-prefix-caching", "--seed", "3")
    ]
    # the earlier form, a list under args, is read as raw flags
    earlier = EnvironmentSection(script="x.py", args=["--config", "c.yaml"])
    assert earlier.args == {} and earlier.flags == ["--config", "c.yaml"]


@pytest.mark.integration
def test_a_teacher_section_runs_an_engine_for_the_environments_that_ask_for_it(tmp_path, capsys):
    """Its engine serves the teacher's model beside the policy's; only an environment with
    teacher_enabled gets `--teacher.*` for it, and the engine key is pinned to it too."""
    config = launch_config(tmp_path / "r")
    config["teacher"] = {"model": "tiny", "served_model_name": "teach", "engine": "cpu"}
    config["environments"].append({"script": str(ARITH_ENV), "name": "plain"})
    config["environments"][0]["env"]["teacher_enabled"] = True
    path = write_config(tmp_path / "c.yaml", config)
    resolved = plan(load_config(path), path)
    teacher = resolved.teacher
    assert teacher is not None and teacher in resolved.processes
    port = teacher.command[teacher.command.index("--port") + 1]
    assert teacher.command[teacher.command.index("--served-model-name") + 1] == "teach"
    assert teacher.health_url == f"http://127.0.0.1:{port}/health"
    assert port != str(resolved.engine_url.rsplit(":", 1)[1])
    asking, plain = resolved.environments
    flags = asking.command
    assert flags[flags.index("--teacher.base_url") + 1] == f"http://127.0.0.1:{port}/v1"
    assert flags[flags.index("--teacher.model_name") + 1] == "teach"
    assert f"http://127.0.0.1:{port}" in asking.env["ATROPOS_ENGINE_URLS"].split(",")
    assert not any(flag.startswith("--teacher.") for flag in plain.command)
    config["teacher"]["max_model_len"] = 64
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and "teacher.max_model_len 64 is under the trainer's seq_len 128" in err
    config["teacher"] = {"model": "./no-such-teacher"}
    code, err = run_main(tmp_path, config, capsys)
    assert code == 2 and "no directory ./no-such-teacher" in err


def test_a_flag_value_that_starts_with_a_dash_is_joined_to_its_flag():
    """argparse reads `--engine-args --enforce-eager` as two flags (the trainer exited
    with 'expected one argument'); joined, it is one flag and its value."""
    import argparse

    from atroposlib.launch.resolving import flags

    rendered = flags({"engine_args": "--enforce-eager", "lr": -1.5, "steps": 3, "on": True})
    assert rendered == [
        "--engine-args=--enforce-eager",
        "--lr=-1.5",
        "--steps",
        "3",
        "--on",
        "true",
    ]
    # a null (`--set environments.0.env.reward=null`) leaves the flag out: never "None"
    assert flags({"reward": None, "steps": 3}, "--env.", dashes=False) == ["--env.steps", "3"]
    parser = argparse.ArgumentParser()
    for name in ("--engine-args", "--lr", "--steps", "--on"):
        parser.add_argument(name)
    parsed = parser.parse_args(rendered)
    assert parsed.engine_args == "--enforce-eager" and parsed.lr == "-1.5"
