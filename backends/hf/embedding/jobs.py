"""``JobThread``: the engine thread of a pooling model, batching every waiting job.

Ownership: the thread owns the model and tokenizer a subclass computes with; the event
loop owns the object. Work crosses into the thread through one bounded inbox of jobs
(full: ``Overloaded``, a 429); each job carries a ``concurrent.futures.Future`` that the
thread resolves, so results and errors come back without a callback protocol.
Cancelling the awaiting task cancels that future, and the thread skips a cancelled job
that has not started (``set_running_or_notify_cancel``). The thread takes every job
waiting in the inbox at once and hands them to ``compute`` together, so concurrent
requests share forwards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from backends.base import BackendError, Overloaded, UpstreamTimeout

log = logging.getLogger(__name__)

ResultT = TypeVar("ResultT")


@dataclass(slots=True)
class Job(Generic[ResultT]):
    """One request's work; ``queued_at`` is ``time.time()`` when it was submitted."""

    queued_at: float
    future: concurrent.futures.Future[ResultT] = field(default_factory=concurrent.futures.Future)


JobT = TypeVar("JobT", bound="Job[Any]")


class JobThread(ABC, Generic[JobT, ResultT]):
    """See the module docstring. A subclass implements ``compute``."""

    def __init__(self, *, name: str, max_queue: int, threads: int) -> None:
        self._threads = threads
        self.inbox: queue.Queue[JobT | None] = queue.Queue(maxsize=max_queue)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    @abstractmethod
    def compute(self, jobs: list[JobT], started: float) -> list[ResultT]:
        """One result per job, in order (engine thread); ``started`` is ``time.time()``
        when the batch began. May raise: every job of the batch then fails."""

    def start(self) -> None:
        self.thread.start()

    def request_stop(self) -> None:
        # The stop marker may wait for room; the thread drains the inbox meanwhile.
        threading.Thread(target=self.inbox.put, args=(None,), daemon=True).start()

    async def run(self, job: JobT, limit_s: float, what: str) -> ResultT:
        """Queue ``job`` and await its result (event loop): ``Overloaded`` when the inbox
        is full, ``UpstreamTimeout`` after ``limit_s`` seconds (the job is cancelled)."""
        try:
            self.inbox.put_nowait(job)
        except queue.Full:
            raise Overloaded(f"too many {what} requests waiting for this model") from None
        try:
            async with asyncio.timeout(limit_s):
                return await asyncio.wrap_future(job.future)
        except TimeoutError:
            job.future.cancel()
            raise UpstreamTimeout(f"{what} took longer than {limit_s:g}s") from None

    def _run(self) -> None:
        import torch

        torch.set_num_threads(self._threads)
        while True:
            first = self.inbox.get()
            jobs = [first] if first is not None else []
            stopping = first is None
            while not stopping:
                try:
                    more = self.inbox.get_nowait()
                except queue.Empty:
                    break
                stopping = more is None
                if more is not None:
                    jobs.append(more)
            live = [job for job in jobs if job.future.set_running_or_notify_cancel()]
            if live:
                self._serve(live)
            if stopping:
                return

    def _serve(self, jobs: list[JobT]) -> None:
        try:
            results = self.compute(jobs, time.time())
        except Exception as exc:  # one bad batch must not kill the thread
            log.exception("%s batch failed", self.thread.name)
            error = exc if isinstance(exc, BackendError) else BackendError(f"batch failed: {exc}")
            for job in jobs:
                job.future.set_exception(error)
            return
        for job, result in zip(jobs, results, strict=True):
            job.future.set_result(result)
