"""The console's page: the files under ``static/``, read once into memory.

Only files of the kinds in ``_TYPES`` are servable; the routes that serve them
(``gateway.edge.console_routes``) add the page's Content-Security-Policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str


def load_assets(directory: Path = STATIC_DIR) -> dict[str, Asset]:
    """Every servable file under ``directory`` by its relative path; nothing else is."""
    assets: dict[str, Asset] = {}
    for path in sorted(directory.rglob("*")):
        kind = _TYPES.get(path.suffix)
        if path.is_file() and kind is not None:
            assets[path.relative_to(directory).as_posix()] = Asset(path.read_bytes(), kind)
    return assets
