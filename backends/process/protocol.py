"""The wire between a ``ProcessBackend`` and its worker: frames, messages, errors.

A frame is a 4-byte big-endian length followed by a pickled ``list`` of messages, so
a writer that finds several messages ready sends them in one frame (one syscall, one
wake-up of the reader). Pickle is safe here: both ends are our own code, connected by
a private ``socketpair`` that no other process can reach.

Messages are tuples whose first item is a tag:

parent -> worker
    ``(INIT, config, factory_spec)``  first message; build and start the engine
    ``(GENERATE, key, request)``      start one request; ``key`` is a parent-chosen int
    ``(ASK, key, method, request)``   one whole call (``method`` in ``ASKS``: ``embed``,
                                      ``score``, ``tokenize``, ``detokenize``) with its
                                      request; ``key`` as for GENERATE
    ``(CANCEL, key)``                 the client left: abort the request (or call)
    ``(CALL, call_id, name, arg)``    a small RPC (``name`` in ``CALLS``)
    ``(STOP,)``                       stop the engine and exit

worker -> parent
    ``(READY, info, pid)``            the engine started; ``info`` is its ``ModelInfo``
    ``(LOAD_ERROR, message)``         the engine failed to start; the worker exits
    ``(EVENT, key, fields)``          one ``BackendEvent`` of request ``key``, as a tuple
    ``(END, key)``                    request ``key`` finished normally
    ``(ANSWER, key, result)``         what call ``key``'s method returned
    ``(ERROR, key, ErrorPayload)``    request or call ``key`` failed with a ``BackendError``
    ``(REPLY, call_id, value)``       answer to a ``CALL`` (an ``ErrorPayload`` when it raised)
    ``(OBSERVE, method, args)``       one ``WorkerObserver`` call to replay in the parent
    ``(CRASHED, reason)``             the engine died on its own; the worker exits next
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from dataclasses import dataclass
from typing import Any

from backends.base import (
    BackendEvent,
    Finished,
    PromptLogprobs,
    ReasoningDelta,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)
from backends.errors import BACKEND_ERRORS, BackendError

INIT = "init"
GENERATE = "gen"
ASK = "ask"
CANCEL = "cancel"
CALL = "call"
STOP = "stop"
READY = "ready"
LOAD_ERROR = "load_error"
EVENT = "ev"
END = "end"
ANSWER = "answer"
ERROR = "err"
REPLY = "reply"
OBSERVE = "obs"
CRASHED = "crashed"

CALLS = frozenset({"ready", "add_adapter", "remove_adapter"})
ASKS = frozenset({"embed", "score", "tokenize", "detokenize"})
"""Backend methods a worker answers with one value: ``Embedder``, ``Scorer`` and
``TextTokenizer`` calls; each request and result pickles as it is (one per call)."""
OBSERVER_METHODS = frozenset(
    {
        "on_step",
        "on_load",
        "on_abort",
        "on_preempt",
        "on_prefix_cache",
        "on_step_error",
        "on_newcomer_step",
    }
)

Message = tuple[Any, ...]

_HEADER = struct.Struct(">I")
# A frame carries at most a batch of token events; anything near this is a bug.
MAX_FRAME_BYTES = 256 * 1024 * 1024


class ProtocolError(Exception):
    """The other end sent something that is not a valid frame."""


def encode_frame(messages: list[Message]) -> bytes:
    payload = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> list[Message] | None:
    """The next batch of messages, or ``None`` at a clean end of stream.

    Raises ``ProtocolError`` on a truncated or malformed frame.
    """
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ProtocolError("connection closed inside a frame header") from exc
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        payload = await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise ProtocolError("connection closed inside a frame") from exc
    try:
        messages = pickle.loads(payload)
    except Exception as exc:
        raise ProtocolError(f"undecodable frame: {exc!r}") from exc
    if not isinstance(messages, list) or not all(
        isinstance(m, tuple) and m and isinstance(m[0], str) for m in messages
    ):
        raise ProtocolError("frame is not a list of tagged tuples")
    return messages


# --------------------------------------------------------------------------- events
#
# Events travel as plain tuples: pickling a slotted frozen dataclass costs ~13 us to
# dump and ~14 us to load (per-instance __getstate__/__setstate__ in Python), a tuple
# well under 1 us; at one event per token that is the whole relay budget.

_STARTED, _DELTA, _FINISHED, _USAGE, _TOOL, _PROMPT, _THOUGHT = range(7)


def encode_event(event: BackendEvent) -> tuple[Any, ...]:
    if isinstance(event, TextDelta):
        logprobs = tuple(
            (lp.token, lp.logprob, lp.bytes, tuple((t.token, t.logprob, t.bytes) for t in lp.top))
            for lp in event.logprobs
        )
        return (_DELTA, event.index, event.text, logprobs, event.num_tokens)
    if isinstance(event, ReasoningDelta):
        return (_THOUGHT, event.index, event.text, event.num_tokens)
    if isinstance(event, Started):
        return (_STARTED, event.queued_at, event.started_at)
    if isinstance(event, Finished):
        return (_FINISHED, event.index, event.reason, event.closed_by_budget, event.stop_sequence)
    if isinstance(event, Usage):
        return (
            _USAGE,
            event.prompt_tokens,
            event.completion_tokens,
            event.upstream_seconds,
            event.reasoning_tokens,
            event.cached_tokens,
        )
    if isinstance(event, PromptLogprobs):  # once per request: pickled as it is
        return (_PROMPT, event)
    if isinstance(event, ToolCallDelta):
        return (
            _TOOL,
            event.index,
            event.call_index,
            event.id,
            event.name,
            event.arguments_fragment,
            event.num_tokens,
        )
    raise TypeError(f"not a BackendEvent: {event!r}")


def decode_event(fields: tuple[Any, ...]) -> BackendEvent:
    kind = fields[0]
    if kind == _DELTA:
        _, index, text, logprobs, num_tokens = fields
        return TextDelta(
            index,
            text,
            tuple(
                TokenLogprob(token, logprob, raw, tuple(TopLogprob(*t) for t in top))
                for token, logprob, raw, top in logprobs
            ),
            num_tokens,
        )
    if kind == _THOUGHT:
        return ReasoningDelta(fields[1], fields[2], fields[3])
    if kind == _STARTED:
        return Started(fields[1], fields[2])
    if kind == _FINISHED:
        return Finished(fields[1], fields[2], fields[3], fields[4])
    if kind == _USAGE:
        return Usage(
            fields[1], fields[2], fields[3], reasoning_tokens=fields[4], cached_tokens=fields[5]
        )
    if kind == _TOOL:
        return ToolCallDelta(*fields[1:])
    if kind == _PROMPT and isinstance(fields[1], PromptLogprobs):
        return fields[1]
    raise ProtocolError(f"unknown event kind {kind!r}")


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True, slots=True)
class ErrorPayload:
    """A ``BackendError`` flattened so the parent can raise the same class again.

    ``name`` is the nearest class in ``BACKEND_ERRORS`` (a backend's own subclass travels
    as its listed base); the fields are the ones every error constructor takes, so the
    parent rebuilds the error by calling its class, never by importing a named module.
    """

    name: str
    message: str
    param: str | None
    status: int
    code: str | None
    retry_after: float | None


_ERRORS_BY_NAME: dict[str, type[BackendError]] = {cls.__name__: cls for cls in BACKEND_ERRORS}


def encode_error(exc: BaseException) -> ErrorPayload:
    """Flatten ``exc``; anything that is not a ``BackendError`` becomes a plain one."""
    if not isinstance(exc, BackendError):
        exc = BackendError(f"worker error: {type(exc).__name__}: {exc}")
    known = next(cls for cls in type(exc).__mro__ if cls in BACKEND_ERRORS)
    return ErrorPayload(name=known.__name__, message=exc.message, **exc.fields())


def decode_error(payload: ErrorPayload) -> BackendError:
    """The error ``payload`` describes: same class (``BackendError`` for a name this
    side does not list), message, param, status, code and retry_after."""
    cls = _ERRORS_BY_NAME.get(payload.name, BackendError)
    return cls(
        payload.message,
        param=payload.param,
        status=payload.status,
        code=payload.code,
        retry_after=payload.retry_after,
    )
