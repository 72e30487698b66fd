"""A run's rollouts as a store: read, list, show, re-score, export and replay them.

`store.read_store(RUN_DIR)` is the reader (docs/rollouts.md); `atropos-rollouts` is the
command (atroposlib/cli/rollouts.py).
"""
