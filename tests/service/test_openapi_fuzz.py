"""``/openapi.json`` documents every route, and schemathesis fuzzes all of them.

The app runs in-process over ASGI with the echo backend of the front-door tests; every
generated request must get an answer that is not a server error (and, for the routes
whose error envelope we document exactly, a conforming one). Examples are bounded so
the whole run stays well under a minute.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

from backends.base import Backend
from config.schema import ModelConfig
from gateway.app import build_app
from tests.tools.frontdoor_app import ADMIN, EchoBackend, make_config

GENERATION = ("/v1/chat/completions", "/v1/completions")


def _app() -> Any:
    def factory(model: ModelConfig, _on_crash: Any) -> Backend:
        return EchoBackend(model)

    # Uploads the fuzzer gets accepted land in a scratch directory, not the checkout.
    batch = {"directory": tempfile.mkdtemp(prefix="llmso-fuzz-batch-")}
    return build_app(make_config(batch=batch), admin_key=ADMIN, backend_factory=factory)


@pytest.fixture(scope="module")
def api_schema() -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", _app())


def test_openapi_documents_every_route() -> None:
    app = _app()
    spec = app.api.openapi()
    paths = set(spec["paths"])
    assert set(GENERATION) <= paths
    assert {"/v1/models", "/health", "/ready", "/metrics", "/admin/usage"} <= paths
    assert {"/v1/files", "/v1/files/{file_id}/content", "/v1/batches"} <= paths
    assert {"/v1/batches/{batch_id}", "/v1/batches/{batch_id}/cancel"} <= paths
    assert {"/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score"} <= paths
    assert {"/tokenize", "/detokenize"} <= paths
    upload = spec["paths"]["/v1/files"]["post"]["requestBody"]["content"]
    assert "file" in upload["multipart/form-data"]["schema"]["properties"]
    chat = spec["paths"]["/v1/chat/completions"]["post"]
    body = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert body.rsplit("/", 1)[1] in spec["components"]["schemas"]
    assert {"401", "404", "415", "429"} <= set(chat["responses"])


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_no_route_answers_with_a_server_error(case: Any) -> None:
    case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])
