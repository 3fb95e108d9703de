"""The worker wire format: frames and error round trips (no processes)."""

from __future__ import annotations

import asyncio
import struct

import pytest

from backends import base, errors
from backends.base import SamplingParams, TextDelta, Usage
from backends.process import protocol as p


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_frames_round_trip_in_order() -> None:
    first = [(p.EVENT, 1, TextDelta(index=0, text="hi")), (p.END, 1)]
    second = [(p.OBSERVE, "on_step", (2, 2, 0.01)), (p.EVENT, 2, Usage(3, 4))]
    reader = _reader(p.encode_frame(first) + p.encode_frame(second))
    assert await p.read_frame(reader) == first
    assert await p.read_frame(reader) == second
    assert await p.read_frame(reader) is None


async def test_sampling_params_survive_a_frame() -> None:
    params = SamplingParams(max_tokens=3, temperature=0.0, stop=("x",), seed=7)
    [(tag, value)] = await p.read_frame(_reader(p.encode_frame([("t", params)]))) or []
    assert (tag, value) == ("t", params)


async def test_truncated_frame_is_a_protocol_error() -> None:
    data = p.encode_frame([(p.END, 1)])
    with pytest.raises(p.ProtocolError):
        await p.read_frame(_reader(data[:-1]))
    with pytest.raises(p.ProtocolError):
        await p.read_frame(_reader(data[:2]))


async def test_oversized_and_malformed_frames_are_rejected() -> None:
    with pytest.raises(p.ProtocolError, match="exceeds"):
        await p.read_frame(_reader(struct.pack(">I", p.MAX_FRAME_BYTES + 1)))
    with pytest.raises(p.ProtocolError, match="undecodable"):
        await p.read_frame(_reader(struct.pack(">I", 3) + b"abc"))
    with pytest.raises(p.ProtocolError, match="tagged tuples"):
        await p.read_frame(_reader(p.encode_frame([("ok",), 5])))  # type: ignore[list-item]


@pytest.mark.parametrize(
    "error",
    [
        base.InvalidRequest("bad temperature", param="temperature"),
        base.ContextLengthExceeded("too long", param="messages"),
        base.Overloaded("queue full", retry_after=2.5),
        base.NotReady("loading", retry_after=9.0),
        base.UpstreamRejected("nope", status=422, param="top_k", code="unsupported"),
        base.BackendCrashed("engine died"),
        base.BackendError("plain"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_keep_class_and_fields(error: base.BackendError) -> None:
    back = p.decode_error(p.encode_error(error))
    assert type(back) is type(error)
    assert (str(back), back.message, back.param) == (str(error), error.message, error.param)
    assert (back.status, back.code, back.error_type) == (error.status, error.code, error.error_type)
    assert getattr(back, "retry_after", None) == getattr(error, "retry_after", None)


def _instances(cls: type[base.BackendError]) -> list[base.BackendError]:
    """``cls`` with its defaults, and with every field set to something unusual."""
    if cls is errors.UpstreamRejected:
        return [
            errors.UpstreamRejected("nope", status=422),
            errors.UpstreamRejected("no", status=409, param="n", code="c", retry_after=4.0),
        ]
    odd = cls("odd", param="top_k", code="odd_code", retry_after=2.5, status=418)
    return [cls("plain"), odd]


@pytest.mark.parametrize("cls", errors.BACKEND_ERRORS, ids=lambda c: c.__name__)
def test_every_backend_error_round_trips(cls: type[base.BackendError]) -> None:
    for error in _instances(cls):
        back = p.decode_error(p.encode_error(error))
        assert type(back) is cls
        assert (str(back), back.message) == (str(error), error.message)
        assert back.fields() == error.fields() and back.error_type == error.error_type


def test_every_backend_error_class_is_listed_for_the_wire() -> None:
    defined = {
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, base.BackendError)
    }
    assert defined == set(errors.BACKEND_ERRORS)


def test_an_unlisted_subclass_travels_as_its_listed_base() -> None:
    class Mine(base.Overloaded):
        code = "mine"

    back = p.decode_error(p.encode_error(Mine("busy", retry_after=3.0)))
    assert type(back) is base.Overloaded
    assert (back.code, back.retry_after, back.status) == ("mine", 3.0, 429)


def test_non_backend_errors_become_backend_errors() -> None:
    back = p.decode_error(p.encode_error(ZeroDivisionError("division by zero")))
    assert type(back) is base.BackendError
    assert back.status == 500
    assert back.message == "worker error: ZeroDivisionError: division by zero"


def test_unknown_names_fall_back_to_backend_error() -> None:
    fields = {"message": "m", "param": "x", "status": 418, "code": "teapot", "retry_after": None}
    for name in ["PathLike", "NoSuchError", "ModelInfo", "ApiError"]:
        back = p.decode_error(p.ErrorPayload(name=name, **fields))  # type: ignore[arg-type]
        assert type(back) is base.BackendError
        assert (back.message, back.param, back.status, back.code) == ("m", "x", 418, "teapot")


@pytest.mark.parametrize(
    "event",
    [
        base.Started(queued_at=1.5, started_at=2.25),
        TextDelta(index=1, text=" héllo", num_tokens=2),
        TextDelta(
            index=0,
            text="a",
            logprobs=(
                base.TokenLogprob(
                    "a",
                    -0.1,
                    (97,),
                    top=(base.TopLogprob("a", -0.1, (97,)), base.TopLogprob("b", -2.0, (98,))),
                ),
            ),
        ),
        base.Finished(index=2, reason="length"),
        base.Finished(index=1, reason="stop", stop_sequence="END"),
        base.ToolCallDelta(index=0, call_index=1, id="call_x", name="f", arguments_fragment="{"),
        base.Finished(index=0, reason="tool_calls"),
        Usage(prompt_tokens=5, completion_tokens=7, upstream_seconds=0.5),
        base.ReasoningDelta(index=1, text="hm, \u00e9", num_tokens=3),
        Usage(prompt_tokens=5, completion_tokens=7, reasoning_tokens=4),
        Usage(prompt_tokens=9, completion_tokens=2, cached_tokens=8),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_events_round_trip_through_a_frame(event: base.BackendEvent) -> None:
    [(_, _, fields)] = (
        await p.read_frame(_reader(p.encode_frame([(p.EVENT, 1, p.encode_event(event))]))) or []
    )
    assert p.decode_event(fields) == event


def test_unknown_event_kinds_are_rejected() -> None:
    with pytest.raises(p.ProtocolError):
        p.decode_event((99,))
    with pytest.raises(TypeError):
        p.encode_event("text")  # type: ignore[arg-type]


def test_every_observer_call_crosses_to_the_gateway() -> None:
    """A worker's engine reports through ``RelayObserver``: each ``WorkerObserver``
    method is forwarded as an OBSERVE item the gateway accepts (``OBSERVER_METHODS``),
    so no worker metric is lost behind process isolation."""
    from backends.hop_metrics import WorkerObserver
    from backends.process.worker import RelayObserver

    class Outbox:
        def __init__(self) -> None:
            self.items: list[tuple[object, ...]] = []

        def put_threadsafe(self, item: tuple[object, ...]) -> None:
            self.items.append(item)

    methods = {name for name in vars(WorkerObserver) if name.startswith("on_")}
    assert methods == p.OBSERVER_METHODS
    outbox = Outbox()
    relay = RelayObserver(outbox)  # type: ignore[arg-type]
    args = {"on_step": (2, 3, 0.01), "on_load": (1, 0, 0.5), "on_prefix_cache": (10, 8)}
    for name in sorted(methods):
        getattr(relay, name)(*args.get(name, ()))
    assert outbox.items == [(p.OBSERVE, name, args.get(name, ())) for name in sorted(methods)]
