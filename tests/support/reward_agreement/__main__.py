"""Print each reward's agreement with its reference (the figures in docs/rewards.md)."""

from __future__ import annotations

import logging

from tests.support.reward_agreement import compare

# a reward logs each completion it cannot grade (and scores 0); the table is the output
logging.disable(logging.CRITICAL)

for agreement in compare.all_agreements():
    print(agreement.line())
    for why, n in sorted(agreement.deliberate.items()):
        print(f"    {n:4d} x documented: {why}")
    for detail in agreement.disagreements[:5]:
        print(f"    unexplained: {detail}")
