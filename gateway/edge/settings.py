"""Process settings from the environment (``LLMSO_*``), overridable by CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from config.loader import DEFAULT_CONFIG


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LLMSO_", frozen=True)

    config: Path = Field(DEFAULT_CONFIG, description="YAML config file.")
    host: str | None = Field(None, description="Bind address; overrides server.host.")
    port: int | None = Field(None, description="Bind port; overrides server.port.")
    workers: int | None = Field(
        None, ge=1, le=256, description="Gateway processes; overrides server.workers."
    )
    admin_key: str | None = Field(None, description="Bearer token for /admin; unset disables it.")
    log_level: str = Field("INFO", description="Python logging level.")
    log_format: Literal["json", "text"] = Field("json", description="Log line format.")
    watch_config: bool = Field(True, description="Reload the config when the file changes.")
