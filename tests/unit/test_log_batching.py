"""``BatchingStreamHandler``: request lines leave in batches, everything else at once, in
order, and nothing pending is lost on flush."""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Iterator

import pytest

from gateway.observe.logs import REQUEST_LOGGER, BatchingStreamHandler, JsonFormatter

Logged = tuple[io.StringIO, logging.Logger, logging.Logger]


@pytest.fixture
def logged() -> Iterator[Logged]:
    stream = io.StringIO()
    handler = BatchingStreamHandler(stream, flush_after=0.02)
    handler.setFormatter(JsonFormatter())
    requests, other = logging.getLogger(REQUEST_LOGGER), logging.getLogger("llmso.test.other")
    for logger in (requests, other):
        logger.handlers[:] = [handler]
        logger.propagate = False
        logger.setLevel(logging.INFO)
    yield stream, requests, other
    for logger in (requests, other):
        logger.handlers[:] = []
        logger.propagate = True


async def test_request_lines_wait_for_the_flush_window(logged: Logged) -> None:
    stream, requests, _ = logged
    requests.info('{"n": 1}')
    requests.info('{"n": 2}')
    assert stream.getvalue() == ""
    await asyncio.sleep(0.1)
    assert stream.getvalue() == '{"n": 1}\n{"n": 2}\n'


async def test_another_record_flushes_what_is_pending_first(logged: Logged) -> None:
    stream, requests, other = logged
    requests.info('{"n": 1}')
    other.warning("boom")
    lines = stream.getvalue().splitlines()
    assert lines[0] == '{"n": 1}'
    assert '"message":"boom"' in lines[1]
    await asyncio.sleep(0.05)  # the armed timer finds nothing left: no duplicate
    assert len(stream.getvalue().splitlines()) == 2


def test_without_an_event_loop_a_request_line_is_written_at_once(logged: Logged) -> None:
    stream, requests, _ = logged
    requests.info('{"n": 1}')
    assert stream.getvalue() == '{"n": 1}\n'


async def test_flush_writes_pending_lines(logged: Logged) -> None:
    stream, requests, _ = logged
    requests.info('{"n": 1}')
    requests.handlers[0].flush()  # what logging.shutdown does at exit
    assert stream.getvalue() == '{"n": 1}\n'


def test_a_flush_lost_with_its_closed_loop_is_armed_again(logged: Logged) -> None:
    stream, requests, _ = logged

    async def log_and_leave() -> None:
        requests.info('{"n": 1}')

    async def log_and_wait() -> None:
        requests.info('{"n": 2}')
        await asyncio.sleep(0.1)

    asyncio.run(log_and_leave())  # the loop closes before its flush is due
    assert stream.getvalue() == ""
    asyncio.run(log_and_wait())
    assert stream.getvalue() == '{"n": 1}\n{"n": 2}\n'
