"""Upstream's package name for the rollout viewer; it lives in `atroposlib.viewer` now."""
