"""The batch runner: this replica's one task that finds batches with work left, leases
one, and runs its lines through the online endpoints.

Each line is served as an online request of the key that created the batch: the same
``Endpoint.prepare``, the same admission (``gateway.access``: limits, quotas, usage, the
key's metrics), the one service call and the same response body, with its own
``RequestRecord`` (request log line with ``endpoint`` and ``batch_id``, metrics). Batch
lines run at ``BATCH_PRIORITY``, below every client key's priority, so a backend that
orders its queue (hf) serves online requests first and sheds batch lines first; at most
``batch.max_concurrency`` lines are in flight on this replica, and none starts while
``batch.pause_when_online`` online requests are in flight.

Durability: a line is marked started before it runs and its output is stored when it
ends, under the batch's lease (``store.py``). A replica that dies mid-batch leaves its
started lines unfinished; whoever resumes the batch (itself restarted, or another
replica once the lease expired) runs them again, counts them in ``metadata``
(``llmso_reruns``) and skips every finished line. A line is charged when it finishes,
after its output is stored, so a crash never charges a line twice; its cost is the
model's price less its ``batch_discount`` (the record's ``batch_id`` says it is a line).

``BatchRunner`` owns its task, its lease id (``owner``), its slots and its count of
lines in flight; all on the app's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

import orjson

from backends.base import ApiError, GenerationRequest, InvalidRequest
from config.schema import BatchConfig
from gateway.access.admission import Admission
from gateway.access.keys import Client
from gateway.api.base import Endpoint
from gateway.batch.files import FileStore
from gateway.batch.lines import Line, parse_lines
from gateway.batch.objects import Batch, LineError, NotFound, Status, new_id
from gateway.batch.store import BatchState, LeaseLost
from gateway.errors import InternalError, Unauthorized, error_payload
from gateway.observe.ids import fresh_hex
from gateway.observe.record import RequestRecord
from gateway.registry import ModelRegistry

log = logging.getLogger(__name__)

BATCH_PRIORITY = 2
"""Below a client key's ``low`` (1): served after every online request."""

Admit = Callable[[GenerationRequest], Awaitable[GenerationRequest]]

MAX_RETRY_WAIT = 30.0
"""Longest wait before a line refused for load (429) is tried again."""


class BatchRunner:
    def __init__(
        self,
        *,
        config: BatchConfig,
        state: BatchState,
        files: FileStore,
        endpoints: Mapping[str, Endpoint],
        admission: Admission,
        registry: ModelRegistry,
    ) -> None:
        self._config = config
        self.state = state
        self.files = files
        self._endpoints = endpoints
        self._admission = admission
        self._registry = registry
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{fresh_hex(4)}"
        self._slots = asyncio.Semaphore(config.max_concurrency)
        self.inflight = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="llmso-batch-runner")

    async def stop(self) -> None:
        """Stop running; the batch in hand is released for any replica to resume."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.to_thread(self.state.close)

    async def _loop(self) -> None:
        while True:
            batch = None
            if self.state.exists():
                try:
                    batch = await self.state.claim(self.owner, self._config.lease_seconds)
                except Exception:
                    log.exception("batch: claiming failed")
            if batch is None:
                await asyncio.sleep(self._config.poll_interval)
                continue
            try:
                await self._drive(batch)
            except Exception as exc:
                if _lease_lost(exc):
                    log.warning("batch %s: lease lost to another replica", batch.id)
                    continue
                log.exception("batch %s: runner failed; retried later", batch.id)
                await asyncio.sleep(self._config.poll_interval)

    async def _drive(self, batch: Batch) -> None:
        lease = _Lease(self.state, batch.id, self.owner, self._config.lease_seconds)
        try:
            if batch.status is Status.VALIDATING:
                batch = await self._validate(batch)
            if batch.status is Status.FAILED:
                return
            lines = [] if batch.status is Status.CANCELLING else await self._lines(batch)
            if batch.status is not Status.CANCELLING and not lines:
                await self._fail(batch, "invalid_file", "the input file was deleted")
                return
            if batch.status is Status.IN_PROGRESS:
                await self._run(batch, lines, lease)
            await self._finish(batch.id, lines)
        finally:
            await lease.close()

    async def _lines(self, batch: Batch) -> list[Line]:
        """A validated batch's lines (none if its input file was deleted since)."""
        try:
            file = await self.files.get(batch.owner, batch.input_file_id)
            data = await self.files.content(file)
        except NotFound:
            return []
        return parse_lines(data, batch.endpoint, self._config.max_lines)[0]

    async def _fail(self, batch: Batch, code: str, message: str) -> None:
        error = LineError(code, message, param="input_file_id")
        failed = replace(batch, status=Status.FAILED, errors=(error,), failed_at=int(time.time()))
        await self.state.save(failed, self.owner)

    async def _validate(self, batch: Batch) -> Batch:
        now = int(time.time())
        try:
            file = await self.files.get(batch.owner, batch.input_file_id)
            data = await self.files.content(file)
        except NotFound as exc:
            errors = [LineError("invalid_file", exc.message, param="input_file_id")]
        else:
            lines, errors = parse_lines(data, batch.endpoint, self._config.max_lines)
        if errors:
            batch = replace(batch, status=Status.FAILED, errors=tuple(errors), failed_at=now)
        else:
            batch = replace(batch, status=Status.IN_PROGRESS, total=len(lines), in_progress_at=now)
        return await self.state.save(batch, self.owner)

    async def _run(self, batch: Batch, lines: list[Line], lease: _Lease) -> None:
        before = batch.reruns
        batch = await self.state.take_orphans(batch, self.owner)
        if batch.reruns > before:
            cut = batch.reruns - before
            log.warning("batch %s: %d line(s) cut short by a crash run again", batch.id, cut)
        done = await self.state.finished_lines(batch.id)
        client = self._admission.client_named(batch.owner)
        async with asyncio.TaskGroup() as group:
            for line in lines:
                if line.index in done:
                    continue
                if lease.lost:
                    raise LeaseLost(batch.id)
                await self._room()
                # Looked at once a slot is free: a cancel that came while waiting counts.
                if await self._stopping(batch):
                    self._slots.release()
                    break
                group.create_task(self._line(batch, client, line))

    async def _stopping(self, batch: Batch) -> bool:
        """Cancelled by its owner, or past its completion window."""
        current = await self.state.batch(batch.id)
        return (
            current is None
            or current.status is not Status.IN_PROGRESS
            or time.time() > batch.expires_at
        )

    async def _room(self) -> None:
        """Take a slot, then wait while online requests fill the gateway."""
        await self._slots.acquire()
        limit = self._config.pause_when_online
        # A poll: the registry's lease counts change without an event to wait on.
        while limit is not None and self._online() >= limit:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    def _online(self) -> int:
        leased = sum(model.inflight for model in self._registry.list_models())
        return max(0, leased - self.inflight)

    async def _line(self, batch: Batch, client: Client | None, line: Line) -> None:
        self.inflight += 1
        try:
            await self.state.start_line(batch.id, line.index)
            await self._serve(batch, client, line)
        finally:
            self.inflight -= 1
            self._slots.release()

    async def _serve(self, batch: Batch, client: Client | None, line: Line) -> None:
        endpoint = self._endpoints[batch.endpoint]
        while True:
            record = RequestRecord(request_id=fresh_hex(16), requested_model="")
            record.endpoint, record.batch_id = batch.endpoint, batch.id
            if client is None:
                gone = Unauthorized("The API key that created this batch is no longer configured.")
                await self._store(batch, line, record, gone.status, error_payload(gone))
                return
            ticket = self._admission.open(record, client)
            try:
                status, payload, retry_after = await _call(endpoint, line, record, ticket.admit)
                # A 429 is tried again while its Retry-After ends inside the batch's
                # window (a spent budget resetting next month fails the line now).
                again = status == 429 and time.time() + (retry_after or 0) < batch.expires_at
                if not again:
                    # Stored first, charged after: a crash between never charges twice.
                    await self._store(batch, line, record, status, payload)
            finally:
                await ticket.finish()
            if not again:
                return
            await asyncio.sleep(min(MAX_RETRY_WAIT, max(0.1, retry_after or 1.0)))

    async def _store(
        self, batch: Batch, line: Line, record: RequestRecord, status: int, payload: Any
    ) -> None:
        output = orjson.dumps(
            {
                "id": new_id("batch_req"),
                "custom_id": line.custom_id,
                "response": {
                    "status_code": status,
                    "request_id": record.request_id,
                    "body": payload,
                },
                "error": None,
            }
        )
        await self.state.finish_line(batch.id, self.owner, (line.index, status == 200, output))

    async def _finish(self, batch_id: str, lines: list[Line]) -> None:
        """Write the output and error files and end the batch: cancelled, expired or
        completed (through finalizing)."""
        batch = await self.state.batch(batch_id)
        if batch is None or batch.status is Status.FAILED:
            return
        now = int(time.time())
        errors = await self.state.outputs(batch.id, ok=False)
        if batch.status is Status.CANCELLING:
            end: dict[str, Any] = {"status": Status.CANCELLED, "cancelled_at": now}
        else:
            done = await self.state.finished_lines(batch.id)
            left = [line for line in lines if line.index not in done]
            if left:
                errors.extend(_expired(line) for line in left)
                end = {"status": Status.EXPIRED, "expired_at": now}
            else:
                batch = await self.state.save(
                    replace(batch, status=Status.FINALIZING, finalizing_at=now), self.owner
                )
                if batch.status is Status.CANCELLING:
                    end = {"status": Status.CANCELLED, "cancelled_at": now}
                else:
                    end = {"status": Status.COMPLETED, "completed_at": int(time.time())}
        outputs = await self.state.outputs(batch.id, ok=True)
        output_id = await self._file(batch, outputs, "output")
        error_id = await self._file(batch, errors, "error")
        final = replace(batch, output_file_id=output_id, error_file_id=error_id, **end)
        await self.state.save(final, self.owner)
        log.info("batch %s: %s", batch.id, final.status.value)

    async def _file(self, batch: Batch, lines: list[bytes], kind: str) -> str | None:
        if not lines:
            return None
        data = b"\n".join(lines) + b"\n"
        file = await self.files.write(
            batch.owner, f"batch_{kind}", f"{batch.id}_{kind}.jsonl", data
        )
        return file.id


async def _call(
    endpoint: Endpoint, line: Line, record: RequestRecord, admit: Admit
) -> tuple[int, Any, float | None]:
    """One line as the online endpoint serves it: ``(status, body, retry_after)``."""
    prepared = None
    try:
        prepared = await endpoint.prepare(line.body, record)
        record.requested_model = prepared.request.model
        if prepared.stream:
            raise InvalidRequest("stream is not supported in a batch", param="stream")
        request = replace(await admit(prepared.request), priority=BATCH_PRIORITY)
        answer = await prepared.presenter.open(request, record)
        return 200, orjson.loads(await prepared.presenter.body(answer)), None
    except ApiError as exc:
        if exc.param and prepared is not None and prepared.wire_param is not None:
            exc.param = prepared.wire_param(exc.param)
        record.fail("client_error" if exc.status < 500 else "server_error", exc.error_type)
        return exc.status, error_payload(exc), exc.retry_after
    except Exception:
        log.exception("batch line %s failed", line.custom_id)
        record.fail("server_error", "server_error")
        return 500, error_payload(InternalError("internal server error")), None


def _lease_lost(exc: Exception) -> bool:
    """``LeaseLost``, raised alone or by the lines of a task group."""
    if isinstance(exc, ExceptionGroup):
        rest = exc.split(LeaseLost)[1]
        return rest is None
    return isinstance(exc, LeaseLost)


def _expired(line: Line) -> bytes:
    return orjson.dumps(
        {
            "id": new_id("batch_req"),
            "custom_id": line.custom_id,
            "response": None,
            "error": {
                "code": "batch_expired",
                "message": "This request could not be executed before the completion "
                "window expired.",
            },
        }
    )


class _Lease:
    """Renews a batch's lease every third of its length while the batch runs;
    ``lost`` once a renewal found another owner. Released at the end."""

    def __init__(self, state: BatchState, batch_id: str, owner: str, seconds: float) -> None:
        self._state, self._batch_id, self._owner = state, batch_id, owner
        self._seconds = seconds
        self.lost = False
        self._task = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._seconds / 3)
            try:
                held = await self._state.renew(self._batch_id, self._owner, self._seconds)
            except Exception:
                log.exception("batch %s: lease renewal failed", self._batch_id)
                continue
            if not held:
                self.lost = True
                return

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        with contextlib.suppress(Exception):
            await self._state.release(self._batch_id, self._owner)
