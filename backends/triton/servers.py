"""One Triton server behind a ``triton`` model: its gRPC client and checked contract.

``TritonServer`` is the transport half of a replica (the ``Replica`` in
``backends.replicas`` holds its health, ejection and load). Owned by the event loop of
the ``TritonBackend`` that made it: ``open`` creates the channel, ``close`` ends it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from tritonclient.grpc import aio as triton_aio
from tritonclient.utils import InferenceServerException

from backends.base import BackendError, NotReady, UpstreamUnavailable
from backends.triton import contract
from backends.triton.errors import RETRY_AFTER, map_client_error
from config.schema import TritonModelConfig

_MAX_MESSAGE = 2**31 - 1  # Triton's own limit (INT32_MAX), as tritonclient sets it


class TritonServer:
    """The gRPC side of one replica. See the module doc."""

    def __init__(self, url: str, config: TritonModelConfig) -> None:
        self.url = url
        self._config = config
        self.client: Any = None
        self.contract: contract.ModelContract | None = None

    def open(self) -> None:
        if self.client is None:
            self.client = triton_aio.InferenceServerClient(
                self.url, channel_args=channel_args(self._config)
            )

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.close()

    async def require_ready(self) -> None:
        """Raise UpstreamUnavailable / NotReady unless server and model are ready."""
        if self.client is None:
            raise NotReady(f"Triton at {self.url}: the backend is not started")
        timeout = self._config.connect_timeout
        name, version = self._config.triton_model, self._config.model_version
        try:
            live = await self.client.is_server_live(client_timeout=timeout)
            if not live:
                raise UpstreamUnavailable(f"Triton at {self.url} is not live")
            model_ready = await self.client.is_model_ready(name, version, client_timeout=timeout)
        except InferenceServerException as exc:
            raise map_client_error(exc, self.url) from exc
        if not model_ready:
            raise NotReady(f"Triton model {name!r} is not ready", retry_after=RETRY_AFTER)

    async def probe(self) -> bool:
        try:
            await self.require_ready()
        except BackendError:
            return False
        return True

    async def check_contract(self) -> contract.ModelContract:
        await self.require_ready()
        name = self._config.triton_model
        try:
            metadata = await self.client.get_model_metadata(
                name,
                self._config.model_version,
                as_json=True,
                client_timeout=self._config.connect_timeout,
            )
        except InferenceServerException as exc:
            raise map_client_error(exc, self.url) from exc
        self.contract = contract.check_metadata(name, metadata)
        return self.contract


def endpoints(config: TritonModelConfig) -> list[tuple[str, str | None]]:
    """Each replica's gRPC address and metrics page: ``metrics_url`` when given, else
    ``http://<host>:<metrics_port>/metrics`` (Triton serves Prometheus on its own port)."""
    return [
        (e.url, e.metrics_url or metrics_url(e.url, config.metrics_port)) for e in config.endpoints
    ]


def metrics_url(grpc_url: str, port: int) -> str:
    host = urlsplit("//" + grpc_url.rsplit("://", maxsplit=1)[-1]).hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/metrics"


def channel_args(config: TritonModelConfig) -> list[tuple[str, int]]:
    """tritonclient's defaults plus a short reconnect backoff: gRPC's default grows to
    two minutes while the server is down, and a restarted Triton would stay unused
    that long. Keepalive pings stay off, as in tritonclient (Triton rejects eager ones)."""
    backoff_ms = int(min(config.connect_timeout, 2.0) * 1000)
    return [
        ("grpc.max_send_message_length", _MAX_MESSAGE),
        ("grpc.max_receive_message_length", _MAX_MESSAGE),
        ("grpc.initial_reconnect_backoff_ms", min(250, backoff_ms)),
        ("grpc.min_reconnect_backoff_ms", min(250, backoff_ms)),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
    ]
