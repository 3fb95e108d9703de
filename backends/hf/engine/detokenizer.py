"""Incremental detokenization and stop-string matching for one output stream.

``IncrementalDetokenizer`` turns token ids into text as they arrive without ever
emitting half a UTF-8 character: byte-level BPE splits a Korean syllable or an emoji
over several tokens, and decoding such a prefix yields U+FFFD; we hold those tokens
back until the character completes. It decodes only a short window (a few tokens of
context plus the unread ones), so the cost per token stays constant. Special tokens are
left out of the text, except those a reasoning parser must read (harmony's channel
markers are special tokens): given ``hidden``, only those are left out.

``StopMatcher`` finds stop strings that may span tokens, cuts them (and everything after
them) from the output, and holds back any tail that could still become a stop string.

Owner: the engine thread; one instance per choice.
"""

from __future__ import annotations

from typing import Protocol

_REPLACEMENT = "\ufffd"
_CONTEXT_TOKENS = 6


class TokenDecoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Text deltas from a growing list of token ids (see module docstring)."""

    def __init__(
        self,
        tokenizer: TokenDecoder,
        prompt_ids: list[int] | tuple[int, ...],
        hidden: frozenset[int] | None = None,
    ) -> None:
        self._tok = tokenizer
        # None: the tokenizer skips every special token; else the ones to skip here, and
        # the other special tokens decode as text.
        self._hidden = hidden
        self._skip = hidden is None
        if hidden:
            prompt_ids = [i for i in prompt_ids if i not in hidden]
        # A little prompt context makes word-boundary spaces decode as in the full text.
        self._ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly empty)."""
        if self._hidden is not None and token_id in self._hidden:
            return ""
        self._ids.append(token_id)
        prefix_text = self._tok.decode(
            self._ids[self._prefix : self._read], skip_special_tokens=self._skip
        )
        full_text = self._tok.decode(self._ids[self._prefix :], skip_special_tokens=self._skip)
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""
        delta = full_text[len(prefix_text) :]
        self._prefix = self._read
        self._read = len(self._ids)
        if self._prefix > 64:  # keep the window short
            drop = self._prefix - _CONTEXT_TOKENS
            del self._ids[:drop]
            self._prefix -= drop
            self._read -= drop
        return delta

    def flush(self) -> str:
        """Whatever is still held back at the end (an incomplete character stays U+FFFD)."""
        if self._read >= len(self._ids):
            return ""
        prefix_text = self._tok.decode(
            self._ids[self._prefix : self._read], skip_special_tokens=self._skip
        )
        full_text = self._tok.decode(self._ids[self._prefix :], skip_special_tokens=self._skip)
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text) :]


class StopMatcher:
    """Cuts output at the first stop string; holds back possible stop-string prefixes."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that cut the output

    def feed(self, text: str) -> str:
        """Add text; return what may be emitted now. Sets ``stopped`` on a match."""
        if not self._stops:
            return text
        if self.stopped:
            return ""
        buffer = self._pending + text
        hits = [(at, stop) for stop in self._stops if (at := buffer.find(stop)) >= 0]
        if hits:
            cut, self.matched = min(hits, key=lambda hit: hit[0])
            self.stopped = True
            self._pending = ""
            return buffer[:cut]
        keep = self._held_tail(buffer)
        self._pending = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def _held_tail(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that is a proper prefix of a stop."""
        for size in range(min(self._hold, len(buffer)), 0, -1):
            tail = buffer[-size:]
            if any(s.startswith(tail) for s in self._stops):
                return size
        return 0

    def flush(self) -> str:
        """At the end of generation the held tail was not a stop string after all."""
        out, self._pending = self._pending, ""
        return "" if self.stopped else out


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte <-> printable-character table used by byte-level BPE."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), ord("\xff") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


class TokenTable:
    """Per-token text and exact UTF-8 bytes for logprobs, memoised.

    A byte-level BPE token may hold part of a character: its ``text`` then contains
    U+FFFD but its ``bytes`` are the true bytes, so clients can reassemble the output.
    """

    def __init__(self, tokenizer: object) -> None:
        self._tok = tokenizer
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._byte_level = type(decoder).__name__ == "ByteLevel"
        self._byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        self._memo: dict[int, tuple[str, tuple[int, ...]]] = {}

    def get(self, token_id: int) -> tuple[str, tuple[int, ...]]:
        found = self._memo.get(token_id)
        if found is None:
            found = self._compute(token_id)
            self._memo[token_id] = found
        return found

    def _compute(self, token_id: int) -> tuple[str, tuple[int, ...]]:
        text = str(self._tok.decode([token_id]))  # type: ignore[attr-defined]
        if self._byte_level:
            piece = self._tok.convert_ids_to_tokens(token_id)  # type: ignore[attr-defined]
            if isinstance(piece, str) and all(c in self._byte_of for c in piece):
                return text, tuple(self._byte_of[c] for c in piece)
        return text, tuple(text.encode("utf-8"))
