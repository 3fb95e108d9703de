"""``BackendContract``: the checks every ``Backend`` must pass, whatever serves the model.

A backend's test module subclasses it (``class TestXContract(BackendContract)``) next to
the module-scoped server or model it already has, and provides three fixtures:

- ``backend``: a started backend the checks share (they leave it as they found it);
- ``unstarted``: one built but never started (cheap: nothing may load);
- ``spare``: a started backend with a small bounded queue, class-scoped; the overload
  check floods it and the last check stops it.

and overrides ``invalid_request`` (a request this backend refuses as invalid) and
``aborted`` (a counter of work the backend or its engine abandoned). The checks are
the contract of ``backends/base.py``: event order with zero or one ``Started``; admission
failures (invalid, not ready, overloaded) raised before ``Started``, so the service can
still answer a real HTTP status and fall back; ``n``, ``length`` and stop strings;
closing a stream early aborts its work; ``stop()`` ends open streams with
``BackendCrashed``; ``info()`` and ``ready()``; and, for a backend whose ``info()``
declares them and whose test double can honour them (``structured = True``), structured
output (``json_schema``: the text parses and validates) and forced tool calls (``required``:
a ``ToolCallDelta`` stream naming the tool, arguments that validate, ``tool_calls`` reason);
the reasoning tier (``reasoning_suite.ReasoningContract``: a thought apart from the
answer where the backend declares one, controls served or refused by capability).
Scoring and tokenizing are served or refused by the same declaration: a backend that
declares ``Feature.SCORE`` / ``Feature.TOKENIZE`` implements the method, one that does not
is refused with a 400 naming ``model``; a real tokenizer (``tokenizes = True``) also
round-trips the prompt and renders a chat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import jsonschema
import orjson
import pytest

from backends.base import (
    Backend,
    BackendCrashed,
    BackendEvent,
    ChatMessage,
    Feature,
    GenerationRequest,
    InvalidRequest,
    ModelInfo,
    NotReady,
    Overloaded,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    Started,
    TextDelta,
    ToolChoice,
    ToolSpec,
    UnsupportedFeature,
)
from backends.tokenizing import DetokenizeRequest, TokenizeRequest
from gateway.service.capabilities import require_scorer, require_tokenizer
from tests.contract.events import collect
from tests.contract.reasoning_suite import ReasoningContract

WAIT_S = 30.0  # generous: the test machine is shared and often loaded


async def wait_for(predicate: Callable[[], bool], within: float = WAIT_S) -> bool:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


class BackendContract(ReasoningContract):
    """See the module docstring. Class attributes tune the checks to a backend."""

    model = "contract"
    prompt = "Count from one to twenty in words, separated by commas."
    short_tokens = 8
    long_tokens = 300
    choices = 2
    """``n`` the backend serves; 1 means ``n > 1`` must be refused (``param="n"``)."""
    flood = 5
    """How many long requests opened at once overflow ``spare``."""
    min_refused = 1
    structured = False
    """Whether the backend under test honours the structured features it declares (a
    real engine); a test double that only relays them (a fake upstream) leaves it off."""
    tokenizes = False
    """Whether a declared ``Feature.TOKENIZE`` has a real tokenizer behind it here (an
    engine; a fake upstream without /tokenize leaves it off)."""
    city_schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }

    def request(self, max_tokens: int, **sampling: Any) -> GenerationRequest:
        """A greedy chat request with ``prompt``."""
        return GenerationRequest(
            request_id=f"contract-{time.monotonic_ns()}",
            model=self.model,
            kind=RequestKind.CHAT,
            sampling=SamplingParams(max_tokens=max_tokens, **{"temperature": 0.0, **sampling}),
            messages=(ChatMessage("user", self.prompt),),
            arrival_time=time.time(),
        )

    def long_request(self) -> GenerationRequest:
        return self.request(self.long_tokens, ignore_eos=True)

    def invalid_request(self) -> GenerationRequest:
        raise NotImplementedError

    async def aborted(self, backend: Backend) -> float:
        """A counter that grows when ``backend`` abandons a request's work."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the checks

    async def test_events_in_contract_order(self, backend: Backend) -> None:
        result = await collect(backend.generate(self.request(self.short_tokens)))
        assert sum(isinstance(e, Started) for e in result.events) <= 1
        assert result.text() and result.reason() in ("stop", "length")
        assert 0 < result.usage.completion_tokens <= self.short_tokens
        assert result.usage.prompt_tokens > 0

    async def test_length_ends_at_max_tokens(self, backend: Backend) -> None:
        result = await collect(backend.generate(self.request(3, ignore_eos=True)))
        assert result.reason() == "length"
        assert result.usage.completion_tokens == 3

    async def test_n_choices(self, backend: Backend) -> None:
        request = self.request(self.short_tokens, n=2)
        if self.choices < 2:
            with pytest.raises(InvalidRequest) as caught:
                await anext(aiter(backend.generate(request)))
            assert caught.value.param == "n"
            return
        result = await collect(backend.generate(request))
        assert all(result.text(i) for i in range(2))
        assert {result.reason(i) for i in range(2)} <= {"stop", "length"}

    async def test_stop_string_cuts_the_text(self, backend: Backend) -> None:
        whole = await collect(backend.generate(self.request(self.short_tokens)))
        pieces = [e.text for e in whole.events if isinstance(e, TextDelta) and e.text.strip()]
        assert len(pieces) >= 3, pieces
        stop = pieces[len(pieces) // 2]
        text = whole.text()
        cut = await collect(backend.generate(self.request(self.short_tokens, stop=(stop,))))
        assert cut.text() == text[: text.index(stop)]
        assert cut.reason() == "stop"

    def _declared(self, backend: Backend, feature: Feature) -> None:
        if not self.structured:
            pytest.skip("this backend's test double relays structured features unchecked")
        if feature not in backend.info().features:
            pytest.skip(f"the backend does not declare {feature.value}")

    async def test_declared_json_schema_is_honoured(self, backend: Backend) -> None:
        self._declared(backend, Feature.JSON_SCHEMA)
        schema = self.city_schema
        request = replace(
            self.request(64),
            messages=(ChatMessage("user", "Name a big city and its population as JSON."),),
            response_format=ResponseFormat("json_schema", name="city", schema=schema),
        )
        result = await collect(backend.generate(request))
        assert result.reason() == "stop", result.text()
        jsonschema.validate(orjson.loads(result.text()), self.city_schema)

    async def test_declared_tools_force_a_valid_call(self, backend: Backend) -> None:
        self._declared(backend, Feature.TOOLS)
        tool = ToolSpec("get_city", "Look a city up.", self.city_schema)
        request = replace(
            self.request(96),
            messages=(ChatMessage("user", "Look up Paris."),),
            tools=(tool,),
            tool_choice=ToolChoice("required"),
        )
        result = await collect(backend.generate(request))
        calls = result.calls()
        assert calls and result.reason() == "tool_calls", result.events
        for name, arguments in calls:
            assert name == "get_city"
            jsonschema.validate(orjson.loads(arguments), self.city_schema)

    async def test_score_and_tokenize_served_or_refused_by_declaration(
        self, backend: Backend
    ) -> None:
        info = backend.info()
        for feature, require in (
            (Feature.SCORE, require_scorer),
            (Feature.TOKENIZE, require_tokenizer),
        ):
            if feature in info.features:
                require(backend, self.model, info)  # declared: the method is there
                continue
            with pytest.raises(UnsupportedFeature) as caught:
                require(backend, self.model, info)
            assert caught.value.param == "model"

    async def test_declared_tokenizer_round_trips(self, backend: Backend) -> None:
        if Feature.TOKENIZE not in backend.info().features or not self.tokenizes:
            pytest.skip("no tokenizer declared, or none real behind this test double")
        tokenizer = require_tokenizer(backend, self.model, backend.info())
        plain = await tokenizer.tokenize(
            TokenizeRequest("contract", self.model, prompt=self.prompt, add_special_tokens=False)
        )
        assert plain.tokens and plain.max_model_len > 0
        text = await tokenizer.detokenize(DetokenizeRequest("contract", self.model, plain.tokens))
        assert text.strip() == self.prompt
        chat = await tokenizer.tokenize(
            TokenizeRequest(
                "contract",
                self.model,
                messages=(ChatMessage("user", self.prompt),),
                add_special_tokens=False,
                return_token_strs=True,
            )
        )
        assert len(chat.tokens) > len(plain.tokens)  # the template's turn markers
        assert chat.token_strs is not None and len(chat.token_strs) == len(chat.tokens)

    async def test_invalid_request_is_refused_before_started(self, backend: Backend) -> None:
        with pytest.raises(InvalidRequest):
            await anext(aiter(backend.generate(self.invalid_request())))
        assert await backend.ready()  # a bad request does not hurt the backend

    async def test_not_ready_before_start(self, unstarted: Backend) -> None:
        assert not await unstarted.ready()
        assert isinstance(unstarted.info(), ModelInfo)
        with pytest.raises(NotReady):
            await anext(aiter(unstarted.generate(self.request(self.short_tokens))))

    async def test_info_and_ready(self, backend: Backend) -> None:
        assert await backend.ready()
        info = backend.info()
        assert isinstance(info, ModelInfo)
        assert Feature.CHAT in info.features
        assert info.max_context is None or info.max_context > 0

    async def test_aclose_aborts_the_work(self, backend: Backend) -> None:
        before = await self.aborted(backend)
        stream = backend.generate(self.long_request())
        async for event in stream:
            if isinstance(event, TextDelta):
                break
        await stream.aclose()  # type: ignore[attr-defined]
        deadline = time.monotonic() + WAIT_S
        now = await self.aborted(backend)
        while now <= before:
            assert time.monotonic() < deadline, f"no abort seen: {before} -> {now}"
            await asyncio.sleep(0.1)
            now = await self.aborted(backend)

    async def test_overload_is_refused_before_started(self, spare: Backend) -> None:
        streams = [spare.generate(self.long_request()) for _ in range(self.flood)]
        firsts = [asyncio.ensure_future(_first(stream)) for stream in streams]

        def refused() -> int:
            return sum(
                t.done() and isinstance(t.exception(), Overloaded)
                for t in firsts
                if not t.cancelled()
            )

        try:
            await wait_for(lambda: refused() >= self.min_refused)
            await asyncio.sleep(0.2)  # let the admitted ones show their first event
            assert refused() >= self.min_refused, [t.done() for t in firsts]
            for task in firsts:
                if task.done() and task.exception() is None:
                    assert isinstance(task.result(), Started | TextDelta)
                elif task.done():
                    assert isinstance(task.exception(), Overloaded), repr(task.exception())
        finally:
            for task in firsts:
                task.cancel()
            await asyncio.gather(*firsts, return_exceptions=True)
            for stream in streams:
                await stream.aclose()  # type: ignore[attr-defined]
            await _until_admitted(spare, self.request(1))

    async def test_stop_ends_open_streams(self, spare: Backend) -> None:
        """Runs last in the class: ``spare`` is stopped afterwards."""
        stream = spare.generate(self.long_request())
        first = await asyncio.wait_for(anext(aiter(stream)), WAIT_S)
        assert isinstance(first, Started | TextDelta)
        await spare.stop()
        with pytest.raises(BackendCrashed):
            async for _ in stream:
                pass
        assert not await spare.ready()


async def _first(stream: AsyncIterator[BackendEvent]) -> BackendEvent:
    return await anext(aiter(stream))


async def _until_admitted(backend: Backend, request: GenerationRequest) -> None:
    """Wait until ``backend`` takes work again: a remote queue (Triton's) still holds the
    flood's cancelled requests for a while after the streams closed."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            await collect(backend.generate(request))
            return
        except Overloaded:
            assert time.monotonic() < deadline, "the backend never took work again"
            await asyncio.sleep(0.2)
