"""Queue helpers that Atropos user code imports, with Atropos's names, signatures and results.

They operate on lists of group dicts (each with a "tokens" list of sequences).
The server itself plans batches with `atroposlib.api.packing` over sizes only;
these wrappers keep the dict-based API for code written against Atropos.
"""

from __future__ import annotations

from typing import Any

from atroposlib.api.packing import (
    find_subset_summing_to,
    iter_packs,
    plan_with_minimum_allocations,
    take_packs,
)


def _sizes(groups: list[dict[str, Any]]) -> list[int]:
    return [len(group.get("tokens", [])) for group in groups]


def _split(queue: list, positions: list[int]) -> tuple[list, list]:
    chosen = set(positions)
    batch = [queue[p] for p in positions]
    return batch, [group for i, group in enumerate(queue) if i not in chosen]


def find_groups_summing_to_target(buffer: list[dict[str, Any]], target_size: int) -> list[int]:
    """Indices (ascending) of groups whose sequence counts sum to target_size; [] if none."""
    return find_subset_summing_to(_sizes(buffer), target_size)


def grab_exact_from_heterogeneous_queue(
    queue: list[dict[str, Any]], batch_size: int
) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """Whole groups totalling exactly batch_size sequences, packed by the largest group size.

    Returns (batch, remaining queue in its order), or (None, queue) when impossible.
    """
    sizes = _sizes(queue)
    if not sizes or sum(sizes) < batch_size:
        return None, queue
    positions = take_packs(iter_packs(sizes, max(sizes)), sizes, batch_size)
    if positions is None:
        return None, queue
    return _split(queue, positions)


def grab_batch_with_minimum_allocations(
    queue: list[dict[str, Any]], batch_size: int, env_configs: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """Like `grab_exact_from_heterogeneous_queue`, reserving each env's min_batch_allocation.

    `env_configs` are dicts with `registered_id`, `connected` and `min_batch_allocation`;
    groups carry `env_id`. Only groups that complete a per-env pack are eligible.
    """
    if not queue:
        return None, queue
    allocations = {
        env["registered_id"]: env["min_batch_allocation"]
        for env in env_configs
        if env.get("connected", False) and env.get("min_batch_allocation") is not None
    }
    if not allocations:
        return grab_exact_from_heterogeneous_queue(queue, batch_size)

    chosen = plan_with_minimum_allocations(
        _sizes(queue), [group.get("env_id") for group in queue], batch_size, allocations
    )
    if chosen is None:
        return None, queue
    return _split(queue, chosen)
