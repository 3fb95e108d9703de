"""Closing a constrained value within ``max_tokens``: budget-aware constrained decoding.

A grammar alone guarantees that the output is a *prefix* of a valid value; when
``max_tokens`` cuts it, the client gets JSON that does not parse. Here every choice
decoding under a grammar that must end in a complete value keeps, after each sampled
token, a *closing*: the bytes that complete the value from the new state (close the open
string, fill missing required fields with short valid values, close brackets, then the
tool-call wrapper's closing markup). While the closing still fits in the tokens left,
the sampled token stands; when it would not, the token is replaced by the first token of
the previous state's closing (which was checked to fit), and the rest of that closing is
forced token by token. The choice then ends with ``stop`` and ``closed_by_budget``.

The closing is found by the grammar itself, not by a second reading of the schema: from
the matcher's state, take the string the grammar forces (xgrammar's jump-forward), else
the first byte of ``CLOSING_BYTES`` the grammar accepts (closers first, then the
shortest value starters), until the grammar is complete. Every step is an
``accept_string`` that is rolled back afterwards, so the live matcher is unchanged. The
result is a short valid completion (not always the shortest: an integer with
``minimum: 5`` closes as ``10``), and it is valid by construction: the forced tokens are
checked with the matcher before the first is forced.

Owner: the engine thread (one ``ClosingGuard`` per constrained choice; the ``Closer``
is shared by the choices of one model and holds no per-request state).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# Bytes tried, in order, when the grammar forces nothing: close what is open first, then
# the shortest value starts ("" 0 [] {} null true false), then anything a key, an enum
# or a pattern may need, and last UTF-8 continuation bytes (a token may end inside a
# multi-byte character: the smallest valid continuation completes it).
CLOSING_BYTES: tuple[bytes, ...] = tuple(
    bytes([c])
    for c in (
        b'}]",0[{ntf-123456789'
        b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
        b" _.:+e/<>\n\t!#$%&'()*;=?@\\^`|~"
        b"\x80\x90\xa0"
    )
)
# A closing longer than this is given up (the grammar cannot be closed by this search).
MAX_CLOSING_BYTES = 2048


class Closer:
    """Finds and tokenizes closings for one model's grammars (see the module docstring).

    ``encode`` turns text into token ids without special tokens; ``byte_tokens`` maps a
    single byte to a token that is exactly that byte (byte-level vocabularies have all
    256), used for the continuation bytes of a character a token left unfinished.
    """

    def __init__(self, encode: Any, byte_tokens: dict[int, int], stop_ids: Sequence[int]) -> None:
        self._encode = encode
        self._byte_tokens = byte_tokens
        self.stop_ids = frozenset(stop_ids)
        self._stop = min(stop_ids)

    def closing(self, matcher: Any) -> bytes | None:
        """Bytes that complete ``matcher``'s value (b"" when it is complete), or ``None``
        when the search finds no way to close it. ``matcher`` is left as it was."""
        out = bytearray()
        steps = 0
        try:
            while not matcher.is_completed():
                forced = matcher.find_jump_forward_string().encode()
                if not forced:
                    forced = _first_accepted(matcher)
                    if not forced:
                        return None
                elif not matcher.accept_string(forced):
                    return None
                steps += 1
                out += forced
                if len(out) > MAX_CLOSING_BYTES:
                    return None
            return bytes(out)
        finally:
            if steps:
                matcher.rollback(steps)

    def tokens(self, matcher: Any, closing: bytes) -> list[int] | None:
        """``closing`` as token ids that ``matcher`` accepts and that complete it, or
        ``None`` when the tokenization does not (``matcher`` is left as it was)."""
        if not closing:
            # Already complete: what is left is to end, with a stop token.
            return [self._stop] if matcher.is_completed() else None
        ids = self._tokenize(closing)
        if ids is None:
            return None
        accepted = 0
        try:
            for token in ids:
                if not matcher.accept_token(token):
                    return None
                accepted += 1
            return ids if matcher.is_completed() else None
        finally:
            if accepted:
                matcher.rollback(accepted)

    def _tokenize(self, closing: bytes) -> list[int] | None:
        # Leading continuation bytes finish a character an earlier token began; they
        # cannot be text on their own, so they go as single-byte tokens.
        head = 0
        while head < len(closing) and 0x80 <= closing[head] < 0xC0:
            head += 1
        ids: list[int] = []
        for byte in closing[:head]:
            token = self._byte_tokens.get(byte)
            if token is None:
                return None
            ids.append(token)
        try:
            text = closing[head:].decode()
        except UnicodeDecodeError:
            return None
        if text:
            ids.extend(int(t) for t in self._encode(text))
        return ids


def _first_accepted(matcher: Any) -> bytes:
    """Accept and return the first byte of ``CLOSING_BYTES`` that leads to a close.

    A bracket comes before a quote (``{}`` beats ``{"key": ...}``), except inside a
    string, where a bracket is only content: that is when a quote is still accepted
    right after it (after a real closing bracket a quote never is).
    """
    for byte in CLOSING_BYTES:
        if not matcher.accept_string(byte):
            continue
        if byte in b"}]" and matcher.accept_string(b'"'):
            matcher.rollback(2)
            continue
        return byte
    return b""


def min_tokens(closer: Closer, matcher: Any) -> int | None:
    """Tokens of the short value the closer finds from a fresh ``matcher``."""
    closing = closer.closing(matcher)
    if not closing:
        return None
    ids = closer.tokens(matcher, closing)
    return None if ids is None else len(ids)


@dataclass(slots=True)
class ClosingGuard:
    """One constrained choice's closing state: whether its value still closes in the tokens left.

    ``fits`` holds the closing of the current state, known to fit in the tokens left
    (``None`` until the first check); ``plan`` the forced tokens still to emit once
    closing has begun; ``closed`` is set when the first token was forced; ``owes`` once
    a state needed a closing (a JSON value, or a tool call that has begun), so that a
    value complete exactly at ``max_tokens`` ends with ``stop``.
    """

    closer: Closer
    fits: bytes | None = None
    plan: list[int] = field(default_factory=list)
    closed: bool = False
    owes: bool = False
    disabled: bool = False

    @property
    def forcing(self) -> bool:
        return bool(self.plan)

    def next_forced(self) -> int:
        return self.plan[0]

    def check(self, matcher: Any, token: int, left_after: int) -> int | None:
        """Whether the sampled ``token`` may stand with ``left_after`` tokens left after
        it: ``None`` if so, else the token to emit instead (the closing has begun)."""
        if self.disabled or token in self.closer.stop_ids:
            return None
        if not matcher.accept_token(token):
            return None  # not the grammar's token: accept_token reports it as usual
        try:
            after = self._reuse(matcher)
            if after is None:
                after = self.closer.closing(matcher)
            self.owes = self.owes or bool(after)
            if after is not None and _fits(self.closer, matcher, after, left_after):
                self.fits = after
                return None
        finally:
            matcher.rollback(1)
        return self._begin_closing(matcher, left_after + 1)

    def _reuse(self, matcher: Any) -> bytes | None:
        """The previous closing, when it still closes the value after the new token
        (the common case: a token that grew a string or a number). One
        ``accept_string`` instead of a search: most steps cost ~20 us, not ~0.5 ms."""
        last = self.fits
        if not last or not matcher.accept_string(last):
            return None
        complete = matcher.is_completed()
        matcher.rollback(1)
        return last if complete else None

    def _begin_closing(self, matcher: Any, left: int) -> int | None:
        closing = self.fits if self.fits is not None else self.closer.closing(matcher)
        ids = None if closing is None else self.closer.tokens(matcher, closing)
        if ids is None or len(ids) > left:
            # Only when the budget was below the minimum from the start, or the search
            # failed: the value then ends as the grammar and max_tokens leave it.
            self.disabled = True
            log.info("cannot close a constrained value within %d tokens", left)
            return None
        self.closed = True
        self.plan = ids
        return ids[0]

    def advance(self) -> bool:
        """After a forced token was accepted: true when that was the last one."""
        self.plan.pop(0)
        return not self.plan


def _fits(closer: Closer, matcher: Any, closing: bytes, left: int) -> bool:
    # A token is at least one byte, so the byte count bounds the token count: only a
    # closing longer in bytes than the budget left needs tokenizing.
    if not closing or len(closing) <= left:
        return True
    ids = closer.tokens(matcher, closing)
    return ids is not None and len(ids) <= left
