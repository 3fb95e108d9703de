"""The machinery every reasoning parser shares: a marker scanner over text deltas.

A parser is a small state machine whose states each name the markers that end them
(``<think>``, ``</think>``, ``<|channel|>``...). ``ReasoningParser`` finds those markers in
the stream however the deltas cut it: text that could still be the start of a marker is
held back until the next delta decides, and ``finish`` lets it go. Subclasses say, for
their current state, which markers to look for, whether a marker only counts at the
start of the state's text (``anchored``), what a marker or its absence does, and where
text goes (thought or answer). Pure string work; no tokenizer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True, slots=True)
class Split:
    """A delta's text split into the thought (``reasoning``) and the answer (``content``)."""

    reasoning: str = ""
    content: str = ""

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content)


NOTHING = Split()


class Phase(Enum):
    """Where a parser stands: ``UNDECIDED`` (the output may still open a thought),
    ``THINKING`` (inside one) or ``ANSWERING`` (the answer: a thought ended, or none was
    opened where one could be)."""

    UNDECIDED = "undecided"
    THINKING = "thinking"
    ANSWERING = "answering"


def partial_suffix(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(text), len(marker) - 1), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest


def earliest(text: str, markers: tuple[str, ...]) -> tuple[int, str] | None:
    """The first marker in ``text`` and where it starts (the longest one at a tie)."""
    found: tuple[int, str] | None = None
    for marker in markers:
        at = text.find(marker)
        if at < 0:
            continue
        if found is None or at < found[0] or (at == found[0] and len(marker) > len(found[1])):
            found = (at, marker)
    return found


class ReasoningParser(ABC):
    """One choice's stream, split into thought and answer. Owned by whoever streams
    the choice (an engine thread, a relay coroutine); not thread-safe.

    ``feed(delta)`` returns the part of the text that is decided; ``finish()`` returns
    what was held back (a partial marker at the end is text after all). Any cut of a
    stream into deltas gives the same joined thought and answer.
    """

    __slots__ = ("_content", "_held", "_reasoning")

    def __init__(self) -> None:
        self._held = ""
        self._reasoning: list[str] = []
        self._content: list[str] = []

    @property
    @abstractmethod
    def phase(self) -> Phase:
        """Where the text fed so far (less what is held back) leaves the parser."""

    @abstractmethod
    def _markers(self) -> tuple[str, ...]:
        """The markers that end or change the current state; () when none can."""

    def _anchored(self) -> bool:
        """Whether the current state's markers count only at the start of its text
        (leading whitespace skipped); then ``_missed`` is called when the text begins
        otherwise."""
        return False

    @abstractmethod
    def _on_marker(self, marker: str) -> None:
        """A marker of the current state was read (it is not text)."""

    def _missed(self) -> None:
        """An anchored state's text began with no marker: leave the state."""
        raise AssertionError("an anchored state must override _missed")

    @abstractmethod
    def _emit(self, text: str) -> None:
        """Route ``text`` read in the current state (``_think``, ``_answer``, or drop)."""

    def _think(self, text: str) -> None:
        if text:
            self._reasoning.append(text)

    def _answer(self, text: str) -> None:
        if text:
            self._content.append(text)

    def feed(self, delta: str) -> Split:
        if not self._held and not self._markers():
            self._emit(delta)  # the common case after a thought: no scanning at all
        else:
            self._held += delta
            self._drain(final=False)
        return self._take()

    def finish(self) -> Split:
        """The end of the stream: whatever was held back is text of the current state."""
        self._drain(final=True)
        return self._take()

    def _drain(self, *, final: bool) -> None:
        text, self._held = self._held, ""
        while text:
            markers = self._markers()
            if not markers:
                self._emit(text)
                return
            if self._anchored():
                rest = self._anchored_step(text, markers, final)
                if rest is None:
                    self._held = text
                    return
                text = rest
                continue
            found = earliest(text, markers)
            if found is not None:
                at, marker = found
                self._emit(text[:at])
                text = text[at + len(marker) :]
                self._on_marker(marker)
                continue
            keep = 0 if final else partial_suffix(text, markers)
            self._emit(text[: len(text) - keep])
            self._held = text[len(text) - keep :]
            return

    def _anchored_step(self, text: str, markers: tuple[str, ...], final: bool) -> str | None:
        """The text after an anchored state decided; None while it cannot decide yet."""
        stripped = text.lstrip()
        for marker in sorted(markers, key=len, reverse=True):
            if stripped.startswith(marker):
                self._on_marker(marker)
                return stripped[len(marker) :]
        if not final and any(marker.startswith(stripped) for marker in markers):
            return None  # whitespace, or the start of a marker: the next delta decides
        self._missed()
        return text

    def _take(self) -> Split:
        if not self._reasoning and not self._content:
            return NOTHING
        split = Split("".join(self._reasoning), "".join(self._content))
        self._reasoning.clear()
        self._content.clear()
        return split
