"""The typed values of the Files and Batch APIs, and their OpenAI JSON shapes."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from backends.errors import ApiError

BATCH_ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
)
COMPLETION_WINDOW = "24h"
WINDOW_SECONDS = 24 * 3600
RERUNS_KEY = "llmso_reruns"
"""The metadata entry counting lines run again after their replica died mid-line."""


class NotFound(ApiError):
    status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class Status(StrEnum):
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


ACTIVE = (Status.VALIDATING, Status.IN_PROGRESS, Status.FINALIZING, Status.CANCELLING)
"""The statuses a runner still has work for."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


@dataclass(frozen=True, slots=True)
class FileObject:
    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": None,
        }


@dataclass(frozen=True, slots=True)
class LineError:
    """One reason an input file was refused (``batch.errors.data``)."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch as stored. ``owner`` is the client key's name; ``total`` the input's line
    count (known after validation); ``reruns`` the lines run twice because a replica died
    while they ran (shown in ``metadata`` as ``llmso_reruns``)."""

    id: str
    owner: str
    endpoint: str
    input_file_id: str
    created_at: int
    status: Status = Status.VALIDATING
    metadata: dict[str, str] = field(default_factory=dict)
    errors: tuple[LineError, ...] = ()
    total: int = 0
    reruns: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None

    @property
    def expires_at(self) -> int:
        return self.created_at + WINDOW_SECONDS

    def to_json(self, completed: int, failed: int) -> dict[str, Any]:
        metadata = dict(self.metadata)
        if self.reruns:
            metadata[RERUNS_KEY] = str(self.reruns)
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": (
                {"object": "list", "data": [e.to_json() for e in self.errors]}
                if self.errors
                else None
            ),
            "input_file_id": self.input_file_id,
            "completion_window": COMPLETION_WINDOW,
            "status": self.status.value,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": completed, "failed": failed},
            "metadata": metadata or None,
        }

    def stored(self) -> dict[str, Any]:
        """The row's JSON: every field, the status as its value, errors as objects."""
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        row["status"] = self.status.value
        row["errors"] = [e.to_json() for e in self.errors]
        return row

    @classmethod
    def from_stored(cls, row: dict[str, Any]) -> Batch:
        errors = tuple(
            LineError(e["code"], e["message"], e.get("line"), e.get("param"))
            for e in row.pop("errors")
        )
        return cls(**{**row, "status": Status(row["status"]), "errors": errors})
