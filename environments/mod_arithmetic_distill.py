r"""Modular arithmetic with a teacher: the quickstart's task as on-policy distillation.

The same problems, scores and evaluation as `mod_arithmetic.py`; every group also
carries a teacher's prompt logprobs over the student's own samples
(`TeacherDistillationEnv`), which the trainer learns from with `--distill-coef`
(docs/trainer.md, Distillation). `--env.distill_only true` keeps the scores for the
record but trains on the teacher alone.

`configs/distill_cpu.yaml` runs it with `tiny-teacher` (the tiny model built to be
right 90% of the time) as the teacher of a fresh tiny student. By hand, with a second
engine serving the teacher, add `--teacher.base_url http://127.0.0.1:9002/v1
--teacher.model_name tiny-teacher --teacher.tokenizer_name PATH_OF_THE_TEACHER
--teacher.server_type vllm` to `serve`. Offline, the tiny model as its own teacher
(the plumbing, not a lesson):

    python environments/mod_arithmetic_distill.py process --env.total_steps 2 \
        --env.teacher_enabled true --teacher.base_url http://127.0.0.1:9001/v1 \
        --teacher.model_name tiny --teacher.tokenizer_name ./tiny-model \
        --teacher.server_type vllm \
        --openai.base_url http://127.0.0.1:9001/v1 --openai.model_name tiny
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python environments/mod_arithmetic_distill.py` puts environments/ on sys.path, not the root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.teacher_distillation_env import (
    TeacherDistillationConfig,
    TeacherDistillationEnv,
)
from environments.mod_arithmetic import ModArithmeticConfig, ModArithmeticEnv


class ModArithmeticDistillConfig(TeacherDistillationConfig, ModArithmeticConfig):
    """The task's settings and the teacher's (`teacher_enabled`, `teacher_top_k`, ...)."""


class ModArithmeticDistillEnv(TeacherDistillationEnv, ModArithmeticEnv):
    name = "mod_arithmetic_distill"
    env_config_cls = ModArithmeticDistillConfig
    config: ModArithmeticDistillConfig

    @classmethod
    def config_init(cls) -> tuple[ModArithmeticDistillConfig, APIServerConfig]:
        config, server = ModArithmeticEnv.config_init()
        return ModArithmeticDistillConfig(**config.model_dump()), server


if __name__ == "__main__":
    ModArithmeticDistillEnv.cli()
