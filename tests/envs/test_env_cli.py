"""Config resolution of the env command line (defaults < YAML < CLI), without servers."""

from __future__ import annotations

import pytest
import yaml

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ServerBaseline
from atroposlib.envs.cli import (
    ConfigError,
    ResolvedConfig,
    build_parser,
    resolve_config,
    run_cli,
    save_evaluate_config,
)


class MyConfig(BaseEnvConfig):
    difficulty: int = 3


class BaselineEnv(BaseEnv):
    name = "baseline_env"
    env_config_cls = MyConfig

    @classmethod
    def config_init(cls):
        return MyConfig(group_size=8, tokenizer_name="tok"), ServerBaseline(
            model_name="m", timeout=9
        )

    async def get_next_item(self):
        return None

    async def evaluate(self, *args, **kwargs):
        return None


def resolve(command: str, *argv: str):
    env_defaults, servers = BaselineEnv.config_init()
    args = build_parser(BaselineEnv, env_defaults, servers).parse_args([command, *argv])
    return resolve_config(BaselineEnv, command, args)


def test_defaults_then_yaml_then_cli(tmp_path):
    assert resolve("serve").env.group_size == 8
    config = tmp_path / "run.yaml"
    config.write_text("env:\n  group_size: 16\n  difficulty: 5\n  total_steps: 7\n")
    from_yaml = resolve("serve", "--config", str(config))
    assert (from_yaml.env.group_size, from_yaml.env.difficulty, from_yaml.env.total_steps) == (
        16,
        5,
        7,
    )
    both = resolve(
        "serve", "--config", str(config), "--env.group_size", "2", "--env.use_wandb", "FALSE"
    )
    assert (both.env.group_size, both.env.difficulty, both.env.use_wandb) == (2, 5, False)
    assert isinstance(both.env, MyConfig)


def test_serve_names_the_run_and_process_has_its_defaults():
    assert resolve("serve").env.wandb_name == "baseline_env"
    processed = resolve("process")
    assert processed.env.include_messages is True
    assert processed.env.ensure_scores_are_not_same is False
    assert processed.env.data_path_to_save_groups == "data/baseline_env.jsonl"
    explicit = resolve("process", "--env.include_messages", "false")
    assert explicit.env.include_messages is False


def test_evaluate_saves_to_a_folder_of_its_own_by_default(tmp_path, monkeypatch):
    """As `process` writes groups by default; an earlier evaluation's folder is kept."""
    monkeypatch.chdir(tmp_path)
    assert resolve("evaluate").env.data_dir_to_save_evals == "evals/baseline_env"
    (tmp_path / "evals" / "baseline_env").mkdir(parents=True)
    assert resolve("evaluate").env.data_dir_to_save_evals == "evals/baseline_env_1"
    given = resolve("evaluate", "--env.data_dir_to_save_evals", "mine")
    assert given.env.data_dir_to_save_evals == "mine"
    assert resolve("serve").env.data_dir_to_save_evals is None


def test_a_tokenizer_that_cannot_load_is_one_line_not_a_traceback(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        run_cli(BaselineEnv, ["process", "--env.tokenizer_name", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err
    assert "cannot load the tokenizer" in err and "--env.tokenizer_name" in err


def test_openai_flags_promote_the_baseline():
    untouched = resolve("serve").servers
    assert type(untouched) is ServerBaseline
    promoted = resolve(
        "serve", "--openai.base_url", "http://h:1/v1", "--openai.api_key", "k"
    ).servers
    assert isinstance(promoted, APIServerConfig)
    assert (promoted.base_url, promoted.api_key, promoted.model_name, promoted.timeout) == (
        "http://h:1/v1",
        "k",
        "m",
        9,
    )


def test_yaml_list_means_several_servers(tmp_path):
    config = tmp_path / "servers.yaml"
    config.write_text(
        "openai:\n  - {base_url: 'http://a:1/v1', model_name: x}\n"
        "  - {base_url: 'http://b:2/v1', model_name: x}\nslurm: false\ntesting: true\n"
    )
    resolved = resolve("serve", "--config", str(config), "--openai.timeout", "5")
    assert [s.base_url for s in resolved.servers] == ["http://a:1/v1", "http://b:2/v1"]
    assert all(s.timeout == 5 for s in resolved.servers)
    assert resolved.testing is True and resolved.slurm is False
    # what an entry leaves out comes from config_init's server, as for a single server
    config.write_text("openai:\n  - {base_url: 'http://a:1/v1'}\n  - {base_url: 'http://b:2/v1'}\n")
    bare = resolve("serve", "--config", str(config))
    assert [(s.model_name, s.timeout) for s in bare.servers] == [("m", 9), ("m", 9)]


def test_bad_input_names_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(BaselineEnv, ["serve", "--env.grup_size", "3"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--env.grup_size" in error and "--env.group_size" in error
    with pytest.raises(ConfigError, match="--env.group_size"):
        resolve("serve", "--env.group_size", "many")
    with pytest.raises(ConfigError, match="no such file"):
        resolve("serve", "--config", str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("envs: {}\n")
    with pytest.raises(ConfigError, match="envs"):
        resolve("serve", "--config", str(bad))


def test_help_lists_every_field_with_description_and_default():
    env_defaults, servers = BaselineEnv.config_init()
    parser = build_parser(BaselineEnv, env_defaults, servers)
    serve = parser._subparsers._group_actions[0].choices["serve"]
    text = serve.format_help()
    for field in MyConfig.model_fields:
        assert f"--env.{field}" in text
    for field in APIServerConfig.model_fields:
        assert f"--openai.{field}" in text
    assert "Rollouts per item" in text and "(default: 8)" in text


def test_extra_server_namespaces_exist_only_where_declared(tmp_path):
    from atroposlib.envs.cli import ServerNamespace

    class TwoServerEnv(BaselineEnv):
        @classmethod
        def cli_server_namespaces(cls):
            return {"judge": ServerNamespace(init_kwarg="judge_configs")}

    config = tmp_path / "judge.yaml"
    config.write_text("judge:\n  base_url: http://j:1/v1\n")
    with pytest.raises(ConfigError, match="judge"):
        resolve("serve", "--config", str(config))
    with pytest.raises(SystemExit):
        run_cli(BaselineEnv, ["serve", "--judge.base_url", "http://j:1/v1"])
    env_defaults, servers = TwoServerEnv.config_init()
    args = build_parser(TwoServerEnv, env_defaults, servers).parse_args(
        ["serve", "--config", str(config), "--judge.model_name", "jm"]
    )
    judge = resolve_config(TwoServerEnv, "serve", args).extra_servers["judge_configs"]
    assert (judge.base_url, judge.model_name) == ("http://j:1/v1", "jm")
    assert (
        resolve_config(
            TwoServerEnv,
            "serve",
            build_parser(TwoServerEnv, env_defaults, servers).parse_args(["serve"]),
        ).extra_servers
        == {}
    )

    class Clashing(BaselineEnv):
        @classmethod
        def cli_server_namespaces(cls):
            return {"openai": ServerNamespace(init_kwarg="other")}

    with pytest.raises(ValueError, match="reserved"):
        build_parser(Clashing, env_defaults, servers)


def test_evaluate_saves_its_config_beside_the_results_without_the_key(tmp_path):
    evals = tmp_path / "evals"
    resolved = ResolvedConfig(
        env=BaseEnvConfig(data_dir_to_save_evals=str(evals), group_size=3),
        servers=[
            APIServerConfig(base_url="http://a/v1", api_key="sk-secret", model_name="m"),
            APIServerConfig(base_url="http://b/v1", model_name="m"),
        ],
        testing=True,
    )
    save_evaluate_config(resolved)
    saved = yaml.safe_load((evals / "evaluate_config.yaml").read_text())
    assert saved["env"]["group_size"] == 3 and saved["testing"] is True
    assert [s["base_url"] for s in saved["openai"]] == ["http://a/v1", "http://b/v1"]
    assert saved["openai"][0]["api_key"] == "<redacted>" and saved["openai"][1]["api_key"] == ""
    assert "sk-secret" not in (evals / "evaluate_config.yaml").read_text()


class FailingEvaluationEnv(BaselineEnv):
    """`evaluate` fails with `error`; no tokenizer to load, no server asked."""

    name = "refused_env"
    error: Exception = RuntimeError()

    @staticmethod
    def _load_tokenizer(name):
        return None

    async def evaluate(self, *args, **kwargs):
        raise type(self).error


REFUSAL = "max_tokens 1024 + prompt 342 tokens exceeds the maximum context length 512"


def evaluate_failing(error: Exception, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("atroposlib.envs.cli.configure_logging", lambda *args: None)
    monkeypatch.setattr(FailingEvaluationEnv, "error", error)
    run_cli(FailingEvaluationEnv, ["evaluate", "--env.data_dir_to_save_evals", str(tmp_path)])


def test_evaluate_refused_for_the_context_ends_on_one_line(tmp_path, monkeypatch, capsys):
    try:
        raise RuntimeError("the judge did not answer") from RuntimeError(REFUSAL)
    except RuntimeError as wrapped:
        refused = wrapped
    with pytest.raises(SystemExit) as exit_info:
        evaluate_failing(refused, tmp_path, monkeypatch)
    assert exit_info.value.code == 1
    env_defaults, servers = FailingEvaluationEnv.config_init()
    prog = build_parser(FailingEvaluationEnv, env_defaults, servers).prog
    error = capsys.readouterr().err
    assert error.splitlines() == [
        f"{prog} evaluate: refused_env: a prompt of 342 tokens plus max_tokens 1024 does not "
        "fit the model's context of 512 tokens; use a model with a longer context"
    ]


def test_evaluate_failing_otherwise_keeps_its_traceback(tmp_path, monkeypatch):
    with pytest.raises(KeyError, match="answer"):
        evaluate_failing(KeyError("answer"), tmp_path, monkeypatch)
