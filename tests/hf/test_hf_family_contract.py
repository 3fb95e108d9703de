"""The backend contract (``tests/contract/backend_suite.py``) on a family of each path:
a tiny Gemma 3 on the packed runner, a tiny GPT-NeoX on the generic one. ``n``, stop
strings, cancellation, overload, JSON-schema and forced tool calls (constrained
decoding) work the same whichever runner computes the step.

Random weights never end a JSON string on their own, so the two structured checks are
replaced by what the grammar alone decides: the object's opening and the forced call's
name, over a budget that ends mid-string."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from backends.base import (
    Backend,
    ChatMessage,
    ResponseFormat,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
)
from backends.hf.backend import HFBackend
from tests.hf import tiny
from tests.hf.engine_contract import EngineContract
from tests.hf.helpers import RecordingObserver, collect, config


class _FamilyContract(EngineContract):
    family = ""

    @pytest.fixture(scope="class")
    def folder(self, tmp_path_factory: pytest.TempPathFactory) -> Path:
        # room for the tool-calling system prompt, ~500 tokens of this tokenizer
        folder = tmp_path_factory.mktemp(self.family)
        return tiny.build(self.family, folder, max_position_embeddings=2048)

    @pytest.fixture(scope="class")
    def observer(self) -> RecordingObserver:
        return RecordingObserver()

    @pytest.fixture(scope="class")
    async def backend(self, folder: Path, observer: RecordingObserver) -> AsyncIterator[HFBackend]:
        b = HFBackend(config(source=str(folder), max_num_seqs=8), observer)
        await b.start()
        yield b
        await b.stop()

    @pytest.fixture
    def unstarted(self, folder: Path) -> HFBackend:
        return HFBackend(config(source=str(folder)))

    @pytest.fixture(scope="class")
    async def spare(self, folder: Path) -> AsyncIterator[HFBackend]:
        spare = HFBackend(config(source=str(folder), max_num_seqs=1, max_queue=2))
        await spare.start()
        yield spare
        await spare.stop()

    async def test_declared_json_schema_is_honoured(self, backend: Backend) -> None:
        schema = self.city_schema
        request = replace(
            self.request(12),
            messages=(ChatMessage("user", "Name a big city and its population as JSON."),),
            response_format=ResponseFormat("json_schema", name="city", schema=schema),
        )
        text = (await collect(backend.generate(request))).text()
        assert re.match(r'\s*\{\s*"city"\s*:\s*"', text), text

    async def test_declared_tools_force_a_valid_call(self, backend: Backend) -> None:
        tool = ToolSpec("get_city", "Look a city up.", self.city_schema)
        request = replace(
            self.request(64),
            messages=(ChatMessage("user", "Look up Paris."),),
            tools=(tool,),
            tool_choice=ToolChoice("required"),
        )
        result = await collect(backend.generate(request))
        names = [e.name for e in result.events if isinstance(e, ToolCallDelta) and e.name]
        assert names == ["get_city"], result.events


class TestGemma3Contract(_FamilyContract):
    family = "gemma3_text"


class TestGPTNeoXContract(_FamilyContract):
    family = "gpt_neox"
