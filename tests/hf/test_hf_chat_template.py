"""A base model (no chat template in its tokenizer) answers chat with a clear 400 naming
the fix; ``chat_template:`` in its config (a file, or the text inline) makes chat work,
rendered exactly as that template says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.base import InvalidRequest
from backends.hf.backend import HFBackend
from backends.tool_markup.prompt import read_chat_template
from tests.hf import tiny
from tests.hf.helpers import chat, collect, completion, config

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _base_model(folder: Path) -> Path:
    """A tiny Llama whose tokenizer carries no chat template, as a base model's."""
    tiny.build("llama", folder)
    for leftover in folder.glob("chat_template.*"):
        leftover.unlink()
    settings = folder / "tokenizer_config.json"
    values = json.loads(settings.read_text())
    values.pop("chat_template", None)
    settings.write_text(json.dumps(values))
    return folder


def test_a_template_is_text_or_a_file(tmp_path: Path) -> None:
    assert read_chat_template(TEMPLATE) == TEMPLATE
    path = tmp_path / "turns.jinja"
    path.write_text(TEMPLATE)
    assert read_chat_template(str(path)) == TEMPLATE
    with pytest.raises(OSError):
        read_chat_template(str(tmp_path / "missing.jinja"))


async def test_base_model_chat_is_a_400_until_a_template_is_configured(tmp_path: Path) -> None:
    folder = _base_model(tmp_path / "base")
    bare = HFBackend(config(source=str(folder), max_num_seqs=2))
    await bare.start()
    try:
        with pytest.raises(InvalidRequest, match="chat_template") as refused:
            await collect(bare.generate(chat("Hello")))
        assert refused.value.param == "messages"
        # The same prompt the configured template will render, as a plain completion.
        rendered = await collect(bare.generate(completion("<user>Hello\n<assistant>", 8)))
    finally:
        await bare.stop()
    path = tmp_path / "turns.jinja"
    path.write_text(TEMPLATE)
    templated = HFBackend(config(source=str(folder), chat_template=str(path), max_num_seqs=2))
    await templated.start()
    try:
        answer = await collect(templated.generate(chat("Hello", 8)))
    finally:
        await templated.stop()
    assert answer.text() == rendered.text()
    assert answer.usage.prompt_tokens == rendered.usage.prompt_tokens
