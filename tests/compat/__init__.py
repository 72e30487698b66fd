"""Upstream Atropos code and dialects, run against this package."""
