"""Each reward's verdicts against its reference's on the generated cases."""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import replace
from typing import Any

from atroposlib.utils.torch_threads import one_torch_thread
from tests.support.reward_agreement import (
    Agreement,
    ifeval,
    json_schema,
    think_format,
    tool_call,
    upstream,
)
from tests.support.reward_agreement.upstream_runner import outcome

REGEX_KEYWORD = "a keyword that is not a valid regex: lm-eval raises, the reward scores 0"
STRIPPED_AFTER_THINK = "the response after </think> is graded stripped"
RANDOMIZED = "an argument lm-eval would replace with a random one: refused, scores 0"


def ifeval_agreement(n: int = 500, seed: int = 27) -> Agreement:
    """The "ifeval" reward (score, strict and loose verdicts) against lm-eval's IFEval."""
    from atroposlib.envs.reward_fns._ifeval_checks import (
        UnsupportedInstruction,
        compile_constraints,
        loose,
        response_text,
        strict,
    )
    from atroposlib.envs.reward_fns.ifeval_reward import IFEvalReward, constraints_of

    reward = IFEvalReward()
    agreement = Agreement("ifeval", "lm-eval's IFEval, strict and loose")
    for case in ifeval.cases(n, seed):
        score = reward.compute([case.completion], **case.row())[0]
        if "randomized" in case.tags:
            try:
                compile_constraints(constraints_of(case.instruction_id_list, case.kwargs))
            except UnsupportedInstruction:
                agreement.add(False, RANDOMIZED if score == 0.0 else None, repr(case))
            else:
                agreement.add(False, None, f"{case!r} was not refused")
            continue
        reference = ifeval.lm_eval_verdicts(case)
        if isinstance(reference, str):
            agreement.add(False, REGEX_KEYWORD if score == 0.0 else None, reference)
            continue
        checks = compile_constraints(constraints_of(case.instruction_id_list, case.kwargs))
        response = response_text(case.completion)
        ours = {"strict": strict(response, checks), "loose": loose(response, checks)}
        expected = sum(reference["strict"]) / len(reference["strict"])
        if ours == reference and score == expected:
            agreement.add(True)
            continue
        stripped = ifeval.lm_eval_verdicts(replace(case, response=case.response.strip()))
        why = STRIPPED_AFTER_THINK if case.thinking and stripped == ours else None
        agreement.add(False, why, f"{case!r}: ours {ours} score {score}, lm-eval {reference}")
    return agreement


CANNOT_COMPARE = "jsonschema raises on the value (e.g. OverflowError): the reward scores invalid"
SCORES = {"valid": 1.0, "invalid": 0.25, "no json": 0.0}


def json_schema_agreement(n: int = 400, seed: int = 27) -> Agreement:
    """The "json_schema" reward against the jsonschema package on the extracted answer."""
    from atroposlib.envs.reward_fns.json_schema_reward import JsonSchemaReward, extract_json_text

    reward = JsonSchemaReward()
    agreement = Agreement("json_schema", "the jsonschema package, Draft 2020-12 with formats")
    for schema, completion in json_schema.cases(n, seed):
        score = reward.compute([completion], schema=schema)[0]
        verdict = json_schema.reference_verdict(schema, extract_json_text(completion))
        detail = f"{completion!r} against {schema}: ours {score}, jsonschema {verdict}"
        if verdict.startswith("raises"):
            agreement.add(False, CANNOT_COMPARE if score == 0.25 else None, detail)
        else:
            agreement.add(score == SCORES[verdict], None, detail)
    return agreement


EMPTY_THINKING = "an empty reasoning block scores 0 (TRL: 1)"
NO_ANSWER = "nothing after </think> scores 0 (TRL: 1); require_answer=False allows it"
SECOND_CLOSE = "a second </think> scores 0 (TRL forbids only a second <think>)"
LEADING_SPACE = "whitespace before <think> is allowed (TRL: 0)"


def think_format_agreement(n: int = 400, seed: int = 27) -> Agreement:
    """The "think_format" reward against TRL's think_format_reward."""
    from atroposlib.envs.reward_fns.think_format_reward import ThinkFormatReward

    reward = ThinkFormatReward()
    agreement = Agreement("think_format", "TRL's think_format_reward (trl 1.16.0)")
    for text in think_format.completions(n, seed):
        ours, theirs = reward.compute([text])[0], think_format.trl_verdict(text)
        why = None
        body = text.strip()
        thinking, _, answer = body.removeprefix("<think>").partition("</think>")
        if ours == 0.0 and theirs == 1.0:
            if body.count("</think>") > 1:
                why = SECOND_CLOSE
            elif not thinking.strip():
                why = EMPTY_THINKING
            elif not answer.strip():
                why = NO_ANSWER
        elif ours == 1.0 and theirs == 0.0 and text[:1].isspace():
            why = LEADING_SPACE if think_format.trl_verdict(text.lstrip()) == 1.0 else None
        agreement.add(ours == theirs, why, f"{text!r}: ours {ours}, TRL {theirs}")
    return agreement


def tool_call_agreement(python: str, n: int = 400, seed: int = 27) -> Agreement:
    """The calls the "tool_call" reward reads from a reply against vLLM's hermes parser."""
    from atroposlib.envs.reward_fns.tool_call_reward import parse_tool_calls

    texts = tool_call.replies(n, seed)
    agreement = Agreement("tool_call", "vLLM's hermes tool parser (vllm 0.32.0)")
    for text, reference in zip(texts, tool_call.vllm_calls(python, texts), strict=True):
        ours = [[c["name"], c["arguments"]] for c in parse_tool_calls(text) or []]
        same = json.dumps(ours, sort_keys=True) == json.dumps(reference, sort_keys=True)
        agreement.add(same, None, f"{text!r}: ours {ours}, vLLM {reference}")
    return agreement


NULL_CONTENT = (
    "a message whose content is null (a tool-call turn) reads as empty text; upstream "
    "hands the None on and raises, or scores it through its error path"
)
LITERAL_TAGS = "tag names are matched literally; upstream reads them as regexes"


def _same(ours: dict[str, Any], theirs: dict[str, Any], tolerance: float) -> bool:
    if "scores" not in ours or "scores" not in theirs:
        return False
    pairs = list(zip(ours["scores"], theirs["scores"], strict=False))
    return len(ours["scores"]) == len(theirs["scores"]) and all(
        (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tolerance for a, b in pairs
    )


def _null_content_as_text(value: Any) -> Any:
    """The case with every null message content written as "" (what ours reads)."""
    if isinstance(value, dict):
        if value.get("content", "") is None:
            return {**value, "content": ""}
        return {key: _null_content_as_text(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_null_content_as_text(item) for item in value]
    return value


def _explaining_variants(case: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """For each documented difference that may apply: the case rewritten so upstream,
    given it, should agree with ours if that difference is the whole story."""
    variants = {}
    completions = _null_content_as_text(case["completions"])
    if completions != case["completions"]:
        variants[NULL_CONTENT] = {**case, "completions": completions}
    tags = case["init"].get("preferred_tags")
    if case["target"] == "FormatReward" and tags:
        escaped = copy.deepcopy(case)
        escaped["init"]["preferred_tags"] = [re.escape(tag) for tag in tags]
        escaped["completions"] = completions
        variants[LITERAL_TAGS] = escaped
    return variants


def upstream_agreements(model_path: str | None, n: int = 200, seed: int = 27) -> list[Agreement]:
    """The upstream-named rewards against upstream Atropos 0.4.0's own code, one
    Agreement per module. Each case that differs is rerun upstream as rewritten for
    each documented difference that may explain it; it counts as explained only if
    upstream then agrees."""
    built = upstream.cases(n, seed, model_path)
    theirs = upstream.upstream_outcomes(built)
    with one_torch_thread():  # as upstream's runner: see upstream.ONE_THREAD
        ours = [outcome("atroposlib", case) for case in built]
    differing = [
        i for i, pair in enumerate(zip(ours, theirs, strict=True)) if not _same(*pair, 1e-5)
    ]
    variants = [(i, why, v) for i in differing for why, v in _explaining_variants(built[i]).items()]
    rerun = upstream.upstream_outcomes([v for _, _, v in variants]) if variants else []
    explained: dict[int, str] = {}
    for (i, why, _), out in zip(variants, rerun, strict=True):
        if _same(ours[i], out, 1e-5):
            explained.setdefault(i, why)  # the first (simplest) rewrite that explains it
    agreements: dict[str, Agreement] = {}
    for i, case in enumerate(built):
        name = case["module"].removesuffix("_reward")
        agreement = agreements.setdefault(name, Agreement(name, "upstream Atropos 0.4.0"))
        detail = f"{case}: ours {ours[i]}, upstream {theirs[i]}"
        agreement.add(i not in differing, explained.get(i), detail)
    return list(agreements.values())


def all_agreements() -> list[Agreement]:
    from atroposlib.utils.tiny_model import ensure_tiny_model
    from tests.support.reward_agreement.math_verify import math_verify_agreement
    from tests.support.vllm import vllm_python

    agreements = [ifeval_agreement(), json_schema_agreement(), think_format_agreement()]
    agreements.append(math_verify_agreement())
    agreements += upstream_agreements(str(ensure_tiny_model()))
    python = vllm_python()
    if python:
        agreements.append(tool_call_agreement(python))
    return agreements
