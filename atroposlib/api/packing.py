"""Batch assembly: pick whole groups whose sequence counts sum exactly to batch_size.

The rules are Atropos's (docs/api.md, "Batch assembly"):
groups of a common size are gathered into *packs* as large as the largest group
queued, and a batch is made of whole packs, oldest first. Packs keep mixed sizes
from fragmenting a batch.

These functions work on sizes and env ids only, never on group bodies, so the
server can plan a batch over a 10,000-group queue in well under a millisecond
and fetch the chosen bodies afterwards. The scan stops as soon as the batch is
full. When the pack rule cannot fill a batch although an exact combination of
whole groups exists (e.g. sizes 2, 4, 8, 2 for a batch of 16), the server falls
back to that combination instead of stalling as Atropos does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

# The exact-subset fallback looks at this many of the oldest groups at most.
FALLBACK_WINDOW = 4096


def iter_packs(
    sizes: Sequence[int], pack_size: int, keys: Sequence | None = None
) -> Iterator[list[int]]:
    """Yield packs (lists of positions) in the order they complete.

    Groups are binned by size (and by `keys[i]` when given, e.g. the env id); a bin
    becomes a pack the moment its sizes add up to exactly `pack_size`.
    """
    bins: dict[tuple, list[int]] = {}
    for position, size in enumerate(sizes):
        bin_key = (size, keys[position]) if keys is not None else (size,)
        members = bins.setdefault(bin_key, [])
        members.append(position)
        if len(members) * size == pack_size:
            yield members
            bins[bin_key] = []


def take_packs(
    packs: Iterator[list[int]], sizes: Sequence[int], batch_size: int
) -> list[int] | None:
    """Positions, in pack order, of the first groups that add up to exactly batch_size.

    Groups are taken one at a time, so a batch may end inside a pack when the pack
    size does not divide batch_size (as in Atropos); overshooting means no batch.
    """
    chosen: list[int] = []
    total = 0
    for pack in packs:
        for position in pack:
            chosen.append(position)
            total += sizes[position]
            if total == batch_size:
                return chosen
            if total > batch_size:
                return None
    return None


def find_subset_summing_to(sizes: Sequence[int], target: int) -> list[int]:
    """Ascending positions whose sizes sum to `target`; [] when impossible.

    First come, first served when that lands exactly; otherwise any exact
    combination, found with a bitset subset-sum and traced back from the newest
    group (the same choice as Atropos's `find_groups_summing_to_target`).
    """
    if not sizes or target <= 0:
        return []
    picked: list[int] = []
    running = 0
    for position, size in enumerate(sizes):
        if running + size <= target:
            picked.append(position)
            running += size
            if running == target:
                return picked
    mask = (1 << (target + 1)) - 1
    reachable = [1]  # reachable[i]: bitset of sums reachable with the first i groups
    for size in sizes:
        previous = reachable[-1]
        reachable.append((previous | (previous << size)) & mask)
    if not (reachable[-1] >> target) & 1:
        return []
    picked = []
    remaining = target
    for i in range(len(sizes), 0, -1):
        size = sizes[i - 1]
        if size <= remaining and (reachable[i - 1] >> (remaining - size)) & 1:
            picked.append(i - 1)
            remaining -= size
    return sorted(picked)


def plan_batch(
    sizes: Sequence[int],
    env_ids: Sequence[int | None],
    batch_size: int,
    allocations: dict[int, float] | None = None,
) -> list[int] | None:
    """Positions (ascending, i.e. oldest first) of the groups of the next batch, or None.

    `allocations` maps env id -> the share of every batch that env must get
    (`min_batch_allocation`). As upstream, a minimum is a guarantee: while an env
    with one has no complete pack queued, no batch is served, and the exact-subset
    fallback is not used.
    """
    if batch_size <= 0 or sum(sizes) < batch_size:
        return None
    if allocations:
        chosen = plan_with_minimum_allocations(sizes, env_ids, batch_size, allocations)
        return sorted(chosen) if chosen is not None else None
    chosen = take_packs(iter_packs(sizes, max(sizes)), sizes, batch_size)
    if chosen is None:
        chosen = find_subset_summing_to(sizes[:FALLBACK_WINDOW], batch_size) or None
    return sorted(chosen) if chosen is not None else None


def plan_with_minimum_allocations(
    sizes: Sequence[int],
    env_ids: Sequence[int | None],
    batch_size: int,
    allocations: dict[int, float],
) -> list[int] | None:
    """Upstream's `grab_batch_with_minimum_allocations` over sizes: positions in pick order.

    Only groups that complete a per-env pack are eligible. Each env with a positive
    minimum first gets its packs up to `int(batch_size * share)` sequences (scaled
    down when the shares sum past 1, keeping at least one group each); the rest is
    filled oldest first. None when an env with a minimum has nothing packable, or
    when the picks do not land exactly on `batch_size`.
    """
    if not sizes:
        return None
    present = {env for env in env_ids if env is not None}
    packable: dict[int, list[int]] = {}
    for pack in iter_packs(sizes, max(sizes), keys=env_ids):
        pack_env = env_ids[pack[0]]
        if pack_env is not None:
            packable.setdefault(pack_env, []).extend(pack)
    minimums: dict[int, int] = {}
    for env, share in allocations.items():
        needed = int(batch_size * share)
        if needed <= 0:
            continue
        if env not in present or not packable.get(env):
            return None
        minimums[env] = needed
    requested = sum(minimums.values())
    if requested > batch_size:
        scale = batch_size / requested
        minimums = {
            env: max(min(sizes[p] for p in packable[env]), int(needed * scale))
            for env, needed in minimums.items()
        }
    chosen: list[int] = []
    taken: set[int] = set()
    total = 0
    for env, needed in minimums.items():
        got = 0
        for position in packable[env]:
            if got >= needed:
                break
            if total + sizes[position] <= batch_size:
                chosen.append(position)
                taken.add(position)
                got += sizes[position]
                total += sizes[position]
    eligible = sorted(p for positions in packable.values() for p in positions if p not in taken)
    for position in eligible:
        if total >= batch_size:
            break
        if total + sizes[position] <= batch_size:
            chosen.append(position)
            total += sizes[position]
    return chosen if total == batch_size else None
