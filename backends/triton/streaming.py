"""Read one Triton stream call: decoded chunks until the final one, with the
first-token and total deadlines applied and gRPC failures mapped (``errors``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import grpc

from backends.base import BackendCrashed, UpstreamTimeout
from backends.triton import contract
from backends.triton.errors import map_rpc_error, map_stream_error
from config.schema import TritonModelConfig


async def read_chunks(
    call: Any,
    sent: float,
    url: str,
    *,
    cfg: TritonModelConfig,
    ttft: Any,
    stopped: Callable[[], bool],
) -> AsyncGenerator[contract.Chunk, None]:
    """Decoded responses until Triton's final one (or the stream ends), with the
    first-token and total deadlines applied and gRPC failures mapped."""
    deadline = sent + cfg.total_timeout
    first = True
    iterator = call.__aiter__()
    while True:
        remaining = deadline - time.monotonic()
        wait = min(cfg.first_token_timeout, remaining) if first else remaining
        try:
            result, error = await asyncio.wait_for(anext(iterator), timeout=max(wait, 0.0))
        except StopAsyncIteration:
            return
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if stopped() and task is not None and not task.cancelling():
                # stop() cancelled the call, not our caller: the stream ends crashed
                raise BackendCrashed("the Triton backend was stopped") from None
            raise
        except TimeoutError as exc:
            what = "first token" if first else "end of stream"
            raise UpstreamTimeout(
                f"Triton model {cfg.triton_model!r}: no {what} within {wait:.1f}s"
            ) from exc
        except grpc.aio.AioRpcError as exc:
            raise map_rpc_error(exc, url) from exc
        if error is not None:
            raise map_stream_error(str(error), cfg.triton_model)
        chunk = contract.parse_result(result)
        if first:
            ttft.observe(time.monotonic() - sent)
            first = False
        yield chunk
        if chunk.final:
            return
