"""Every ```yaml block in README.md and docs/*.md loads through the real config loader.

A block is a whole config (it has ``models:``), or its first line is ``# fragment: ...``:
then a list is read as the ``models:`` entries, and a mapping as sections of a config
completed with one placeholder model. Each ``${VAR}`` a block names is set to a dummy
value, since the loader refuses unset ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from config.loader import load_config

ROOT = Path(__file__).resolve().parents[2]
FRAGMENT = "# fragment"
PLACEHOLDER = (
    'models:\n  - {name: docs-placeholder-model, backend: openai, base_url: "http://h/v1"}\n'
)
_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.DOTALL | re.MULTILINE)
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Block:
    where: str
    text: str


def _blocks() -> list[Block]:
    blocks = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append(Block(f"{doc.relative_to(ROOT)}:{line}", match.group(1)))
    return blocks


def _as_whole_config(block: Block) -> str:
    parsed = yaml.safe_load(block.text)
    if not block.text.startswith(FRAGMENT):
        assert isinstance(parsed, dict) and "models" in parsed, (
            f"{block.where}: a yaml block is a whole config (with models:) or starts with "
            f"'{FRAGMENT}: ...'"
        )
        return block.text
    if isinstance(parsed, list):
        entries = "".join(f"  {line}\n" for line in block.text.splitlines())
        return "models:\n" + entries
    assert isinstance(parsed, dict) and "models" not in parsed, block.where
    return block.text + PLACEHOLDER


def test_the_docs_have_config_blocks() -> None:
    """The search below finds what it checks (a broken pattern would pass everything)."""
    blocks = _blocks()
    assert len(blocks) >= 15
    assert any(not b.text.startswith(FRAGMENT) for b in blocks)
    assert any(b.text.startswith(FRAGMENT) for b in blocks)


@pytest.mark.parametrize("block", _blocks(), ids=lambda block: block.where)
def test_doc_config_block_validates(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _VARIABLE.findall(block.text):
        monkeypatch.setenv(name, f"dummy-value-of-{name}")
    path = tmp_path / "block.yaml"
    path.write_text(_as_whole_config(block), encoding="utf-8")
    config = load_config(path)  # raises ConfigError naming the field
    assert config.models
