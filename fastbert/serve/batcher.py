"""The token-budget batcher of `fastbert serve`: requests' tokenized inputs in, one model thread out.

The event loop submits a request's rows (already tokenized, on the tokenizer threads) and awaits an
asyncio future; one model thread takes rows from the queue in arrival order into a batch while the
batch stays within `max_batch_tokens` (packed rows count their tokens, padded rows rows x longest)
and `max_batch_requests` inputs, sorts it longest first, runs it, and hands each request its rows'
results when its last row is done. A request larger than the budget spans several batches; a
batch holds rows of many requests. While the model thread runs one batch, the next requests are
tokenized and queued, so tokenization overlaps the model's work, and the event loop never runs the
model. A cancelled request (its client went away) drops its rows that are still queued. close()
lets the queue drain, then stops the thread.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Callable, Optional, Sequence

from fastbert.serve.runner import cost


class Job:
    """One request's rows, results and future (set on the event loop that submitted it)."""
    __slots__ = ("seqs", "results", "left", "future", "loop", "enqueued", "cancelled")

    def __init__(self, seqs: Sequence, loop: asyncio.AbstractEventLoop):
        self.seqs, self.loop = list(seqs), loop
        self.results = [None] * len(self.seqs)
        self.left = len(self.seqs)
        self.future = loop.create_future()
        self.enqueued = time.perf_counter()
        self.cancelled = False

    def _finish(self, value, error: bool):
        def settle():
            if not self.future.done():
                (self.future.set_exception if error else self.future.set_result)(value)
        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:       # the loop is closed: nobody waits any more
            pass


class Batcher:
    def __init__(self, run: Callable[[list], Sequence], padded: bool, max_batch_tokens: int = 16384,
                 max_batch_requests: Optional[int] = None, metrics=None, name: str = "fastbert-serve-model"):
        if max_batch_tokens < 1 or (max_batch_requests is not None and max_batch_requests < 1):
            raise ValueError(f"max_batch_tokens and max_batch_requests must be positive, got "
                             f"{max_batch_tokens}, {max_batch_requests}")
        self.run, self.padded = run, padded
        self.max_batch_tokens, self.max_batch_requests = max_batch_tokens, max_batch_requests
        self.metrics = metrics
        self._queue = collections.deque()          # (job, row index), oldest first
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, seqs: Sequence) -> Job:
        """Queue a request's rows; await `job.future` for their results in order. Event loop only."""
        job = Job(seqs, asyncio.get_running_loop())
        if not job.seqs:
            job.future.set_result([])
            return job
        with self._cond:
            if self._closing:
                raise RuntimeError("the server is shutting down")
            self._queue.extend((job, i) for i in range(len(job.seqs)))
            self._cond.notify()
        if self.metrics is not None:
            self.metrics.queue_size.inc(len(job.seqs))
        return job

    def cancel(self, job: Job) -> None:
        """Drop the job's rows that are still queued (the thread skips them)."""
        job.cancelled = True

    def close(self, timeout: Optional[float] = None) -> None:
        """Run what is queued, then stop the model thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _take(self) -> Optional[list]:
        """The next batch: queued rows in arrival order within the budgets; None once closed and empty."""
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            batch, lengths, dropped = [], [], 0
            while self._queue:
                job, i = self._queue[0]
                if job.cancelled:
                    self._queue.popleft()
                    dropped += 1
                    continue
                n = len(job.seqs[i].ids)
                if batch and (cost(lengths + [n], self.padded) > self.max_batch_tokens
                              or len(batch) == (self.max_batch_requests or len(batch) + 1)):
                    break
                self._queue.popleft()
                batch.append((job, i))
                lengths.append(n)
        if self.metrics is not None:
            self.metrics.queue_size.dec(len(batch) + dropped)
        return batch or (None if self._closing and not self._queue else [])

    def _work(self):
        while (batch := self._take()) is not None:
            if not batch:
                continue
            batch.sort(key=lambda entry: -len(entry[0].seqs[entry[1]].ids))
            start = time.perf_counter()
            seqs = [job.seqs[i] for job, i in batch]
            try:
                outputs = self.run(seqs)
            except Exception as exc:           # a model error fails these requests, not the server
                for job in {id(job): job for job, _ in batch}.values():
                    job.cancelled = True
                    job._finish(exc, error=True)
                continue
            if self.metrics is not None:
                m = self.metrics
                m.inference_time.observe(time.perf_counter() - start)
                m.batch_tokens.observe(cost([len(s.ids) for s in seqs], self.padded))
                m.batch_inputs.observe(len(seqs))
                for job, _ in batch:
                    m.queue_time.observe(start - job.enqueued)
            for (job, i), out in zip(batch, outputs):
                job.results[i] = out
                job.left -= 1
                if job.left == 0 and not job.cancelled:
                    job._finish(job.results, error=False)
