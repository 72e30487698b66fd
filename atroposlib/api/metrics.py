"""Prometheus metrics for `/metrics`.

Gauges and counters are read from `RunState` at scrape time (a custom collector),
so the request path pays nothing for them; only request latency is observed per
request. Each app gets its own registry, so several servers can live in one
process (tests) without clashing.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from atroposlib.api.state import RunState

disable_created_metrics()

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _StateCollector:
    def __init__(self, state: RunState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        s = self.state

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"atropos_{name}", doc, value=value)

        def counter(name: str, doc: str, key: str) -> CounterMetricFamily:
            return CounterMetricFamily(f"atropos_{name}", doc, value=s.counters[key])

        batches = s.batches
        batches.plan_if_stale(s.registration, s.envs.min_allocations())
        yield gauge("queued_groups", "Groups waiting in the queue.", len(batches.queue))
        yield gauge("queued_sequences", "Sequences waiting in the queue.", batches.queued_sequences)
        yield gauge(
            "buffered_groups",
            "Off-size groups held in per-env buffers.",
            sum(len(rows) for rows in s.buffers.values()),
        )
        yield gauge("buffered_sequences", "Sequences in per-env buffers.", s.buffered_sequences)
        yield gauge("current_step", "Trainer step (batches served).", batches.step)
        yield gauge(
            "batch_blocked",
            "1 when at least batch_size sequences are queued but no exact batch can be formed.",
            1 if batches.blocked_reason else 0,
        )
        yield gauge("registered_envs", "Environments registered.", len(s.envs))
        yield counter("groups_received", "Groups accepted (queued or buffered).", "groups_received")
        yield counter("sequences_received", "Sequences accepted.", "sequences_received")
        yield counter("batches_served", "Batches handed to the trainer.", "batches_served")
        yield counter("sequences_served", "Sequences handed to the trainer.", "sequences_served")
        yield counter(
            "idempotent_replays",
            "Posts answered from the idempotency table instead of being queued again.",
            "idempotent_replays",
        )
        yield counter(
            "store_write_errors",
            "Store writes that failed (disk full, read-only, I/O error); each answered 503.",
            "store_write_errors",
        )
        yield gauge(
            "store_error",
            "1 while the last store write failed (see store_error in /status), else 0.",
            1 if s.store_error is not None else 0,
        )
        rejected = CounterMetricFamily(
            "atropos_rejected_requests", "Requests refused, by reason.", labels=["reason"]
        )
        for key, value in s.counters.items():
            if key.startswith("rejected_"):
                rejected.add_metric([key.removeprefix("rejected_")], value)
        yield rejected
        per_env = CounterMetricFamily(
            "atropos_env_queued", "Groups and sequences queued per env.", labels=["env_id", "kind"]
        )
        for (kind, env), value in s.env_counters.items():
            per_env.add_metric([env, kind], value)
        yield per_env
        env_queue = GaugeMetricFamily(
            "atropos_env_queue_sequences", "Sequences waiting per env.", labels=["env_id"]
        )
        for env_id, sizes in s.batches.env_sizes.items():
            env_queue.add_metric([str(env_id)], sum(size * n for size, n in sizes.items()))
        yield env_queue


class ApiMetrics:
    def __init__(self, state: RunState) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StateCollector(state))
        self.latency = Histogram(
            "atropos_request_duration_seconds",
            "Request latency by endpoint.",
            ["path"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
