"""Every name that upstream's environment modules import from atroposlib imports here.

The list is the result of an AST scan of the 119 BaseEnv modules under
upstream's `environments/` (archived HEAD 296a0bc5): each `from atroposlib.X
import Y`. Left out are the few names upstream itself does not define (its
own envs that use them fail to import upstream too): `OpenaiConfig`,
`BaseLanguageEnv`, `atroposlib.api.config`, `parse_args_and_command`,
`tokenize_for_trainer_dpo`.
"""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("transformers")

UPSTREAM_ENV_IMPORTS = {
    "atroposlib.envs.base": [
        "APIServer",
        "APIServerConfig",
        "BaseEnv",
        "BaseEnvConfig",
        "EvalHandlingEnum",
        "Item",
        "ScoredDataGroup",
        "ScoredDataItem",
        "ServerBaseline",
    ],
    "atroposlib.envs.eval": ["EvalBase", "eval_runner", "evaluate_log", "pass_at_k"],
    "atroposlib.envs.reward_fns": ["CombinedReward", "RewardFunction", "registry"],
    "atroposlib.envs.reward_fns.combined_reward": ["CombinedReward"],
    "atroposlib.envs.reward_fns.registry": ["registry"],
    "atroposlib.envs.server_handling.managed_server": ["ManagedServerAdapter", "SequenceNode"],
    "atroposlib.envs.server_handling.openai_server": ["APIServerConfig"],
    "atroposlib.envs.server_handling.server_baseline": ["APIServerConfig", "ServerBaseline"],
    "atroposlib.envs.server_handling.server_manager": ["APIServerConfig", "ServerManager"],
    "atroposlib.envs.teacher_distillation_env": [
        "TeacherDistillationConfig",
        "TeacherDistillationEnv",
    ],
    "atroposlib.type_definitions": ["GameHistory", "Item", "Message", "number"],
    "atroposlib.utils.best_of_n_selection": ["select_best_index"],
    "atroposlib.utils.io": ["parse_http_response"],
    "atroposlib.utils.message_history_utils": [
        "ensure_trajectory_token_limit",
        "truncate_thinking",
    ],
    "atroposlib.utils.tokenize_for_trainer": ["tokenize_for_trainer"],
    "atroposlib.utils.tool_call_parser": ["parse_tool_call"],
}


@pytest.mark.parametrize("module", sorted(UPSTREAM_ENV_IMPORTS))
def test_the_names_upstream_envs_import_exist(module):
    imported = importlib.import_module(module)
    missing = [name for name in UPSTREAM_ENV_IMPORTS[module] if not hasattr(imported, name)]
    assert not missing, f"{module} lacks {missing}"


def test_the_envs_package_and_the_api_package_import():
    for module in ("atroposlib.envs", "atroposlib.api", "atroposlib.envs.constants"):
        importlib.import_module(module)
