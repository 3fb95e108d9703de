"""``HFCrossEncoderBackend``: an in-process cross-encoder (``task: score``) for /v1/score
and /v1/rerank.

The model is a folder in sentence-transformers' ``CrossEncoder`` layout: a Transformers
sequence-classification model with one label, read with its tokenizer. A pair is encoded
together (``tokenizer(text_1, text_2)``: one sequence with the tokenizer's separators and
token types, cut to the model's length longest-first) and its score is the label's logit
through the activation sentence-transformers applies (``activation``). Only ``torch``
activations are honoured, as sentence-transformers does without ``trust_remote_code``.

Ownership and batching as in ``backend``: one engine thread (``jobs.JobThread``) owns
model and tokenizer; it takes every waiting job, sorts all their pairs by length and runs
forwards of up to ``max_num_seqs`` pairs, each padded to its longest. ``/tokenize`` uses
a copy of the tokenizer (``backends.hf.tokenize``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from backends.base import (
    BackendEvent,
    Feature,
    GenerationRequest,
    ModelInfo,
    NotReady,
    UnsupportedFeature,
)
from backends.hf.embedding.jobs import Job, JobThread
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
_FEATURES = frozenset({Feature.SCORE, Feature.TOKENIZE})
_NO_EVENTS: tuple[BackendEvent, ...] = ()
Activation = Literal["sigmoid", "identity", "tanh"]
_TORCH_ACTIVATIONS: dict[str, Activation] = {
    "Sigmoid": "sigmoid",
    "Identity": "identity",
    "Tanh": "tanh",
}


def activation(folder: Path, config: dict[str, Any]) -> Activation:
    """The activation sentence-transformers' ``CrossEncoder`` puts on the logit, looked up
    where it looks: ``config_sentence_transformers.json``'s ``activation_fn``, then
    ``config.json``'s ``sentence_transformers.activation_fn``, then its older
    ``sbert_ce_default_activation_function``; none (or one outside ``torch``, which it
    does not trust): a sigmoid, its default for one label."""
    named: list[object] = []
    st_file = folder / "config_sentence_transformers.json"
    if st_file.is_file():
        named.append(json.loads(st_file.read_text()).get("activation_fn"))
    nested = config.get("sentence_transformers")
    named.append(nested.get("activation_fn") if isinstance(nested, dict) else None)
    named.append(config.get("sbert_ce_default_activation_function"))
    for path in named:
        if isinstance(path, str) and path.startswith("torch."):
            kind = _TORCH_ACTIVATIONS.get(path.rpartition(".")[2])
            if kind is None:
                raise ModelLoadError(f"{folder}: unsupported cross-encoder activation {path!r}")
            return kind
    return "sigmoid"


@dataclass(frozen=True, slots=True)
class _Loaded:
    model: Any
    tokenizer: Any
    activation: Activation
    device: Any
    dtype: Any
    max_length: int
    memory_bytes: int


@dataclass(slots=True, kw_only=True)
class _Job(Job[ScoreResult]):
    pairs: tuple[tuple[str, str], ...]


class PairEngine(JobThread[_Job, ScoreResult]):
    """The thread that scores pairs in batched forwards; see the module docstring."""

    def __init__(self, loaded: _Loaded, *, max_batch: int, max_queue: int, threads: int) -> None:
        super().__init__(name="llmso-score", max_queue=max_queue, threads=threads)
        self._loaded = loaded
        self._max_batch = max_batch

    def compute(self, jobs: list[_Job], started: float) -> list[ScoreResult]:
        import torch

        flat = [(j, i, pair) for j, job in enumerate(jobs) for i, pair in enumerate(job.pairs)]
        flat.sort(key=lambda item: len(item[2][0]) + len(item[2][1]))
        scored: dict[tuple[int, int], tuple[float, int]] = {}
        with torch.inference_mode():
            for start in range(0, len(flat), self._max_batch):
                chunk = flat[start : start + self._max_batch]
                results = self._forward([pair for _, _, pair in chunk])
                for (j, i, _), result in zip(chunk, results, strict=True):
                    scored[(j, i)] = result
        out = []
        for j, job in enumerate(jobs):
            mine = [scored[(j, i)] for i in range(len(job.pairs))]
            out.append(
                ScoreResult(
                    tuple(score for score, _ in mine),
                    sum(tokens for _, tokens in mine),
                    queued_at=job.queued_at,
                    started_at=started,
                )
            )
        return out

    def _forward(self, pairs: list[tuple[str, str]]) -> list[tuple[float, int]]:
        """Each pair's score and its token count."""
        import torch

        loaded = self._loaded
        encoded = loaded.tokenizer(
            [a for a, _ in pairs],
            [b for _, b in pairs],
            padding=True,
            truncation=True,
            max_length=loaded.max_length,
            return_tensors="pt",
        )
        inputs = {name: tensor.to(loaded.device) for name, tensor in encoded.items()}
        logits = loaded.model(**inputs).logits[:, 0].float()
        if loaded.activation == "sigmoid":
            logits = torch.sigmoid(logits)
        elif loaded.activation == "tanh":
            logits = torch.tanh(logits)
        counts = encoded["attention_mask"].sum(dim=1)
        return [(float(s), int(n)) for s, n in zip(logits.tolist(), counts.tolist(), strict=True)]


def load_cross_encoder(config: HFModelConfig) -> _Loaded:
    """Weights, tokenizer and activation (worker thread; blocking I/O), under the
    process's load lock (``backends.process_wide``)."""
    with exclusive(f"load of {config.name}"):
        return _load(config)


def _load(config: HFModelConfig) -> _Loaded:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        source = resolve_source(config.source)
    except ModelSourceError as exc:
        raise ModelLoadError(str(exc)) from exc
    device = pick_device(config.device)
    # fp32 unless asked, as for embeddings: the scores stay close to the reference's.
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(config.dtype, torch.float32)
    offline = {"local_files_only": True} if source.is_local else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path_or_id, **offline)
        model = AutoModelForSequenceClassification.from_pretrained(
            source.path_or_id, dtype=dtype, **offline
        )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load {config.source!r}: {exc}") from exc
    if int(model.config.num_labels) != 1:
        raise ModelLoadError(
            f"{config.source!r} has {model.config.num_labels} labels; a cross-encoder for "
            "task: score has one"
        )
    folder = Path(source.path_or_id) if source.is_local else None
    kind = activation(folder, model.config.to_dict()) if folder is not None else "sigmoid"
    model = model.to(device).eval()
    model.requires_grad_(False)
    return _Loaded(
        model=model,
        tokenizer=tokenizer,
        activation=kind,
        device=device,
        dtype=dtype,
        max_length=_max_length(model, tokenizer, folder, config),
        memory_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
    )


def _max_length(model: Any, tokenizer: Any, folder: Path | None, config: HFModelConfig) -> int:
    """The shortest of the model's positions, sentence-transformers' ``max_seq_length``,
    the tokenizer's own limit (when it states a real one) and the configured context."""
    positions = int(getattr(model.config, "max_position_embeddings", 0) or 512)
    limits = [positions]
    if folder is not None and (folder / "sentence_bert_config.json").is_file():
        stated = json.loads((folder / "sentence_bert_config.json").read_text())
        if isinstance(stated.get("max_seq_length"), int) and stated["max_seq_length"] > 0:
            limits.append(stated["max_seq_length"])
    own = getattr(tokenizer, "model_max_length", None)
    if isinstance(own, int) and 0 < own < 1_000_000:  # "no limit" is a huge sentinel
        limits.append(own)
    if config.max_context is not None:
        limits.append(config.max_context)
    return min(limits)


class HFCrossEncoderBackend:
    """See the module docstring. It declares only ``Feature.SCORE`` and
    ``Feature.TOKENIZE``, so the gateway refuses generation and embeddings first."""

    def __init__(self, config: HFModelConfig) -> None:
        self._config = config
        self._loaded: _Loaded | None = None
        self._engine: PairEngine | None = None
        self._tokens: ModelTokenizer | None = None

    async def start(self) -> None:
        if self._engine is not None:
            return
        # Its own thread, not an executor's (backends/hf/loading/load_thread.py).
        loaded, tokens = await run_in_own_thread(self._load, f"load-{self._config.name}")
        self._loaded, self._tokens = loaded, tokens
        self._engine = PairEngine(
            loaded,
            max_batch=self._config.max_num_seqs,
            max_queue=self._config.max_queue,
            threads=threads_for(self._config),
        )
        self._engine.start()

    def _load(self) -> tuple[_Loaded, ModelTokenizer]:
        loaded = load_cross_encoder(self._config)
        return loaded, ModelTokenizer(loaded.tokenizer, loaded.max_length)

    async def stop(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        engine.request_stop()
        await asyncio.to_thread(engine.thread.join, STOP_TIMEOUT_S)
        if engine.thread.is_alive():
            log.error("%s: scoring thread did not stop in %ss", self._config.name, STOP_TIMEOUT_S)
        self._loaded = None
        self._tokens = None

    async def ready(self) -> bool:
        return self._engine is not None and self._engine.thread.is_alive()

    def info(self) -> ModelInfo:
        loaded = self._loaded
        if loaded is None:
            return ModelInfo(max_context=self._config.max_context, features=_FEATURES)
        return ModelInfo(
            max_context=loaded.max_length,
            memory_bytes=loaded.memory_bytes,
            features=_FEATURES,
            extra={
                "task": "score",
                "activation": loaded.activation,
                "dtype": str(loaded.dtype).removeprefix("torch."),
                "device": str(loaded.device),
            },
        )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        for event in _NO_EVENTS:  # an async generator, as the contract asks
            yield event
        raise UnsupportedFeature(
            f"model {request.model!r} is a cross-encoder; use /v1/score or /v1/rerank",
            param="model",
        )

    async def score(self, request: ScoreRequest) -> ScoreResult:
        engine = self._engine
        if engine is None:
            raise NotReady(f"model {request.model!r} is not loaded", retry_after=1.0)
        job = _Job(queued_at=time.time(), pairs=request.pairs)
        return await engine.run(job, request.timeout, "scoring")

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        return await self._tokenizer(request.model).tokenize(request)

    async def detokenize(self, request: DetokenizeRequest) -> str:
        return await self._tokenizer(request.model).detokenize(request)

    def _tokenizer(self, model: str) -> ModelTokenizer:
        if self._tokens is None or self._engine is None:
            raise NotReady(f"model {model!r} is not loaded", retry_after=1.0)
        return self._tokens
