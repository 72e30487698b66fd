"""On-policy distillation: groups carry a teacher model's prompt logprobs.

The teacher scores the student's own sequences (prompt logprobs of the full
token sequence), so the trainer can pull the student's per-token distribution
towards the teacher's. Only same-tokenizer distillation is supported: the
student's token ids are sent to the teacher as they are, and the teacher's
top-k ids index the student's vocabulary directly, which is why a teacher whose
vocabulary differs is refused at construction.

The enrichment sits in `handle_send_to_api`, so any env's rollout code is
unchanged; the teacher's servers come from `teacher_config_init()`, the
`--teacher.*` flags and the `teacher:` YAML key (declared to the generic CLI
through `cli_server_namespaces`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC
from typing import Any

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.cli import ServerNamespace, resolve_namespace_servers
from atroposlib.envs.constants import NAMESPACE_SEP
from atroposlib.envs.server_handling.server_baseline import APIServerConfig, ServerBaseline
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.protocol import TEACHER_LATENCY_FIELD
from atroposlib.utils.tokenizers import TokenizerLoadError, load_tokenizer

logger = logging.getLogger(__name__)

__all__ = ["TeacherDistillationConfig", "TeacherDistillationEnv"]

TeacherServerConfigs = ServerBaseline | APIServerConfig | list[APIServerConfig]


class TeacherDistillationConfig(BaseEnvConfig):
    teacher_enabled: bool = Field(
        default=False,
        description="Fetch the teacher's prompt logprobs for every group sent (distillation).",
    )
    teacher_top_k: int = Field(
        default=0,
        ge=-1,
        description=(
            "Prompt logprobs to fetch per position beyond the sampled token: 0 for the "
            "sampled token only, -1 to fetch nothing."
        ),
    )
    distill_only: bool = Field(
        default=False,
        description=(
            "Pure distillation: the groups keep their scores (reported as ever) but every "
            "sequence's advantage is set to zero, so the trainer learns from the teacher alone."
        ),
    )


class TeacherDistillationEnv(BaseEnv, ABC):
    """A `BaseEnv` whose groups gain `distill_token_ids` / `distill_logprobs`.

    Both are shaped [sequence][position][k]: for each position of each sequence,
    the teacher's top-k token ids (student vocabulary) and their logprobs.
    """

    env_config_cls = TeacherDistillationConfig
    config: TeacherDistillationConfig  # a type only: BaseEnv.__init__ sets it
    teacher_namespace = "teacher"

    @classmethod
    def teacher_config_init(cls) -> TeacherServerConfigs | None:
        """Default teacher servers; None means they must come from flags or YAML."""
        return None

    @classmethod
    def cli_server_namespaces(cls) -> dict[str, ServerNamespace]:
        """The teacher's `--teacher.*` flags and `teacher:` YAML key for the env CLI."""
        return {
            cls.teacher_namespace: ServerNamespace(
                init_kwarg="teacher_server_configs", defaults=cls.teacher_config_init()
            )
        }

    @classmethod
    def _resolve_teacher_server_configs(
        cls,
        default_teacher_server_configs: TeacherServerConfigs | None,
        yaml_config: dict[str, Any],
        cli_passed_flags: dict[str, Any],
    ) -> TeacherServerConfigs | None:
        """Teacher servers from defaults < the YAML `teacher` key < `teacher.*` flags."""
        prefix = f"{cls.teacher_namespace}{NAMESPACE_SEP}"
        flags = {
            key[len(prefix) :]: value
            for key, value in cli_passed_flags.items()
            if key.startswith(prefix)
        }
        return resolve_namespace_servers(
            default_teacher_server_configs, yaml_config.get(cls.teacher_namespace), flags
        )

    def __init__(
        self,
        config: TeacherDistillationConfig,
        server_configs: ServerBaseline | APIServerConfig | list[APIServerConfig],
        teacher_server_configs: TeacherServerConfigs | None = None,
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        self.teacher_server: ServerManager | None = None
        self.teacher_latencies: list[float] = []
        """Seconds each group waited for the teacher since the last wandb log."""
        if not getattr(config, "teacher_enabled", False):  # a plain BaseEnvConfig: none
            return
        if teacher_server_configs is None:
            raise ValueError(
                "teacher_enabled=True but no teacher server configuration was provided: "
                "pass teacher_server_configs=... to the constructor, return one from "
                f"teacher_config_init(), or give --{self.teacher_namespace}.base_url / "
                f"--{self.teacher_namespace}.model_name (or a '{self.teacher_namespace}:' "
                "section in --config)"
            )
        source = (
            [teacher_server_configs]
            if isinstance(teacher_server_configs, APIServerConfig)
            else teacher_server_configs
        )
        self.teacher_server = ServerManager(source, slurm=False, testing=False)
        first = source[0] if isinstance(source, list) else source
        tokenizer_name = getattr(first, "tokenizer_name", "none")
        if tokenizer_name in ("", "none"):
            tokenizer_name = first.model_name
        self._validate_teacher_tokenizer_compatibility(tokenizer_name)

    def _validate_teacher_tokenizer_compatibility(self, teacher_tokenizer_name: str) -> None:
        """Refuse a teacher whose vocabulary is not the student's (ids would not line up)."""
        student_name = getattr(self.tokenizer, "name_or_path", None) or ""
        if student_name == teacher_tokenizer_name:
            return
        try:  # the torch-free load every environment's own tokenizer takes
            teacher_tokenizer = load_tokenizer(teacher_tokenizer_name, "--teacher.tokenizer_name")
        except TokenizerLoadError as exc:
            raise ValueError(
                "Cross-tokenizer distillation is not supported, and the teacher tokenizer "
                f"{teacher_tokenizer_name!r} could not be loaded to check that it is the "
                f"student's: {exc}"
            ) from exc
        if self.tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
            student = student_name or type(self.tokenizer).__name__
            raise ValueError(
                "Cross-tokenizer distillation is not supported: the student tokenizer "
                f"{student!r} and the teacher tokenizer {teacher_tokenizer_name!r} have "
                "different vocabularies"
            )

    async def _fetch_teacher_for_sequence(
        self, token_ids: list[int], top_k: int
    ) -> tuple[list[list[int]], list[list[float]]]:
        """The teacher's per-position top-k (ids, logprobs) over one whole sequence."""
        assert self.teacher_server is not None
        payload = await self.teacher_server.get_logprobs(
            input_ids=token_ids, top_k=top_k, max_tokens=1, split="train"
        )
        return payload["prompt_topk_token_ids"], payload["prompt_topk_logprobs"]

    @staticmethod
    def _without_distillation(group: ScoredDataGroup) -> ScoredDataGroup:
        group["distill_token_ids"] = None
        group["distill_logprobs"] = None
        return group

    async def _attach_teacher_distillation(self, group: ScoredDataGroup) -> ScoredDataGroup:
        """`group` with the teacher's arrays, or with them None when skipped or failed.

        `group_overrides` may set `teacher_top_k` for this group or `skip_teacher_top_k`.
        One failed sequence drops the whole group's payload: a partial one would
        misalign sequences and arrays.
        """
        if self.teacher_server is None:  # not enabled (set in __init__ only when it is)
            return group
        if self.config.distill_only:
            given = group.get("overrides") or [{} for _ in group.get("tokens", [])]
            group["overrides"] = [{**(own or {}), "set_advantage_to_zero": True} for own in given]
        sequences = group.get("tokens", [])
        overrides = group.get("group_overrides") or {}
        if not sequences or overrides.get("skip_teacher_top_k", False):
            return self._without_distillation(group)
        top_k = int(overrides.get("teacher_top_k", self.config.teacher_top_k))
        if top_k <= -1:
            return self._without_distillation(group)
        started = time.perf_counter()
        results = await asyncio.gather(
            *(self._fetch_teacher_for_sequence(seq, top_k) for seq in sequences),
            return_exceptions=True,
        )
        waited = time.perf_counter() - started
        self.teacher_latencies.append(waited)
        token_ids: list[list[list[int]]] = []
        logprobs: list[list[list[float]]] = []
        for index, result in enumerate(results):
            if isinstance(result, BaseException):
                logger.warning(
                    "teacher logprobs for sequence %d failed (%s); the group goes without "
                    "distillation arrays",
                    index,
                    result,
                )
                return self._without_distillation(group)
            ids, lps = result
            if len(ids) != len(lps):
                logger.warning(
                    "teacher returned %d top-k id rows but %d logprob rows for sequence %d; "
                    "the group goes without distillation arrays",
                    len(ids),
                    len(lps),
                    index,
                )
                return self._without_distillation(group)
            token_ids.append(ids)
            logprobs.append(lps)
        group["distill_token_ids"] = token_ids
        group["distill_logprobs"] = logprobs
        group[TEACHER_LATENCY_FIELD] = round(waited, 4)  # type: ignore[literal-required]
        return group

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        """The env's metrics plus how long groups waited for the teacher."""
        metrics = dict(wandb_metrics or {})
        if self.teacher_latencies:
            waits = self.teacher_latencies
            metrics["teacher/latency_mean_s"] = sum(waits) / len(waits)
            metrics["teacher/latency_max_s"] = max(waits)
            self.teacher_latencies = []
        await super().wandb_log(metrics)

    async def handle_send_to_api(
        self,
        scored_data: ScoredDataGroup | list[ScoredDataGroup] | None,
        item: Any = None,
        do_send_to_api: bool = True,
        abort_on_any_max_length_exceeded: bool = True,
    ) -> None:
        """Attach the teacher's arrays to each group, then send as `BaseEnv` does."""
        groups = scored_data if isinstance(scored_data, list) else [scored_data]
        enriched = [
            await self._attach_teacher_distillation(group) for group in groups if group is not None
        ]
        if isinstance(scored_data, list):
            payload: Any = enriched
        else:
            payload = enriched[0] if enriched else scored_data
        return await super().handle_send_to_api(
            payload,
            item=item,
            do_send_to_api=do_send_to_api,
            abort_on_any_max_length_exceeded=abort_on_any_max_length_exceeded,
        )
