"""gpt-oss's harmony format: the output is a run of messages on named channels.

``<|channel|>analysis<|message|>...<|end|>`` is the thought;
``<|start|>assistant<|channel|>final<|message|>...<|return|>`` the answer. Each message
has a header (``<|start|>`` role, ``<|channel|>`` name, optionally `` to=...`` and
``<|constrain|>...``) closed by ``<|message|>``, and a body closed by ``<|end|>``,
``<|return|>`` or ``<|call|>``. The ``analysis`` body goes to the thought; the body of
any other channel (``final``, ``commentary``) to the answer; headers and markers to
neither. Text outside any header or body (a model not writing harmony, or a server that
stripped the special tokens) is answer. The markers must reach the parser as text: a
server that decodes with special tokens skipped leaves nothing to split.
"""

from __future__ import annotations

from backends.reasoning.scanner import Phase, ReasoningParser

START = "<|start|>"
CHANNEL = "<|channel|>"
CONSTRAIN = "<|constrain|>"
MESSAGE = "<|message|>"
BODY_ENDS = ("<|end|>", "<|return|>", "<|call|>")
ANALYSIS = "analysis"
FINAL = "final"
THOUGHT_OPENING = f"{CHANNEL}{ANALYSIS}{MESSAGE}"
ANSWER_OPENING = f"{BODY_ENDS[0]}{START}assistant{CHANNEL}{FINAL}{MESSAGE}"
"""What closes a thought and opens the answer: the text an engine forces at a budget."""

_OUTSIDE = (START, CHANNEL, MESSAGE)
_HEADER = (START, CHANNEL, CONSTRAIN, MESSAGE)
# A header marker inside a body also ends it: a model that skipped its end marker.
_BODY = (*BODY_ENDS, START, CHANNEL)


class HarmonyParser(ReasoningParser):
    __slots__ = ("_answered", "_channel", "_header", "_state")

    def __init__(self, *, in_thought: bool) -> None:
        super().__init__()
        self._state = "body" if in_thought else "outside"
        self._channel = ANALYSIS if in_thought else ""
        self._header: list[str] = []
        self._answered = False

    @property
    def phase(self) -> Phase:
        if self._state == "body" and self._channel == ANALYSIS:
            return Phase.THINKING
        return Phase.ANSWERING if self._answered else Phase.UNDECIDED

    def _markers(self) -> tuple[str, ...]:
        if self._state == "body":
            return _BODY
        return _HEADER if self._state == "header" else _OUTSIDE

    def _on_marker(self, marker: str) -> None:
        if marker == MESSAGE:
            self._open_body()
        elif marker in (START, CHANNEL):
            self._state = "header"
            self._header.clear()  # what came before names the role, not the channel
        elif marker == CONSTRAIN:
            self._header.append(" ")
        else:  # a body's end
            self._state = "outside"

    def _open_body(self) -> None:
        words = "".join(self._header).split()
        self._channel = words[0] if words and self._state == "header" else ""
        self._header.clear()
        self._state = "body"
        if self._channel != ANALYSIS:
            self._answered = True

    def _emit(self, text: str) -> None:
        state = self._state
        if state == "header":
            self._header.append(text)
        elif state == "body" and self._channel == ANALYSIS:
            self._think(text)
        else:
            self._answer(text)
