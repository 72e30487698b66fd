"""Process trees from /proc: who descends from whom, and who is still alive."""

from atroposlib.utils.processes import alive, descendants

__all__ = ["alive", "descendants"]
