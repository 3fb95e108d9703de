"""IBM Granite 3.2's thoughts: plain-text headings, no special tokens.

With thinking on, the model writes ``Here is my thought process:`` first, then its
thought, then ``Here is my response:`` and the answer (quantized models have been seen
writing ``Here's``; both count, as vLLM's ``granite`` parser accepts). An output that does
not open with the first heading has no thought. A thought whose response heading never
comes is all thought.
"""

from __future__ import annotations

from backends.reasoning.scanner import Phase, ReasoningParser

THOUGHT_HEADINGS = ("Here is my thought process:", "Here's my thought process:")
RESPONSE_HEADINGS = ("Here is my response:", "Here's my response:")


class GraniteParser(ReasoningParser):
    __slots__ = ("_state",)

    def __init__(self, *, in_thought: bool) -> None:
        super().__init__()
        self._state = "thought" if in_thought else "maybe"

    @property
    def phase(self) -> Phase:
        if self._state == "maybe":
            return Phase.UNDECIDED
        return Phase.ANSWERING if self._state == "answer" else Phase.THINKING

    def _markers(self) -> tuple[str, ...]:
        if self._state == "maybe":
            return THOUGHT_HEADINGS
        return RESPONSE_HEADINGS if self._state == "thought" else ()

    def _anchored(self) -> bool:
        return self._state == "maybe"

    def _on_marker(self, marker: str) -> None:
        self._state = "thought" if self._state == "maybe" else "answer"

    def _missed(self) -> None:
        self._state = "answer"

    def _emit(self, text: str) -> None:
        if self._state == "thought":
            self._think(text)
        else:
            self._answer(text)
