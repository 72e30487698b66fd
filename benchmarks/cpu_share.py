"""Was the machine quiet? The share of the CPU that other processes took during a run.

A timing taken while something else ran is not a result: on this project's 2-core
machine one busy neighbour doubles a step. `CpuWatch` reads the whole machine's busy
time (`/proc/stat`, steal included: a hypervisor's neighbours count too) and the run's
own CPU time (this process and every child it waited for), and reports what is left:
the others' share of all cores over the run's wall time. A benchmark flags its figure,
or refuses to compare, when that share is above `BUSY_SHARE`.

    with CpuWatch() as watch:
        run_the_thing()
    print(watch.verdict())   # "quiet: others took 0.4% of 2 CPUs" or "BUSY: ..."
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

BUSY_SHARE = 0.05
"""Above this share of all cores used by other processes, a timing is flagged."""

_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float | None:
    """Seconds of CPU every core has spent busy since boot (None where /proc is absent)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: inside user]
    ticks = [int(value) for value in fields[:8]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / _TICKS


def own_cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def others_share(machine_busy_s: float, own_s: float, wall_s: float, cpus: int) -> float:
    """The share of `cpus` cores over `wall_s` that was busy but not with this run."""
    if wall_s <= 0:
        return 0.0
    return max(0.0, machine_busy_s - own_s) / (wall_s * cpus)


class CpuWatch:
    """Measures the others' share of the CPU between `__enter__` and `__exit__`."""

    def __init__(self) -> None:
        self.cpus = os.cpu_count() or 1
        self.wall_s = self.own_s = 0.0
        self.others_share: float | None = None

    def __enter__(self) -> CpuWatch:
        self._wall = time.perf_counter()
        self._own = own_cpu_s()
        self._busy = machine_busy_s()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._wall
        self.own_s = own_cpu_s() - self._own
        busy = machine_busy_s()
        if busy is None or self._busy is None:
            return
        self.others_share = others_share(busy - self._busy, self.own_s, self.wall_s, self.cpus)

    @property
    def busy(self) -> bool:
        return self.others_share is not None and self.others_share > BUSY_SHARE

    def verdict(self) -> str:
        if self.others_share is None:
            return "unchecked: no /proc/stat here"
        share = f"others took {self.others_share:.1%} of {self.cpus} CPUs"
        if self.busy:
            return f"BUSY: {share} (over {BUSY_SHARE:.0%}): this timing is not a result"
        return f"quiet: {share}"
