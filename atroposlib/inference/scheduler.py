"""Gathers concurrent requests into batches and runs them on a worker thread.

The event loop only enqueues jobs and awaits futures, so `/health` answers
while a batch is generating (torch releases the GIL in its kernels). Every job
waiting when the worker becomes free joins the next round, up to `max_rows`
sampled sequences.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque

from atroposlib.inference.sampler import GenerationJob, TransformersSampler

logger = logging.getLogger("atroposlib.inference")


class BatchScheduler:
    def __init__(self, engine: TransformersSampler, max_rows: int = 64) -> None:
        self.engine = engine
        self.max_rows = max_rows
        self._pending: deque[tuple[GenerationJob, asyncio.Future, asyncio.AbstractEventLoop]] = (
            deque()
        )
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="generation", daemon=True)
        self._thread.start()
        self.rounds = 0
        self.jobs = 0
        self.generated_tokens = 0

    async def submit(self, job: GenerationJob) -> GenerationJob:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        with self._wake:
            self._pending.append((job, future, loop))
            self._wake.notify()
        return await future

    def close(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=30)

    def _next_round(self) -> list[tuple[GenerationJob, asyncio.Future, asyncio.AbstractEventLoop]]:
        with self._wake:
            while not self._pending and not self._stopping:
                self._wake.wait()
            taken: list[tuple[GenerationJob, asyncio.Future, asyncio.AbstractEventLoop]] = []
            rows = 0
            while self._pending and (
                not taken or rows + self._pending[0][0].params.n <= self.max_rows
            ):
                item = self._pending.popleft()
                taken.append(item)
                rows += item[0].params.n
            return taken

    def _loop(self) -> None:
        while True:
            batch = self._next_round()
            if not batch:
                return
            self.rounds += 1
            self.jobs += len(batch)
            try:
                self.engine.run([job for job, _, _ in batch])
                self.generated_tokens += sum(
                    len(s.token_ids) for job, _, _ in batch for s in job.samples
                )
                error = None
            except Exception as exc:  # surfaced to every request of the round
                logger.exception("generation failed")
                error = exc
            for job, future, loop in batch:
                loop.call_soon_threadsafe(_settle, future, job, error)


def _settle(future: asyncio.Future, job: GenerationJob, error: Exception | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(job)
