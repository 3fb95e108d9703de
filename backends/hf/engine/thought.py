"""A reasoning model's thought inside the engine: the model's markup, resolved once at
load, and each choice's way through its thought.

- ``ThoughtMarkup`` (one per model; ``resolve`` builds it from ``reasoning_parser`` and
  the loaded tokenizer): the reasoning format (``backends.reasoning``), its closing and
  opening as token ids (what the engine forces), the special tokens the detokenizer
  must keep as text for the parser to see, and which controls the chat template reads.
- ``ChoiceThought`` (one per chat choice of such a model): the parser over the choice's
  detokenized text, the phase the choice is in (``UNDECIDED``, ``THINKING``,
  ``ANSWERING``), the tokens its thought took, and the tokens being forced: the closing,
  once a thinking budget is spent or ``max_tokens`` leaves just room for the closing and
  the shortest constrained answer; the rest of an opening the grammar does not allow,
  once the model chose to open a thought.

Counted as thought (``Usage.reasoning_tokens``): every token read while the choice was
thinking, before or after it: the one that opens the thought (none when the prompt
opened it), the thought's own, and the one that completes the closing marker.

Owner: the engine thread (one ``ChoiceThought`` per choice); ``ThoughtMarkup`` is frozen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from backends.reasoning import (
    Phase,
    ReasoningFormat,
    ReasoningParser,
    Split,
    detect_format,
    reads_effort,
    reasoning_format,
    template_switch,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ThoughtMarkup:
    """One model's thought markup, in its own tokens. ``closing_ids`` is empty when the
    closing does not tokenize back to itself (no thinking budget then); ``hidden`` is
    ``None`` when every special token is left out of the text as usual, else the special
    tokens to leave out (the markers among them are kept: harmony's are special)."""

    format: ReasoningFormat
    closing_ids: tuple[int, ...]
    opening_ids: tuple[int, ...]
    hidden: frozenset[int] | None
    switch: str | None  # the chat template's thinking switch variable
    effort: bool  # the chat template reads ``reasoning_effort``


def resolve(model: str, parser: str | None, tokenizer: Any) -> ThoughtMarkup | None:
    """The markup of ``model`` for its configured ``parser`` (``auto``: the one its chat
    template and added tokens show; None when none does), logged either way."""
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else None
    name = parser
    if parser == "auto":
        name = detect_format(template, tokenizer.get_added_vocab())
    if name is None:
        if parser == "auto":
            log.info("%s: no reasoning markup in its chat template or tokens: all answer", model)
        return None
    fmt = reasoning_format(name)
    closing = _encode(tokenizer, fmt.closing)
    if fmt.closing.strip() not in tokenizer.decode(closing, skip_special_tokens=False):
        log.warning(
            "%s: the %s closing %r does not tokenize back to itself: no thinking budget",
            model,
            name,
            fmt.closing,
        )
        closing = ()
    opening = _encode(tokenizer, fmt.opening)
    special = _special_ids(tokenizer)
    markers = special.intersection(closing + opening)
    markup = ThoughtMarkup(
        fmt,
        closing,
        opening,
        special - markers if markers else None,
        template_switch(template),
        reads_effort(template),
    )
    log.info(
        "%s: reasoning parser %s (%s); closing %s, template switch %s, effort %s",
        model,
        name,
        "detected" if parser == "auto" else "configured",
        list(closing),
        markup.switch,
        "read" if markup.effort else "not read",
    )
    return markup


def _special_ids(tokenizer: Any) -> frozenset[int]:
    """Every token a decode with ``skip_special_tokens`` leaves out: the named special
    tokens and each added token marked special."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    marked = {int(i) for i, token in added.items() if getattr(token, "special", False)}
    return frozenset(int(i) for i in tokenizer.all_special_ids) | marked


def _encode(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass(slots=True)
class ChoiceThought:
    """One choice's thought (see the module docstring). ``budget``: the most tokens the
    thought may take, closing included (None: no thinking budget)."""

    markup: ThoughtMarkup
    parser: ReasoningParser
    budget: int | None = None
    tokens: int = 0  # read while thinking (see the module docstring)
    plan: list[int] = field(default_factory=list)  # tokens still to force
    _opened: int = 0  # how many of the opening's tokens the output ends with (undecided)

    @classmethod
    def start(cls, markup: ThoughtMarkup, *, in_thought: bool, budget: int | None) -> ChoiceThought:
        return cls(markup, markup.format.parser(in_thought=in_thought), budget)

    @property
    def phase(self) -> Phase:
        return self.parser.phase

    @property
    def forcing(self) -> bool:
        return bool(self.plan)

    def read(self, text: str, *, final: bool) -> Split:
        """The split of one token's text (``final``: the choice ends with it, so what the
        parser held back is let go); the token counts as thought when the choice was
        thinking before or after it."""
        before = self.parser.phase
        split = self.parser.feed(text)
        if final:
            rest = self.parser.finish()
            split = Split(split.reasoning + rest.reasoning, split.content + rest.content)
        if Phase.THINKING in (before, self.parser.phase):
            self.tokens += 1
        return split

    def plan_closing(self, left: int, reserve: int | None) -> None:
        """Before a token is sampled with ``left`` tokens still allowed (this one
        included): start forcing the closing when the budget is spent, or when only the
        closing and ``reserve`` (the shortest constrained answer; None: the answer is
        free, and ``max_tokens`` may cut the thought) still fit. Never a closing that
        cannot fit whole."""
        need = len(self.markup.closing_ids)
        if self.plan or not need or left < need or self.parser.phase is not Phase.THINKING:
            return
        spent = self.budget is not None and self.tokens + need >= self.budget
        if spent or (reserve is not None and left <= need + reserve):
            self.plan = list(self.markup.closing_ids)

    def next_opening(self) -> int | None:
        """While undecided: the opening's next token, which the model may choose besides
        the grammar's (None when the output cannot be opening a thought now)."""
        opening = self.markup.opening_ids
        if self.parser.phase is not Phase.UNDECIDED or self._opened >= len(opening):
            return None
        return opening[self._opened]

    def chose(self, token: int, *, grammar_took: bool) -> None:
        """While undecided, after ``token`` was sampled: an opening token the grammar does
        not allow commits the choice to its thought, so the rest of the opening is forced."""
        if self.plan or self.parser.phase is not Phase.UNDECIDED:
            return
        opening = self.markup.opening_ids
        if self._opened < len(opening) and token == opening[self._opened]:
            self._opened += 1
            if not grammar_took:
                self.plan = list(opening[self._opened :])
                self._opened = len(opening)
        else:
            self._opened = 0

    def take_forced(self, token: int) -> bool:
        """Whether ``token`` was the forced one (it leaves the plan)."""
        if self.plan and self.plan[0] == token:
            self.plan.pop(0)
            return True
        return False
