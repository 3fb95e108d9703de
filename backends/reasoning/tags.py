"""Thoughts between an opening and a closing tag: ``<think>``...``</think>`` (DeepSeek-R1,
QwQ, Qwen3, Phi-4-reasoning) and ``[THINK]``...``[/THINK]`` (Magistral).

States: ``opening`` (the thought is open; a leading opening tag is dropped, as a model
whose template opened the thought may still write one), ``maybe`` (the output may open a
thought: only an opening tag at its very start, after whitespace, does), ``thought``
(until the closing tag) and ``answer``. A parser built ``in_thought`` starts in
``opening``, else in ``maybe``. A thought never closed is all thought; an empty one
(``<think></think>``) gives no thought and the answer after it.
"""

from __future__ import annotations

from backends.reasoning.scanner import Phase, ReasoningParser


class TagParser(ReasoningParser):
    __slots__ = ("_close", "_open", "_state")

    def __init__(self, open_tag: str, close_tag: str, *, in_thought: bool) -> None:
        super().__init__()
        self._open = (open_tag,)
        self._close = (close_tag,)
        self._state = "opening" if in_thought else "maybe"

    @property
    def phase(self) -> Phase:
        if self._state == "maybe":
            return Phase.UNDECIDED
        return Phase.ANSWERING if self._state == "answer" else Phase.THINKING

    def _markers(self) -> tuple[str, ...]:
        state = self._state
        if state == "answer":
            return ()
        return self._close if state == "thought" else self._open

    def _anchored(self) -> bool:
        return self._state in ("opening", "maybe")

    def _on_marker(self, marker: str) -> None:
        self._state = "answer" if self._state == "thought" else "thought"

    def _missed(self) -> None:
        self._state = "thought" if self._state == "opening" else "answer"

    def _emit(self, text: str) -> None:
        if self._state == "answer":
            self._answer(text)
        else:
            self._think(text)
