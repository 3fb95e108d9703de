"""``ReasoningContract``: the reasoning tier every backend passes or refuses by capability.

Mixed into ``BackendContract``, so every backend's contract class runs it on its
``backend`` fixture. The checks:

- a backend that does not declare ``Feature.REASONING`` never sends a ``ReasoningDelta``,
  and its requests' reasoning controls are dropped, not refused
  (``gateway.service.capabilities.reasoning_controls``);
- one that declares it has each control it does not declare refused with a 400 naming
  the control's field, and the ones it declares served;
- where the backend's test double thinks (``thinking_request`` returns a request, and the
  backend declares ``Feature.REASONING``): the thought comes as ``ReasoningDelta`` before
  the answer, never inside it, and ``Usage.reasoning_tokens`` counts it; a completion's
  text is never split.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from backends.base import (
    Backend,
    Feature,
    GenerationRequest,
    ReasoningControls,
    ReasoningDelta,
    RequestKind,
    SamplingParams,
    TextDelta,
    UnsupportedFeature,
)
from gateway.service.capabilities import reasoning_controls, require_features
from tests.contract.events import collect

# Each control with the feature it needs and the chat field a refusal names.
CONTROLS: list[tuple[ReasoningControls, Feature, str]] = [
    (ReasoningControls(effort="high"), Feature.REASONING_EFFORT, "reasoning_effort"),
    (ReasoningControls(thinking=False), Feature.THINKING_SWITCH, "chat_template_kwargs"),
    (
        ReasoningControls(thinking=True, budget_tokens=4),
        Feature.THINKING_BUDGET,
        "thinking_token_budget",
    ),
]


def _control_id(value: object) -> str:
    return value.value if isinstance(value, Feature) else ""


class ReasoningContract:
    """See the module docstring; ``BackendContract`` provides ``request``."""

    model: str

    def request(self, max_tokens: int, **sampling: object) -> GenerationRequest:
        raise NotImplementedError

    def thinking_request(self) -> GenerationRequest | None:
        """A chat request the backend's model answers with a thought and an answer;
        None where its test double does not think (the positive checks are skipped)."""
        return None

    @pytest.mark.parametrize(("controls", "feature", "param"), CONTROLS, ids=_control_id)
    async def test_reasoning_controls_pass_or_refuse_by_capability(
        self, backend: Backend, controls: ReasoningControls, feature: Feature, param: str
    ) -> None:
        info = backend.info()
        request = replace(self.request(4), reasoning=controls)
        if Feature.REASONING not in info.features:
            routed, ignored = reasoning_controls(request, info)
            assert ignored and not routed.reasoning.asked
            require_features(request, self.model, info)  # ignored, never refused
        elif feature not in info.features:
            with pytest.raises(UnsupportedFeature) as caught:
                require_features(request, self.model, info)
            assert caught.value.param == param
            return
        else:
            require_features(request, self.model, info)
            routed = request
        result = await collect(backend.generate(routed))
        assert result.reason() in ("stop", "length")

    async def test_no_thought_without_declaring_it(self, backend: Backend) -> None:
        if Feature.REASONING in backend.info().features:
            pytest.skip("the backend declares reasoning")
        result = await collect(backend.generate(self.request(8)))
        assert not any(isinstance(event, ReasoningDelta) for event in result.events)

    def _thinking(self, backend: Backend) -> GenerationRequest:
        request = self.thinking_request()
        if request is None:
            pytest.skip("this backend's test double does not think")
        assert Feature.REASONING in backend.info().features
        return request

    async def test_thought_comes_apart_before_the_answer(self, backend: Backend) -> None:
        result = await collect(backend.generate(self._thinking(backend)))
        kinds = [type(e) for e in result.events if isinstance(e, ReasoningDelta | TextDelta)]
        assert ReasoningDelta in kinds and TextDelta in kinds, result.events
        assert kinds.index(TextDelta) > kinds.index(ReasoningDelta)
        answer = result.text()
        assert answer and "<think>" not in answer and "</think>" not in answer
        usage = result.usage
        assert 0 < usage.reasoning_tokens <= usage.completion_tokens

    async def test_a_completion_is_never_split(self, backend: Backend) -> None:
        thinking = self._thinking(backend)
        if Feature.COMPLETION not in backend.info().features:
            pytest.skip("the backend serves no completions")
        prompt = thinking.messages[-1].content
        request = GenerationRequest(
            request_id=f"contract-{time.monotonic_ns()}",
            model=self.model,
            kind=RequestKind.COMPLETION,
            sampling=SamplingParams(max_tokens=thinking.sampling.max_tokens, temperature=0.0),
            prompt=prompt,
            arrival_time=time.time(),
        )
        result = await collect(backend.generate(request))
        assert not any(isinstance(event, ReasoningDelta) for event in result.events)
        assert result.usage.reasoning_tokens == 0
