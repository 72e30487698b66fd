"""The one error a weight push into a running engine raises."""

from __future__ import annotations


class WeightSyncError(RuntimeError):
    """a weight push the engine did not take; the message says why"""
