"""`TeacherDistillationEnv`: its config, the `--teacher.*` / `teacher:` CLI namespace, the
same-tokenizer check, and groups enriched with a real teacher's prompt logprobs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from atroposlib.envs.cli import ConfigError, build_parser, resolve_config, run_cli
from atroposlib.envs.server_handling.server_baseline import APIServerConfig, ServerBaseline
from atroposlib.envs.teacher_distillation_env import (
    TeacherDistillationConfig,
    TeacherDistillationEnv,
)


class DistillEnv(TeacherDistillationEnv):
    """No teacher by default: it comes from flags or YAML."""

    name = "distill_env"
    seen: list = []

    @classmethod
    def config_init(cls):
        return TeacherDistillationConfig(tokenizer_name="tok", teacher_top_k=3), ServerBaseline()

    async def get_next_item(self):
        return None

    async def evaluate(self, *args, **kwargs):
        type(self).seen.append(self)


class DefaultTeacherEnv(DistillEnv):
    """A teacher in teacher_config_init, as upstream's gsm8k_server_teacher_distill has."""

    @classmethod
    def teacher_config_init(cls):
        return APIServerConfig(
            base_url="http://localhost:9003/v1",
            model_name="teacher-model",
            server_type="vllm",
            tokenizer_name="teacher-tok",
            timeout=1200,
        )


def resolve(env_cls, command: str, *argv: str):
    env_defaults, servers = env_cls.config_init()
    args = build_parser(env_cls, env_defaults, servers).parse_args([command, *argv])
    return resolve_config(env_cls, command, args)


def test_config_fields_defaults_and_validation():
    config = TeacherDistillationConfig()
    assert (config.teacher_enabled, config.teacher_top_k) == (False, 0)
    assert TeacherDistillationConfig(teacher_top_k=-1).teacher_top_k == -1
    with pytest.raises(ValidationError, match="teacher_top_k"):
        TeacherDistillationConfig(teacher_top_k=-2)
    assert TeacherDistillationEnv.env_config_cls is TeacherDistillationConfig
    assert TeacherDistillationEnv.teacher_namespace == "teacher"
    assert TeacherDistillationEnv.teacher_config_init() is None


def test_no_teacher_unless_configured():
    resolved = resolve(DistillEnv, "serve")
    assert resolved.extra_servers == {}
    assert resolved.env.teacher_top_k == 3


def test_teacher_flags_make_a_teacher_server():
    resolved = resolve(
        DistillEnv,
        "serve",
        "--teacher.base_url",
        "http://t:9/v1",
        "--teacher.model_name",
        "big",
        "--teacher.server_type",
        "vllm",
        "--env.teacher_enabled",
        "--env.teacher_top_k",
        "5",
    )
    teacher = resolved.extra_servers["teacher_server_configs"]
    assert isinstance(teacher, APIServerConfig)
    assert (teacher.base_url, teacher.model_name, teacher.server_type) == (
        "http://t:9/v1",
        "big",
        "vllm",
    )
    assert resolved.env.teacher_enabled is True and resolved.env.teacher_top_k == 5
    assert type(resolved.servers) is ServerBaseline  # the policy's servers are untouched


def test_teacher_yaml_then_flags_over_the_envs_default(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "env:\n  teacher_enabled: true\n"
        "teacher:\n  base_url: http://yaml:1/v1\n  api_key: k\n"
        "openai:\n  base_url: http://student:2/v1\n"
    )
    resolved = resolve(DefaultTeacherEnv, "process", "--config", str(config))
    teacher = resolved.extra_servers["teacher_server_configs"]
    assert (teacher.base_url, teacher.api_key, teacher.model_name, teacher.tokenizer_name) == (
        "http://yaml:1/v1",
        "k",
        "teacher-model",
        "teacher-tok",
    )
    assert resolved.servers.base_url == "http://student:2/v1"
    overridden = resolve(
        DefaultTeacherEnv, "serve", "--config", str(config), "--teacher.base_url", "http://cli/v1"
    )
    teacher = overridden.extra_servers["teacher_server_configs"]
    assert (teacher.base_url, teacher.api_key) == ("http://cli/v1", "k")
    untouched = resolve(DefaultTeacherEnv, "evaluate").extra_servers["teacher_server_configs"]
    assert untouched == DefaultTeacherEnv.teacher_config_init()


def test_teacher_yaml_list_means_several_teachers(tmp_path):
    config = tmp_path / "teachers.yaml"
    config.write_text(
        "teacher:\n  - {base_url: 'http://a:1/v1', model_name: t}\n"
        "  - {base_url: 'http://b:2/v1', model_name: t}\n"
    )
    resolved = resolve(DistillEnv, "serve", "--config", str(config), "--teacher.timeout", "7")
    teachers = resolved.extra_servers["teacher_server_configs"]
    assert [(t.base_url, t.timeout) for t in teachers] == [
        ("http://a:1/v1", 7),
        ("http://b:2/v1", 7),
    ]


def test_upstreams_resolver_classmethod_reads_the_teacher_namespace():
    assert (
        DistillEnv._resolve_teacher_server_configs(
            default_teacher_server_configs=None, yaml_config={}, cli_passed_flags={}
        )
        is None
    )
    resolved = DefaultTeacherEnv._resolve_teacher_server_configs(
        default_teacher_server_configs=DefaultTeacherEnv.teacher_config_init(),
        yaml_config={"teacher": {"tokenizer_name": "yaml-tok"}, "openai": {"model_name": "no"}},
        cli_passed_flags={"teacher.base_url": "http://override/v1", "openai.timeout": "1"},
    )
    assert (resolved.base_url, resolved.tokenizer_name, resolved.model_name) == (
        "http://override/v1",
        "yaml-tok",
        "teacher-model",
    )
    assert resolved.timeout == 1200


def test_teacher_flags_in_help_and_bad_values_named(tmp_path):
    env_defaults, servers = DistillEnv.config_init()
    parser = build_parser(DistillEnv, env_defaults, servers)
    text = parser._subparsers._group_actions[0].choices["serve"].format_help()
    for field in APIServerConfig.model_fields:
        assert f"--teacher.{field}" in text
    assert "--env.teacher_top_k" in text
    with pytest.raises(ConfigError, match="--teacher.timeout"):
        resolve(DistillEnv, "serve", "--teacher.timeout", "soon")
    bad = tmp_path / "bad.yaml"
    bad.write_text("teachers: {}\n")
    with pytest.raises(ConfigError, match="teachers"):
        resolve(DistillEnv, "serve", "--config", str(bad))


def test_run_cli_hands_the_teacher_to_the_env(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `evaluate` saves to ./evals/<env> by default
    DistillEnv.seen.clear()
    run_cli(
        DistillEnv,
        [
            "evaluate",
            "--env.tokenizer_name",
            str(tiny_model_path),
            "--env.teacher_enabled",
            "true",
            "--teacher.base_url",
            "http://127.0.0.1:9/v1",
            "--teacher.tokenizer_name",
            str(tiny_model_path),
            "--teacher.server_type",
            "vllm",
        ],
    )
    (env,) = DistillEnv.seen
    assert env.teacher_server is not None
    (teacher,) = env.teacher_server.servers
    assert (teacher.config.base_url, teacher.config.server_type) == (
        "http://127.0.0.1:9/v1",
        "vllm",
    )


def test_enabled_teacher_without_servers_is_refused(tiny_model_path):
    config = TeacherDistillationConfig(tokenizer_name=str(tiny_model_path), teacher_enabled=True)
    with pytest.raises(ValueError, match="no teacher server configuration"):
        DistillEnv(config, ServerBaseline())
    disabled = DistillEnv(config.model_copy(update={"teacher_enabled": False}), ServerBaseline())
    assert disabled.teacher_server is None


def other_tokenizer(path):
    """A real tokenizer with a vocabulary unlike the tiny model's."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>"], show_progress=False)
    tokenizer.train_from_iterator(["the teacher speaks another language"] * 10, trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(path)
    return str(path)


def test_teacher_tokenizer_must_be_the_students(tiny_model_path, tmp_path):
    from transformers import AutoTokenizer

    config = TeacherDistillationConfig(tokenizer_name=str(tiny_model_path), teacher_enabled=True)

    def teacher(tokenizer_name: str) -> APIServerConfig:
        return APIServerConfig(
            base_url="http://127.0.0.1:9/v1", model_name="t", tokenizer_name=tokenizer_name
        )

    with pytest.raises(ValueError, match="Cross-tokenizer distillation is not supported"):
        DistillEnv(config, ServerBaseline(), teacher(other_tokenizer(tmp_path / "other")))
    with pytest.raises(ValueError, match="could not be loaded"):
        DistillEnv(config, ServerBaseline(), teacher(str(tmp_path / "missing")))
    copy = tmp_path / "same_vocab"
    AutoTokenizer.from_pretrained(str(tiny_model_path)).save_pretrained(copy)
    env = DistillEnv(config, ServerBaseline(), [teacher(str(copy))])
    assert env.teacher_server is not None
    # tokenizer_name 'none' falls back to model_name, as for any server
    fallback = APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name=str(tiny_model_path))
    assert DistillEnv(config, ServerBaseline(), fallback).teacher_server is not None


# -- end to end: the teacher is the real CPU inference server ----------------------------


def tiny_server(server, server_type: str = "vllm") -> APIServerConfig:
    return APIServerConfig(
        model_name=server.name,
        base_url=f"{server.url}/v1",
        api_key="x",
        server_type=server_type,
        timeout=120,
    )


def distill_env(tiny_model_path, inference_server, tmp_path, teacher_type="vllm", top_k=2):
    config = TeacherDistillationConfig(
        tokenizer_name=str(tiny_model_path),
        group_size=3,
        teacher_enabled=True,
        teacher_top_k=top_k,
        ensure_scores_are_not_same=False,
        data_path_to_save_groups=str(tmp_path / "groups.jsonl"),
    )
    teacher = tiny_server(inference_server, teacher_type).model_copy(
        update={"tokenizer_name": str(tiny_model_path)}
    )
    return DistillEnv(config, tiny_server(inference_server), teacher_server_configs=teacher)


async def sampled_group(env):
    messages = [{"role": "user", "content": "What is 3 + 4 mod 10?"}]
    return await env.sample_group(
        messages, lambda text: float(len(text) % 2), max_tokens=4, temperature=1.0
    )


def saved_groups(path):
    import json

    from atroposlib.protocol import ScoredData

    groups = [json.loads(line) for line in path.read_text().splitlines()]
    for group in groups:
        ScoredData.model_validate(group)  # what the trajectory API accepts (strict)
    return groups


def assert_teacher_logprobs(group, model, top_k: int) -> None:
    """Shape [sequence][position][k], and each entry is the model's own logprob."""
    import torch

    from tests.support.tolerances import SAME_LIBRARY_LOGPROB_REL, logprob_tolerance

    ids_all, lps_all = group["distill_token_ids"], group["distill_logprobs"]
    assert len(ids_all) == len(lps_all) == len(group["tokens"])
    for tokens, ids_per_pos, lps_per_pos in zip(group["tokens"], ids_all, lps_all, strict=True):
        assert len(ids_per_pos) == len(lps_per_pos) == len(tokens)
        assert ids_per_pos[0] == [] and lps_per_pos[0] == []  # the first token has no context
        with torch.no_grad():
            logits = model(torch.tensor([tokens])).logits[0].float()
        reference = torch.log_softmax(logits, dim=-1)
        tol = logprob_tolerance(logits, SAME_LIBRARY_LOGPROB_REL)
        for p in range(1, len(tokens)):
            ids, lps = ids_per_pos[p], lps_per_pos[p]
            assert len(ids) == len(lps) and len(set(ids)) == len(ids)
            assert top_k <= len(ids) <= top_k + 1  # the top k, plus the prompt token if not in it
            assert tokens[p] in ids
            for token, logprob in zip(ids, lps, strict=True):
                assert abs(logprob - reference[p - 1, token].item()) <= tol, (p, token)
            kth_best = reference[p - 1].topk(top_k).values[-1].item()
            assert all(
                lp >= kth_best - tol for t, lp in zip(ids, lps, strict=True) if t != tokens[p]
            )
            assert max(lps) == pytest.approx(reference[p - 1].max().item(), abs=tol)


async def test_groups_carry_the_teachers_prompt_logprobs(
    tiny_model_path, inference_server, tmp_path
):
    import copy

    from transformers import AutoModelForCausalLM

    env = distill_env(tiny_model_path, inference_server, tmp_path, top_k=2)
    group = await sampled_group(env)
    wider = copy.deepcopy(group)
    wider["group_overrides"] = {"teacher_top_k": 4}
    skipped = copy.deepcopy(group)
    skipped["group_overrides"] = {"skip_teacher_top_k": True}
    await env.handle_send_to_api([group, wider, skipped], do_send_to_api=False)

    default_saved, wider_saved, skipped_saved = saved_groups(tmp_path / "groups.jsonl")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path)).eval()
    assert_teacher_logprobs(default_saved, model, top_k=2)
    assert_teacher_logprobs(wider_saved, model, top_k=4)
    assert skipped_saved["distill_token_ids"] is None and skipped_saved["distill_logprobs"] is None
    assert env.stats["groups_sent"] == 3


async def test_top_k_zero_keeps_the_sampled_token_and_minus_one_fetches_nothing(
    tiny_model_path, inference_server, tmp_path
):
    from transformers import AutoModelForCausalLM

    env = distill_env(tiny_model_path, inference_server, tmp_path, top_k=0)
    group = await sampled_group(env)
    await env.handle_send_to_api(group, do_send_to_api=False)
    (saved,) = saved_groups(tmp_path / "groups.jsonl")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path)).eval()
    assert_teacher_logprobs(saved, model, top_k=1)  # upstream's client asks for at least 1

    off = distill_env(tiny_model_path, inference_server, tmp_path / "off", top_k=-1)
    teacher = off.teacher_server.servers[0]
    await off.handle_send_to_api(await sampled_group(off), do_send_to_api=False)
    (saved,) = saved_groups(tmp_path / "off" / "groups.jsonl")
    assert saved["distill_token_ids"] is None and saved["distill_logprobs"] is None
    assert teacher.requests_made == 0


async def test_a_teacher_without_prompt_logprobs_leaves_the_group_undistilled(
    tiny_model_path, inference_server, tmp_path
):
    env = distill_env(tiny_model_path, inference_server, tmp_path, teacher_type="openai")
    await env.handle_send_to_api(await sampled_group(env), do_send_to_api=False)
    (saved,) = saved_groups(tmp_path / "groups.jsonl")
    assert saved["distill_token_ids"] is None and saved["distill_logprobs"] is None
    assert len(saved["tokens"]) == 3  # the group itself is still sent


# -- process and evaluate with a teacher, and what the trainer makes of the result --------


def distill_cli(command: str, server, tiny_model_path, tmp_path, *extra: str) -> list[str]:
    """`mod_arithmetic_distill.py COMMAND` flags: the served tiny model as the student's
    engine and as the teacher (the question is the plumbing)."""
    return [
        command,
        "--env.tokenizer_name",
        str(tiny_model_path),
        "--env.total_steps",
        "2",
        "--env.group_size",
        "4",
        "--env.eval_size",
        "4",
        "--env.teacher_enabled",
        "true",
        "--env.teacher_top_k",
        "3",
        "--openai.base_url",
        f"{server.url}/v1",
        "--openai.model_name",
        server.name,
        "--teacher.base_url",
        f"{server.url}/v1",
        "--teacher.model_name",
        server.name,
        "--teacher.server_type",
        "vllm",
        "--teacher.tokenizer_name",
        str(tiny_model_path),
        *extra,
    ]


def test_process_and_evaluate_run_with_a_teacher_and_the_trainer_learns_from_it(
    tiny_model_path, inference_server, tmp_path, monkeypatch
):
    """Upstream's `process` and `evaluate` fail with a teacher configured; here `process`
    writes groups that carry the teacher's arrays (and how long it took), `distill_only`
    zeroes their advantages, `evaluate` runs as without one, and the trainer turns such
    groups into a distillation step with its KL and coverage."""
    from environments.mod_arithmetic_distill import ModArithmeticDistillEnv
    from tests.support.trainer_batches import make_trainer

    monkeypatch.chdir(tmp_path)
    groups_path = tmp_path / "groups.jsonl"
    save = ("--env.data_path_to_save_groups", str(groups_path), "--env.distill_only", "true")
    run_cli(
        ModArithmeticDistillEnv,
        distill_cli("process", inference_server, tiny_model_path, tmp_path, *save),
    )
    groups = saved_groups(groups_path)
    assert len(groups) >= 2
    for group in groups:
        assert len(group["distill_token_ids"]) == len(group["tokens"]) == 4
        assert group["teacher_latency_s"] > 0
        assert group["overrides"] == [{"set_advantage_to_zero": True}] * 4

    evals = tmp_path / "evals"
    run_cli(
        ModArithmeticDistillEnv,
        distill_cli(
            "evaluate",
            inference_server,
            tiny_model_path,
            tmp_path,
            "--env.data_dir_to_save_evals",
            str(evals),
        ),
    )
    assert "eval/accuracy" in (evals / "metrics.json").read_text()

    for mode in ("reverse_kl", "forward_topk"):
        trainer = make_trainer(
            tiny_model_path, tmp_path / mode, batch_size=8, distill_coef=1.0, distill_mode=mode
        )
        metrics = trainer.train_step(groups[:2])
        assert metrics["distill_coverage"] == 1.0, mode  # every trained position had a teacher
        assert abs(metrics["distill_kl"]) < 0.5, mode  # the teacher is the policy itself
        assert metrics["teacher_latency_s"] > 0
        assert metrics["grad_norm"] < 1.0, f"{mode}: advantages zero, teacher = policy"
