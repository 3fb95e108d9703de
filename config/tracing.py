"""The ``tracing:`` section: OpenTelemetry export of one trace per request (off by default)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

_SCHEMES = ("http://", "https://", "grpc://", "grpcs://")


class TracingConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    otlp_endpoint: str | None = Field(
        None,
        description=(
            "OTLP collector. http(s)://host:4318 speaks OTLP/HTTP protobuf (spans POSTed to "
            "<endpoint>/v1/traces); grpc(s)://host:4317 speaks OTLP/gRPC. Unset: tracing off."
        ),
    )
    sample_ratio: float = Field(
        1.0, ge=0.0, le=1.0, description="Share of new traces kept; a client's sampled flag wins."
    )
    capture_content: bool = Field(
        False, description="Record prompt text on spans (gen_ai.input.messages / gen_ai.prompt)."
    )
    service_name: str = Field("llmso", min_length=1, description="service.name of the spans.")
    export_timeout: float = Field(10.0, gt=0, description="Seconds per export call.")

    @field_validator("otlp_endpoint")
    @classmethod
    def _scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(_SCHEMES):
            raise ValueError("otlp_endpoint must start with http://, https://, grpc:// or grpcs://")
        return value.rstrip("/") if value else value

    @property
    def enabled(self) -> bool:
        return self.otlp_endpoint is not None
