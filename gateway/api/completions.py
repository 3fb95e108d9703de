"""``POST /v1/completions`` beyond one prompt: lists of prompts, ``echo`` and ``best_of``.

A request with one prompt, no ``echo`` and ``best_of == n`` takes the ordinary generation
path unchanged. Anything else becomes a ``CompletionPlan``: one backend request per
prompt (each for ``best_of`` choices), opened together, and merged into one
``Generation`` whose choice ``index`` runs prompt by prompt (prompt ``p``'s choice ``i`` is
``p * best_of + i``), with one summed ``Usage`` at the end. The service's ordinary
``complete()`` and ``stream()`` then shape it. ``echo`` puts the prompt in front of each
choice's first text (with ``logprobs``, the prompt's scored tokens in front of its first
log-probabilities, the first token's ``null``: ``gateway.api.prompt_scores``);
``prompt_logprobs`` adds vLLM's per-choice ``prompt_logprobs`` list; ``best_of`` keeps,
per prompt, the ``n`` choices with the highest mean token log-probability and numbers
them ``p * n + j`` (never streamed).

Everything here is owned by the task serving one request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from typing import Any

import orjson

from backends.base import (
    BackendEvent,
    Finished,
    GenerationRequest,
    InvalidRequest,
    PromptLogprobs,
    Started,
    TextDelta,
    TokenLogprob,
    UnsupportedFeature,
    Usage,
)
from gateway.api.base import Endpoint, GenerationPresenter, Prepared, parse_wire
from gateway.api.chat import ChatPresenter
from gateway.api.prompt_scores import echo_logprobs, echo_text, vllm_prompt_logprobs
from gateway.api.translate import (
    MAX_CHOICES,
    completion_prompts,
    completion_request,
    report_unknown_fields,
)
from gateway.api.wire import CompletionRequest
from gateway.observe.record import RequestRecord
from gateway.service.generation import CompletionService, Generation


@dataclass(frozen=True, slots=True)
class CompletionPlan:
    """``requests``: one per prompt, each asking for ``best_of`` choices; ``n`` of them
    are returned per prompt."""

    requests: tuple[GenerationRequest, ...]
    n: int
    echo: bool
    want_logprobs: bool
    vllm_prompt_logprobs: bool = False
    """The client asked vLLM's ``prompt_logprobs`` (else any scoring is ``echo``'s)."""

    @property
    def best_of(self) -> int:
        return self.requests[0].sampling.n

    @property
    def simple(self) -> bool:
        scored = self.requests[0].prompt_logprobs is not None
        return len(self.requests) == 1 and not self.echo and not scored and self.best_of == self.n

    @property
    def echo_scores(self) -> bool:
        return self.echo and self.want_logprobs


def completion_plan(wire: CompletionRequest, request_id: str, arrival: float) -> CompletionPlan:
    first = completion_request(wire, request_id, arrival)
    prompts = completion_prompts(wire.prompt)
    if len(prompts) * first.sampling.n > MAX_CHOICES:
        raise InvalidRequest(
            f"prompts x best_of (or n) must be at most {MAX_CHOICES}", param="prompt"
        )
    if wire.echo and first.prompt_logprobs is None and not all(isinstance(p, str) for p in prompts):
        raise InvalidRequest(
            "echo of a token-id prompt needs logprobs (its text comes from the scored tokens)",
            param="echo",
        )
    requests = tuple(
        replace(first, prompt=prompt, prompt_token_ids=())
        if isinstance(prompt, str)
        else replace(first, prompt="", prompt_token_ids=prompt)
        for prompt in prompts
    )
    asked = wire.prompt_logprobs is not None
    return CompletionPlan(requests, wire.n, wire.echo, wire.logprobs is not None, asked)


async def open_plan(
    service: CompletionService,
    plan: CompletionPlan,
    record: RequestRecord,
    scores: dict[int, PromptLogprobs] | None = None,
) -> Generation:
    """Open every prompt's generation together; one merged ``Generation`` back (each
    prompt's scored tokens land in ``scores`` as they arrive)."""
    tasks = [asyncio.ensure_future(service.open(request, record)) for request in plan.requests]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        for task in tasks:
            if not task.cancelled() and task.exception() is None:
                await task.result().close()
        raise
    parts = [task.result() for task in tasks]
    stack = AsyncExitStack()
    for part in parts:
        stack.push_async_callback(part.close)
    merged = _merged(parts, plan, {} if scores is None else scores)
    stack.push_async_callback(merged.aclose)
    try:
        first = await anext(merged)
    except BaseException:
        await stack.aclose()
        raise
    head = parts[0]
    sampling = replace(head.request.sampling, n=len(parts) * plan.best_of)
    return replace(head, request=replace(head.request, sampling=sampling), first=first,
                   events=merged, closer=stack.aclose)  # fmt: skip


async def _merged(
    parts: list[Generation], plan: CompletionPlan, scores: dict[int, PromptLogprobs]
) -> AsyncGenerator[BackendEvent, None]:
    """``scores``: filled with each prompt's scored tokens (by prompt number) as they come."""
    per = plan.best_of
    prompt_tokens = completion_tokens = resumes = resume_prompt_tokens = cached_tokens = 0
    upstream: float | None = None
    for number, part in enumerate(parts):
        request = plan.requests[number]
        echo = echo_text(request, None)
        echo_entries: tuple[TokenLogprob, ...] = ()
        unechoed = set(range(per)) if plan.echo else set()
        async for event in part.all_events():
            if isinstance(event, Started):
                if number == 0:
                    yield event
            elif isinstance(event, PromptLogprobs):
                scores[number] = event
                echo = echo_text(request, event)
                echo_entries = echo_logprobs(event) if plan.echo_scores else ()
            elif isinstance(event, TextDelta):
                delta = replace(event, index=number * per + event.index)
                if event.index in unechoed:
                    unechoed.discard(event.index)
                    text, logprobs = echo + event.text, echo_entries + event.logprobs
                    delta = replace(delta, text=text, logprobs=logprobs)
                yield delta
            elif isinstance(event, Finished):
                if event.index in unechoed:
                    unechoed.discard(event.index)
                    index = number * per + event.index
                    yield TextDelta(index, echo, echo_entries, num_tokens=0)
                yield replace(event, index=number * per + event.index)
            elif isinstance(event, Usage):
                prompt_tokens += event.prompt_tokens
                completion_tokens += event.completion_tokens
                resumes += event.resumes
                resume_prompt_tokens += event.resume_prompt_tokens
                cached_tokens += event.cached_tokens
                if event.upstream_seconds is not None:
                    upstream = max(upstream or 0.0, event.upstream_seconds)
    yield Usage(
        prompt_tokens,
        completion_tokens,
        upstream,
        resumes,
        resume_prompt_tokens,
        cached_tokens=cached_tokens,
    )


def keep_best(body: dict[str, Any], plan: CompletionPlan) -> dict[str, Any]:
    """Per prompt, the ``n`` choices with the best mean log-probability, renumbered."""
    if plan.best_of == plan.n:
        return body
    choices: list[dict[str, Any]] = body["choices"]
    kept: list[dict[str, Any]] = []
    for start in range(0, len(choices), plan.best_of):
        group = choices[start : start + plan.best_of]
        ranked = sorted(group, key=_mean_logprob, reverse=True)[: plan.n]
        for choice in ranked:
            logprobs = choice["logprobs"] if plan.want_logprobs else None
            kept.append({**choice, "index": len(kept), "logprobs": logprobs})
    return {**body, "choices": kept}


def _mean_logprob(choice: dict[str, Any]) -> float:
    values = [
        v for v in (choice.get("logprobs") or {}).get("token_logprobs") or [] if v is not None
    ]
    return sum(values) / len(values) if values else float("-inf")


class PlanPresenter(GenerationPresenter):
    """A ``CompletionPlan``'s requests opened together as one generation; the best
    ``n`` of each prompt's ``best_of`` choices kept (never streamed)."""

    __slots__ = ("_include_usage", "_plan", "_scores")

    def __init__(
        self, service: CompletionService, plan: CompletionPlan, include_usage: bool
    ) -> None:
        super().__init__(service)
        self._plan = plan
        self._include_usage = include_usage
        self._scores: dict[int, PromptLogprobs] = {}

    async def open(self, request: GenerationRequest, record: RequestRecord) -> Generation:
        """``request``: the first prompt's, as admitted for the whole list (the key's
        models, limits, priority; the settlement counts every prompt's real usage)."""
        plan = self._plan
        rest = (
            replace(
                other,
                priority=request.priority,
                tenant=request.tenant,
                trace_headers=request.trace_headers,
                session_id=request.session_id,
            )
            for other in plan.requests[1:]
        )
        plan = self._plan = replace(plan, requests=(request, *rest))
        try:
            return await open_plan(self.service, plan, record, self._scores)
        except UnsupportedFeature as exc:
            if exc.param == "prompt_logprobs" and not plan.vllm_prompt_logprobs:
                # The scoring was asked by echo with logprobs: name what the client sent.
                raise UnsupportedFeature(exc.message, param="echo") from None
            if exc.param != "logprobs" or plan.want_logprobs:
                raise
            raise UnsupportedFeature(
                f"best_of ranks choices by log-probability: {exc.message}", param="best_of"
            ) from None

    async def body(self, generation: Generation) -> bytes:
        body = keep_best(await self.service.complete(generation), self._plan)
        if self._plan.vllm_prompt_logprobs:
            for number, choice in enumerate(body["choices"]):
                scores = self._scores.get(number // self._plan.n)
                choice["prompt_logprobs"] = None if scores is None else vllm_prompt_logprobs(scores)
        return orjson.dumps(body)

    def frames(self, generation: Generation) -> AsyncGenerator[bytes, None]:
        return self.service.stream(generation, self._include_usage)


class CompletionsEndpoint(Endpoint):
    path = "/v1/completions"
    wire = CompletionRequest
    summary = "Create a completion"

    def __init__(self, service: CompletionService) -> None:
        self._service = service

    async def prepare(self, body: Any, record: RequestRecord) -> Prepared[Generation]:
        wire = parse_wire(CompletionRequest, body)
        report_unknown_fields(wire, record.request_id)
        plan = completion_plan(wire, record.request_id, record.arrival_time)
        record.requested_model = wire.model
        include_usage = bool(wire.stream_options and wire.stream_options.include_usage)
        presenter: GenerationPresenter = (
            ChatPresenter(self._service, include_usage)
            if plan.simple
            else PlanPresenter(self._service, plan, include_usage)
        )
        return Prepared(plan.requests[0], wire.stream, presenter)
