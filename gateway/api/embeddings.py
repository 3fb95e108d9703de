"""The plain-ASGI handler of ``POST /v1/embeddings``: the generation call's body reading,
disconnect watching and error rendering, with the embedding service in the middle."""

from __future__ import annotations

import orjson

from backends.base import GenerationRequest, RequestKind, SamplingParams
from backends.embeddings import EmbeddingRequest
from gateway.api.base import parse_wire
from gateway.edge.call import JSON_HEADER, GenerationCall
from gateway.frontdoor.door import admit
from gateway.service.embeddings import EmbeddingService, EmbeddingsWire, embedding_request


class EmbeddingCall(GenerationCall):
    """One embedding request on one connection; owned by the task that runs it."""

    __slots__ = ()

    async def run_embedding(self) -> None:
        await self.guarded(self._embed())

    async def _embed(self) -> None:
        record = self.record
        state = self._state
        body = await self._read_body(state.max_body_bytes)
        wire = parse_wire(EmbeddingsWire, body)
        request = embedding_request(wire, record.request_id, record.arrival_time)
        record.requested_model = request.model
        await admit(self._scope, _metered(request))  # the key's models and limits
        service = EmbeddingService(state.registry, state.gateway_metrics)
        async with self._watch_disconnect():
            payload = await service.embed(request, record, wire.encoding_format)
        headers = [
            JSON_HEADER,
            (b"x-request-id", record.request_id.encode()),
            (b"server-timing", f"total;dur={record.elapsed * 1000.0:.2f}".encode()),
        ]
        await self._respond(200, orjson.dumps(payload), headers)


def _metered(request: EmbeddingRequest) -> GenerationRequest:
    """What the front door meters for an embedding call: its inputs as the prompt and no
    completion tokens (the settlement then counts the real prompt tokens)."""
    return GenerationRequest(
        request_id=request.request_id,
        model=request.model,
        kind=RequestKind.COMPLETION,
        sampling=SamplingParams(max_tokens=1),
        prompt="\n".join(request.texts),
        prompt_token_ids=tuple(token for ids in request.token_ids for token in ids),
        arrival_time=request.arrival_time,
        user=request.user,
    )
