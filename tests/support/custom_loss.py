"""A user's losses outside the library, for `--loss-import-path` and `@register_loss`.

`plain_reinforce` is a bare function (it gets the per-token normaliser); the decorated
`sequence_reinforce` declares its own. Each records what it was given, so a test can
tell that the trainer called it and used its answer."""

from __future__ import annotations

from example_trainer.losses import LossInputs, LossOutputs, register_loss

CALLS: list[LossOutputs] = []


def plain_reinforce(inputs: LossInputs) -> LossOutputs:
    """REINFORCE: -A logp on every trained token, nothing clipped."""
    outputs = LossOutputs(-inputs.advantages * inputs.logprobs, inputs.trained & False)
    CALLS.append(outputs)
    return outputs


@register_loss("test_sequence_reinforce", trl=None, normaliser="sequence")
def sequence_reinforce(inputs: LossInputs) -> LossOutputs:
    return plain_reinforce(inputs)
