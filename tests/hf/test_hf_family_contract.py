"""The backend contract (``tests/contract/backend_suite.py``) on a family of each path:
a tiny Gemma 3 on the packed runner, a tiny GPT-NeoX on the generic one. ``n``, stop
strings, cancellation, overload, JSON-schema and forced tool calls (constrained
decoding) work the same whichever runner computes the step.

Random weights never end a free JSON string on their own, and the budget closer cannot
end one for them: this tokenizer encodes a closing such as ``"}`` with a leading word
marker (``▁``) the grammar refuses. So the JSON-schema check runs on a schema whose every
value the grammar bounds (enums, a boolean) and asserts what the suite asserts: the whole
answer is valid JSON matching the schema, ended by ``stop``. The forced-call check is
replaced by what the grammar alone decides, the call's name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import orjson
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
    bounded_schema: Any = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome", "Lisbon"]}, "big": {"type": "boolean"}},
        "required": ["city", "big"],
        "additionalProperties": False,
    }

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
        request = replace(
            self.request(64),
            messages=(ChatMessage("user", "Name a big city as JSON."),),
            response_format=ResponseFormat("json_schema", name="city", schema=self.bounded_schema),
        )
        result = await collect(backend.generate(request))
        assert result.reason() == "stop", result.text()
        jsonschema.validate(orjson.loads(result.text()), self.bounded_schema)

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
