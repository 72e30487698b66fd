"""Differential checks of the shared rewards against their reference implementations.

Each module here generates seeded adversarial cases for one reward and computes the
reference's verdict on each; `agreement` compares. `python -m tests.support.reward_agreement`
prints the figures docs/rewards.md quotes.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Agreement:
    """How one reward's verdicts compare with its reference's on M generated cases."""

    reward: str
    reference: str
    cases: int = 0
    agreed: int = 0
    # a documented difference -> the cases it explains
    deliberate: dict[str, int] = field(default_factory=dict)
    # cases that are neither agreement nor a documented difference: a failing test
    disagreements: list[str] = field(default_factory=list)

    def add(self, agrees: bool, why: str | None = None, detail: str = "") -> None:
        """One case: it agrees, or differs for the documented reason `why`, or neither."""
        self.cases += 1
        if agrees:
            self.agreed += 1
        elif why:
            self.deliberate[why] = self.deliberate.get(why, 0) + 1
        else:
            self.disagreements.append(detail)

    def line(self) -> str:
        explained = sum(self.deliberate.values())
        return (
            f"{self.reward}: agrees with {self.reference} on {self.agreed} of {self.cases} "
            f"cases; {explained} differ as documented; {len(self.disagreements)} unexplained"
        )
