"""Config of the front door: client keys (``auth:``) and the limit store (``limits:``).

A plain ``key`` is replaced by its SHA-256 while the config is parsed, so no config
object (and nothing that logs or dumps one) ever holds a client key in clear.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_KEY_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

Priority = Literal["high", "normal", "low"]
BudgetPeriod = Literal["day", "week", "month"]

PRIORITY_RANK: dict[str, int] = {"high": -1, "normal": 0, "low": 1}
"""``GenerationRequest.priority`` for each name: lower is served first (vLLM's integers)."""

PRIORITY_LIMIT = 10
"""A priority (a key's range bound, or a request's without a key) lies in +-this."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KeyConfig(_Frozen):
    name: str = Field(
        pattern=_KEY_NAME, description="Shown in logs, metrics and /admin/usage; never the key."
    )
    key_sha256: str = Field(
        description="SHA-256 (hex) of the key; a plain `key:` is hashed into this at load."
    )
    models: tuple[str, ...] | None = Field(
        None,
        description="Names, aliases, `capability:X` or split routes (granting their "
        "targets) this key may use; default all.",
    )
    rpm: int | None = Field(None, gt=0, description="Requests per minute.")
    tpm: int | None = Field(None, gt=0, description="Tokens per minute (prompt + completion).")
    max_parallel: int | None = Field(None, gt=0, description="Requests in flight at once.")
    tokens_per_day: int | None = Field(
        None, gt=0, description="Token budget per UTC day (resets at 00:00 UTC)."
    )
    priority: Priority = Field(
        "normal",
        description="Scheduling priority of this key's requests that send none: high, normal "
        "or low (vLLM's integers -1, 0, 1; lower runs first).",
    )
    priority_range: tuple[int, int] | None = Field(
        None,
        description="[most urgent, least urgent] `priority` a request of this key may send "
        f"(integers within +-{PRIORITY_LIMIT}, lower runs first, or high/normal/low); one "
        "outside is refused with a 400 naming `priority`. Default: only the key's own level.",
    )
    weight: float = Field(
        1.0,
        gt=0,
        le=1000,
        description="This key's share of a model's slots against other keys waiting at the "
        "same priority (weighted fair share in the hf waiting queue and the relay's slot "
        "line): a key of weight 2 gets twice the work of a key of weight 1.",
    )
    max_budget: float | None = Field(
        None,
        gt=0,
        description="Spend limit in USD per `budget_period`, at the models' `pricing:`: once "
        "reached, requests get 429 budget_exceeded until the period ends (docs/spend.md).",
    )
    budget_period: BudgetPeriod = Field(
        "month",
        description="The calendar period `max_budget` covers, in UTC: `day`, `week` (from "
        "Monday 00:00) or `month` (from the 1st); spend starts from 0 in each.",
    )

    @model_validator(mode="before")
    @classmethod
    def _hash_plain_key(cls, value: object) -> object:
        if not isinstance(value, dict) or "key" not in value:
            return value
        data = dict(value)
        plain = data.pop("key")
        if "key_sha256" in data:
            raise ValueError("give either `key` or `key_sha256`, not both")
        if isinstance(plain, str) and "${" in plain:
            raise ValueError("`key` names an environment variable that is not set")
        if not isinstance(plain, str) or len(plain) < 8:
            raise ValueError("`key` must be a string of at least 8 characters")
        data["key_sha256"] = hash_key(plain)
        return data

    @field_validator("priority_range", mode="before")
    @classmethod
    def _named_levels(cls, value: object) -> object:
        if not isinstance(value, list | tuple):
            return value
        return tuple(
            PRIORITY_RANK.get(item, item) if isinstance(item, str) else item for item in value
        )

    @field_validator("priority_range")
    @classmethod
    def _ordered(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is None:
            return None
        first, last = value
        if not -PRIORITY_LIMIT <= first <= last <= PRIORITY_LIMIT:
            raise ValueError(
                f"priority_range is [most urgent, least urgent]: two integers within "
                f"+-{PRIORITY_LIMIT}, the first not above the second (lower runs first)"
            )
        return value

    @model_validator(mode="after")
    def _own_level_in_range(self) -> KeyConfig:
        first, last = self.allowed_priorities
        if not first <= PRIORITY_RANK[self.priority] <= last:
            raise ValueError(
                f"priority_range must include the key's own priority ({self.priority})"
            )
        return self

    @property
    def allowed_priorities(self) -> tuple[int, int]:
        """The ``priority`` range a request of this key may ask for."""
        if self.priority_range is not None:
            return self.priority_range
        own = PRIORITY_RANK[self.priority]
        return own, own

    @field_validator("key_sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        value = value.lower()
        if not _SHA256.match(value):
            raise ValueError("key_sha256 must be 64 hex digits")
        return value

    @field_validator("models", mode="before")
    @classmethod
    def _listify(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value


class AuthConfig(_Frozen):
    required: bool = Field(
        False, description="Require a client key on generation routes (and apply its limits)."
    )
    keys: tuple[KeyConfig, ...] = Field(
        (), description="The client keys: name, hashed key, models, limits, priority."
    )

    @model_validator(mode="after")
    def _unique(self) -> AuthConfig:
        names = [key.name for key in self.keys]
        hashes = [key.key_sha256 for key in self.keys]
        if len(set(names)) != len(names):
            raise ValueError("auth.keys: names must be unique")
        if len(set(hashes)) != len(hashes):
            raise ValueError("auth.keys: two entries have the same key")
        return self


class LimitsConfig(_Frozen):
    store: str = Field(
        "memory", description="`memory` (this process) or `redis://host:port/db` (shared)."
    )
    on_store_error: Literal["allow", "deny"] = Field(
        "allow", description="When the store fails: allow (count and log) or deny (503)."
    )
    store_timeout: float = Field(0.25, gt=0, description="Seconds one store call may take.")
    retry_interval: float = Field(
        1.0, gt=0, description="After a store failure, seconds before it is tried again."
    )
    lease_ttl: float = Field(
        3600.0, gt=0, description="A max_parallel slot is freed after this long even if lost."
    )
    prefix: str = Field("llmso", description="Prefix of the store's keys.")
    unset_max_tokens: int = Field(
        1024,
        gt=0,
        description="Completion tokens reserved for a request that sets no max_tokens "
        "(settled with the real usage at the end).",
    )

    @field_validator("store")
    @classmethod
    def _store(cls, value: str) -> str:
        if value != "memory" and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("store must be `memory` or a redis:// URL")
        return value
