"""The code sandbox's tests' `limits`: LIMITS in each mode this machine can run."""

from __future__ import annotations

import pytest

from atroposlib.envs import sandbox as sandbox_module
from atroposlib.envs.sandbox import SandboxLimits
from tests.support.sandbox import LIMITS, MODES


@pytest.fixture(params=MODES)
def limits(request) -> SandboxLimits:
    """LIMITS in each mode this machine can run (the other skips with its reason)."""
    problem = sandbox_module._mode_works(request.param)
    if problem is not None:
        pytest.skip(f"the {request.param} sandbox cannot run here: {problem}")
    return LIMITS.model_copy(update={"isolation": request.param})
