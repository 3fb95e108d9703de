"""``HFEmbeddingBackend``: an in-process pooling model (``task: embed``) for
/v1/embeddings, and for /v1/score and /v1/rerank by cosine similarity.

Ownership: the engine thread (``jobs.JobThread``) owns model and tokenizer and
everything it computes; the event loop owns the backend object. ``/tokenize`` uses a
copy of the tokenizer (``backends.hf.tokenize``).

Batching: the thread takes every job waiting in the inbox (up to ``max_queue``), sorts
all their inputs by length, and runs forwards of up to ``max_num_seqs`` inputs each, so
concurrent requests share forwards and padding stays small (the same length sorting
sentence-transformers does in ``encode``).

Scoring: a pair's score is the cosine similarity of its two texts' vectors, what vLLM
answers for an embedding model. Every text of ``text_1`` and ``text_2`` is embedded once,
in the same batched forwards as embeddings (a query against many documents once), and
counts its prompt tokens, as vLLM counts them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backends.base import (
    BackendEvent,
    ContextLengthExceeded,
    Feature,
    GenerationRequest,
    InvalidRequest,
    ModelInfo,
    NotReady,
    UnsupportedFeature,
)
from backends.embeddings import EmbeddingRequest, EmbeddingResult
from backends.hf.embedding.jobs import Job, JobThread
from backends.hf.embedding.pooling import (
    PoolingConfigError,
    PoolingSpec,
    finish_vectors,
    pool,
    read_pooling_spec,
)
from backends.hf.loading.load_thread import run_in_own_thread
from backends.hf.loading.loader import ModelLoadError, pick_device, threads_for
from backends.hf.loading.model_source import ModelSourceError, resolve_source
from backends.hf.tokenize import ModelTokenizer
from backends.process_wide import exclusive
from backends.scoring import ScoreRequest, ScoreResult
from backends.tokenizing import DetokenizeRequest, TokenizeRequest, TokenizeResult
from config.schema import HFModelConfig

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0
_EMBED_FEATURES = frozenset({Feature.EMBEDDINGS, Feature.SCORE, Feature.TOKENIZE})
_NO_EVENTS: tuple[BackendEvent, ...] = ()


@dataclass(slots=True, kw_only=True)
class _Job(Job[EmbeddingResult]):
    """One request's inputs; ``texts`` are tokenised on the engine thread."""

    texts: tuple[str, ...]
    token_ids: tuple[tuple[int, ...], ...]
    dimensions: int | None


@dataclass(frozen=True, slots=True)
class _Loaded:
    model: Any
    tokenizer: Any
    spec: PoolingSpec
    device: Any
    dtype: Any
    width: int
    max_length: int
    vocab_size: int
    memory_bytes: int


class PoolingEngine(JobThread[_Job, EmbeddingResult]):
    """The thread that runs batched forwards; see the module docstring."""

    def __init__(self, loaded: _Loaded, *, max_batch: int, max_queue: int, threads: int) -> None:
        super().__init__(name="llmso-embed", max_queue=max_queue, threads=threads)
        self._loaded = loaded
        self._max_batch = max_batch

    def compute(self, jobs: list[_Job], started: float) -> list[EmbeddingResult]:
        return [
            EmbeddingResult(vectors, tokens, queued_at=job.queued_at, started_at=started)
            for job, (vectors, tokens) in zip(jobs, self._vectors(jobs), strict=True)
        ]

    def _vectors(self, jobs: list[_Job]) -> list[tuple[tuple[tuple[float, ...], ...], int]]:
        import torch

        loaded = self._loaded
        per_job = [self._token_lists(job) for job in jobs]
        flat = [(j, i, ids) for j, lists in enumerate(per_job) for i, ids in enumerate(lists)]
        flat.sort(key=lambda item: len(item[2]))
        pooled: dict[tuple[int, int], torch.Tensor] = {}
        with torch.inference_mode():
            for start in range(0, len(flat), self._max_batch):
                chunk = flat[start : start + self._max_batch]
                vectors = self._forward([ids for _, _, ids in chunk])
                for (j, i, _), vector in zip(chunk, vectors, strict=True):
                    pooled[(j, i)] = vector
            out = []
            for j, (job, lists) in enumerate(zip(jobs, per_job, strict=True)):
                stacked = torch.stack([pooled[(j, i)] for i in range(len(lists))])
                final = finish_vectors(
                    stacked.float(), normalize=loaded.spec.normalize, dimensions=job.dimensions
                )
                rows = tuple(tuple(row) for row in final.tolist())
                out.append((rows, sum(len(ids) for ids in lists)))
        return out

    def _token_lists(self, job: _Job) -> list[list[int]]:
        if job.token_ids:
            return [list(ids) for ids in job.token_ids]
        encoded = self._loaded.tokenizer(
            list(job.texts), truncation=True, max_length=self._loaded.max_length
        )
        return [list(ids) for ids in encoded["input_ids"]]

    def _forward(self, batch: list[list[int]]) -> Any:
        import torch

        loaded = self._loaded
        longest = max(len(ids) for ids in batch)
        pad = loaded.tokenizer.pad_token_id or 0
        ids = torch.full((len(batch), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[row, : len(tokens)] = 1
        ids, mask = ids.to(loaded.device), mask.to(loaded.device)
        hidden = loaded.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return pool(hidden, mask, loaded.spec.mode)


def load_pooling_model(config: HFModelConfig) -> _Loaded:
    """Weights, tokenizer and pooling spec (worker thread; blocking I/O), under the
    process's load lock (``backends.process_wide``)."""
    with exclusive(f"load of {config.name}"):
        return _load_pooling_model(config)


def _load_pooling_model(config: HFModelConfig) -> _Loaded:
    import torch
    from transformers import AutoModel, AutoTokenizer

    try:
        source = resolve_source(config.source)
        spec = read_pooling_spec(Path(source.path_or_id)) if source.is_local else None
    except (ModelSourceError, PoolingConfigError) as exc:
        raise ModelLoadError(str(exc)) from exc
    spec = spec or PoolingSpec(mode="mean", normalize=True)
    device = pick_device(config.device)
    # fp32 unless asked: bf16 moves the vectors too far from the reference encoders.
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(config.dtype, torch.float32)
    offline = {"local_files_only": True} if source.is_local else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path_or_id, **offline)
        model = AutoModel.from_pretrained(source.path_or_id, dtype=dtype, **offline)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load {config.source!r}: {exc}") from exc
    model = model.to(device).eval()
    model.requires_grad_(False)
    positions = int(getattr(model.config, "max_position_embeddings", 0) or 512)
    limits = [positions, spec.max_seq_length or positions, config.max_context or positions]
    memory = sum(p.numel() * p.element_size() for p in model.parameters())
    return _Loaded(
        model=model,
        tokenizer=tokenizer,
        spec=spec,
        device=device,
        dtype=dtype,
        width=int(model.config.hidden_size),
        max_length=min(limits),
        vocab_size=int(model.config.vocab_size),
        memory_bytes=memory,
    )


class HFEmbeddingBackend:
    """See the module docstring. Generation requests never reach it: it declares only
    ``Feature.EMBEDDINGS``, so the gateway refuses chat and completions first."""

    def __init__(self, config: HFModelConfig) -> None:
        self._config = config
        self._loaded: _Loaded | None = None
        self._engine: PoolingEngine | None = None
        self._tokens: ModelTokenizer | None = None

    async def start(self) -> None:
        if self._engine is not None:
            return
        # Not asyncio.to_thread: an executor thread would keep an idle OpenMP pool that
        # throttles every engine's steps in this process (backends/hf/loading/load_thread.py).
        loaded, tokens = await run_in_own_thread(self._load, f"load-{self._config.name}")
        self._loaded = loaded
        self._tokens = tokens
        self._engine = PoolingEngine(
            loaded,
            max_batch=self._config.max_num_seqs,
            max_queue=self._config.max_queue,
            threads=threads_for(self._config),
        )
        self._engine.start()

    def _load(self) -> tuple[_Loaded, ModelTokenizer]:
        loaded = load_pooling_model(self._config)
        return loaded, ModelTokenizer(loaded.tokenizer, loaded.max_length)

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        engine.request_stop()
        await asyncio.to_thread(engine.thread.join, STOP_TIMEOUT_S)
        if engine.thread.is_alive():
            log.error("%s: embedding thread did not stop in %ss", self._config.name, STOP_TIMEOUT_S)
        self._loaded = None
        self._tokens = None

    async def ready(self) -> bool:
        return self._engine is not None and self._engine.thread.is_alive()

    def info(self) -> ModelInfo:
        loaded = self._loaded
        if loaded is None:
            return ModelInfo(max_context=self._config.max_context, features=_EMBED_FEATURES)
        return ModelInfo(
            max_context=loaded.max_length,
            memory_bytes=loaded.memory_bytes,
            features=_EMBED_FEATURES,
            extra={
                "task": "embed",
                "dimensions": str(loaded.width),
                "pooling": loaded.spec.mode,
                "normalize": str(loaded.spec.normalize).lower(),
                "dtype": str(loaded.dtype).removeprefix("torch."),
                "device": str(loaded.device),
            },
        )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        for event in _NO_EVENTS:  # an async generator, as the contract asks
            yield event
        raise UnsupportedFeature(
            f"model {request.model!r} is an embedding model; use /v1/embeddings", param="model"
        )

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        engine, loaded = self._engine, self._loaded
        if engine is None or loaded is None:
            raise NotReady(f"model {request.model!r} is not loaded", retry_after=1.0)
        self._check(request, loaded)
        job = _Job(
            queued_at=time.time(),
            texts=request.texts,
            token_ids=request.token_ids,
            dimensions=request.dimensions,
        )
        return await engine.run(job, request.timeout, "embedding")

    async def score(self, request: ScoreRequest) -> ScoreResult:
        """Cosine similarity of each pair's vectors (see the module docstring)."""
        embedded = await self.embed(
            EmbeddingRequest(
                request_id=request.request_id,
                model=request.model,
                texts=request.text_1 + request.text_2,
                arrival_time=request.arrival_time,
                timeout=request.timeout,
            )
        )
        return ScoreResult(
            cosines(embedded.vectors, len(request.text_1)),
            embedded.prompt_tokens,
            queued_at=embedded.queued_at,
            started_at=embedded.started_at,
        )

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        return await self._tokenizer(request.model).tokenize(request)

    async def detokenize(self, request: DetokenizeRequest) -> str:
        return await self._tokenizer(request.model).detokenize(request)

    def _tokenizer(self, model: str) -> ModelTokenizer:
        if self._tokens is None or self._engine is None:
            raise NotReady(f"model {model!r} is not loaded", retry_after=1.0)
        return self._tokens

    @staticmethod
    def _check(request: EmbeddingRequest, loaded: _Loaded) -> None:
        if request.dimensions is not None and request.dimensions > loaded.width:
            raise InvalidRequest(
                f"dimensions must be at most {loaded.width} for model {request.model!r}",
                param="dimensions",
            )
        for index, ids in enumerate(request.token_ids):
            if len(ids) > loaded.max_length:
                raise ContextLengthExceeded(
                    f"input[{index}] has {len(ids)} tokens; this model takes at most "
                    f"{loaded.max_length}",
                    param="input",
                )
            if any(token < 0 or token >= loaded.vocab_size for token in ids):
                raise InvalidRequest(
                    f"input[{index}] holds a token id outside 0..{loaded.vocab_size - 1}",
                    param="input",
                )


def cosines(vectors: tuple[tuple[float, ...], ...], queries: int) -> tuple[float, ...]:
    """The cosine of each pair: ``vectors`` holds ``queries`` query vectors then one per
    document; one query pairs with every document, else query i with document i."""
    matrix = np.asarray(vectors, dtype=np.float64)
    firsts, seconds = matrix[:queries], matrix[queries:]
    if queries == 1:
        firsts = np.repeat(firsts, len(seconds), axis=0)
    dots = (firsts * seconds).sum(axis=1)
    norms = np.linalg.norm(firsts, axis=1) * np.linalg.norm(seconds, axis=1)
    return tuple(float(c) for c in dots / np.maximum(norms, 1e-12))
