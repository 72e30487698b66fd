"""atroposlib: RL environments for language models as microservices (Atropos-compatible)."""

__version__ = "0.1.0"
