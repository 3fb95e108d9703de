"""A scripted backend for the ``/v1/responses`` service tests: it answers with text or
tool calls, as the test's input asks, and records every request it got."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from backends.base import (
    TEXT_GENERATION,
    Backend,
    BackendEvent,
    ContextLengthExceeded,
    Feature,
    Finished,
    GenerationRequest,
    ModelInfo,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    UpstreamUnavailable,
    Usage,
)
from config.schema import ModelConfig

FEATURES = frozenset(Feature)


class ScriptedBackend:
    """Replies with the words of the last message; ``call <name> <json>`` makes it call
    a tool, ``parallel <name>`` make two calls with interleaved fragments; model
    ``broken`` fails after its first word; model ``plain`` declares no tools or
    structured outputs; ``too long`` exceeds the context; a word that is one of the
    request's stop strings ends the text before it."""

    def __init__(self, config: ModelConfig) -> None:
        self.name = config.name
        self.calls: list[GenerationRequest] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def ready(self) -> bool:
        return True

    def info(self) -> ModelInfo:
        features = TEXT_GENERATION if self.name == "plain" else FEATURES
        return ModelInfo(max_context=4096, features=features)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        self.calls.append(request)
        if request.messages[-1].content == "too long":
            raise ContextLengthExceeded("prompt is too long", param="messages")
        yield Started(queued_at=1.0, started_at=1.5)
        words = request.messages[-1].content.split()
        if words[:1] == ["parallel"]:  # two calls, their fragments interleaved
            yield ToolCallDelta(index=0, call_index=0, id="call_a", name=words[1])
            yield ToolCallDelta(index=0, call_index=1, id="call_b", name=words[1])
            for call, fragment in ((0, '{"n":'), (1, '{"n":'), (0, "1}"), (1, "2}")):
                yield ToolCallDelta(index=0, call_index=call, arguments_fragment=fragment)
            yield Finished(index=0, reason="tool_calls")
            yield Usage(prompt_tokens=3, completion_tokens=6)
            return
        if words[:1] == ["call"]:
            arguments = " ".join(words[2:])
            yield ToolCallDelta(index=0, call_index=0, id="call_1", name=words[1])
            for start in range(0, len(arguments), 4):
                yield ToolCallDelta(
                    index=0, call_index=0, arguments_fragment=arguments[start : start + 4]
                )
            yield Finished(index=0, reason="tool_calls")
            yield Usage(prompt_tokens=7, completion_tokens=5)
            return
        stop = next((w for w in words if w in request.sampling.stop), None)
        if stop is not None:  # a stop string ends the text before it, and is named
            words = words[: words.index(stop)]
        budget = len(words[: request.sampling.max_tokens])
        for position, word in enumerate(words[:budget]):
            if self.name == "broken" and position == 1:
                raise UpstreamUnavailable("lost the upstream mid-stream")
            text = word if position == 0 else " " + word
            yield TextDelta(index=0, text=text, logprobs=_logprobs(text, request))
        if stop is not None:
            yield Finished(index=0, reason="stop", stop_sequence=stop)
        else:
            yield Finished(index=0, reason="length" if budget < len(words) else "stop")
        yield Usage(prompt_tokens=len(words), completion_tokens=budget)


def _logprobs(text: str, request: GenerationRequest) -> tuple[TokenLogprob, ...]:
    wanted = request.sampling.logprobs
    if wanted is None:
        return ()
    top = tuple(TopLogprob(f"{text}{i}", -1.0 - i, tuple(text.encode())) for i in range(wanted))
    return (TokenLogprob(text, -0.5, tuple(text.encode()), top),)


def scripted_factory(
    backends: dict[str, ScriptedBackend],
) -> Callable[[ModelConfig, Any], Backend]:
    """A ``backend_factory`` for ``build_app`` that keeps each backend in ``backends``."""

    def factory(model: ModelConfig, _on_crash: Any) -> Backend:
        backends[model.name] = ScriptedBackend(model)
        return backends[model.name]

    return factory
