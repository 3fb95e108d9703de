"""A real OTLP/HTTP trace collector for tests: decodes the protobuf export requests an
engine (vLLM) sends to ``/v1/traces`` and keeps each span's ids, on a thread of its own
(the engine tests are synchronous). Bounded: it keeps the last ``limit`` spans."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass(frozen=True)
class SeenSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str


class Collector:
    """Owned by the test; ``spans`` is appended by the server thread under ``_lock``."""

    def __init__(self, port: int, limit: int = 10_000) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}/v1/traces"
        self._spans: deque[SeenSpan] = deque(maxlen=limit)
        self._lock = threading.Lock()

    def add(self, body: bytes) -> None:
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        with self._lock:
            for resource in message.resource_spans:
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        self._spans.append(
                            SeenSpan(
                                span.name,
                                span.trace_id.hex(),
                                span.span_id.hex(),
                                span.parent_span_id.hex(),
                            )
                        )

    def wait_for_trace(self, trace_id: str, within: float = 30.0) -> list[SeenSpan]:
        """The spans of ``trace_id`` once at least one arrived (engines export in batches)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            with self._lock:
                found = [span for span in self._spans if span.trace_id == trace_id]
            if found:
                return found
            time.sleep(0.2)
        return []


@contextmanager
def otlp_collector(port: int) -> Iterator[Collector]:
    collector = Collector(port)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            size = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(size)
            if self.path == "/v1/traces":
                collector.add(body)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the test reads the spans, not the access log

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
