"""Grammars for constrained decoding, compiled with ``xgrammar`` (what vLLM and SGLang use).

``GrammarBook`` turns a request's ``response_format`` or forced tool calls into a
compiled grammar, off the engine thread (``HFBackend.generate`` calls ``compile`` through
``asyncio.to_thread``), keeping the most recent ``capacity`` grammars keyed by a hash of
what was compiled. The engine thread then gives each constrained choice its own
``GrammarMatcher`` (``new_matcher``) and masks that choice's logits row with it
(``mask_rows``), so constrained and free sequences share one batched forward.

With ``close_by_budget`` each compiled grammar comes with the fewest tokens its value
needs (``Constraint.min_tokens``: a request whose ``max_tokens`` is below it is refused)
and the ``Closer`` that keeps every choice able to close its value (``closing.py``).

Owner: the backend creates the book; ``compile`` may run on several worker threads at
once (the cache is guarded by a lock; xgrammar's compiler is thread-safe); the matchers
belong to the engine thread.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from backends.base import GenerationRequest, InvalidRequest
from backends.hf.constrained.closing import Closer, min_tokens
from backends.tool_markup.constraints import structured_outputs
from backends.tool_markup.markup import tools_active

if TYPE_CHECKING:
    import torch
    import xgrammar as xgr


def _xgr() -> ModuleType:
    """xgrammar, imported on first use: it imports transformers at import time, so its
    first import must happen under the process's load lock (``backends.process_wide``
    imports it there), never when this module is imported."""
    import xgrammar

    return xgrammar


@dataclass(frozen=True, slots=True)
class Constraint:
    """A compiled grammar and how its choices close by budget: ``closer`` is ``None``
    when the model's ``close_json_by_budget`` is off; ``min_tokens`` is the fewest tokens
    of a value the grammar requires (0 when it allows ending at once: ``auto`` tools, or
    when nothing closes by budget); ``required``: the answer must hold a value (false for
    ``auto`` tools, where plain text or nothing will do)."""

    compiled: Any
    closer: Closer | None = None
    min_tokens: int = 0
    required: bool = True


class GrammarBook:
    """See the module docstring."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        vocab_size: int,
        stop_ids: Iterable[int],
        capacity: int = 64,
        threads: int = 1,
        close_by_budget: bool = True,
    ) -> None:
        stops = sorted(stop_ids)
        info = _xgr().TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stops
        )
        self._compiler: xgr.GrammarCompiler = _xgr().GrammarCompiler(
            info, max_threads=threads, cache_enabled=False
        )
        self._closer: Closer | None = None
        if close_by_budget:
            self._closer = Closer(
                lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
                _byte_tokens(info.decoded_vocab),
                stops,
            )
        self._capacity = capacity
        self._cache: OrderedDict[str, Constraint] = OrderedDict()
        self._lock = threading.Lock()
        self.vocab_size = vocab_size

    def compile(self, request: GenerationRequest) -> Constraint | None:
        """The grammar ``request`` decodes under, or ``None`` when it is free text.

        Raises ``InvalidRequest`` (naming the param) with xgrammar's reason when the
        schema uses features the library cannot compile.
        """
        spec = grammar_spec(request)
        if spec is None:
            return None
        kind, payload, param = spec
        key = hashlib.sha256(f"{kind}\0{payload}".encode()).hexdigest()
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                return found
        try:
            compiled = self._build(kind, payload)
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses
            raise InvalidRequest(f"cannot compile the grammar: {exc}", param=param) from None
        required = not (kind == "tools" and request.effective_tool_choice.mode == "auto")
        constraint = Constraint(compiled, required=required)
        if self._closer is not None:
            least = min_tokens(self._closer, new_matcher(constraint))
            constraint = Constraint(compiled, self._closer, least or 0, required)
        with self._lock:
            self._cache[key] = constraint
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
        return constraint

    def _build(self, kind: str, payload: str) -> xgr.CompiledGrammar:
        if kind == "json_object":
            # Any object: the model writes it as it would unconstrained (clients such as
            # instructor's JSON mode show it an indented schema), whitespace bounded per
            # run so it cannot pad forever.
            return self._compiler.compile_json_schema(
                payload,
                any_whitespace=True,
                max_whitespace_cnt=_JSON_OBJECT_WHITESPACE,
                strict_mode=False,
            )
        if kind == "json_schema":
            return self._compiler.compile_json_schema(payload, any_whitespace=False)
        return self._compiler.compile_structural_tag(json.dumps(compact_tag(json.loads(payload))))

    def __len__(self) -> int:
        return len(self._cache)


_JSON_OBJECT_WHITESPACE = 8  # a newline and indentation three levels deep


def check_budget(constraint: Constraint, request: GenerationRequest, before: int = 0) -> None:
    """Refuse a ``max_tokens`` below the fewest tokens the value needs (and ``before``:
    a reasoning model's closing of its thought, which comes first): it could only end
    cut, as JSON that does not parse."""
    value, wanted = constraint.min_tokens, request.sampling.max_tokens
    least = value + before if value else 0
    if wanted is not None and wanted < least:  # unset: the engine's limit is the room left
        thought = f", after {before} to close the thought," if before else ""
        raise InvalidRequest(
            f"max_tokens is {wanted}, but the shortest value this "
            f"{'tool call' if tools_active(request) else 'schema'} allows takes {value} "
            f"tokens{thought}: set max_tokens to at least {least}",
            param="max_tokens",
        )


def grammar_spec(request: GenerationRequest) -> tuple[str, str, str] | None:
    """(kind, text to compile, param to blame) for a constrained request, else ``None``.

    Cheap (no compilation): the same constraint the Triton path sends to vLLM
    (``tool_markup.constraints.structured_outputs``); tools take precedence over
    ``response_format``.
    """
    structured = structured_outputs(request)
    if structured is None:
        return None
    if "structural_tag" in structured:
        return "tools", structured["structural_tag"], "tools"
    if "json_object" in structured:
        return "json_object", json.dumps({"type": "object"}), "response_format"
    param = (
        "response_format.schema"
        if request.response_format.type == "json_object"
        else "response_format.json_schema.schema"
    )
    return "json_schema", json.dumps(structured["json"]), param


def compact_tag(tag: dict[str, Any]) -> dict[str, Any]:
    """The Hermes structural tag with every call's arguments held to compact JSON: no
    free whitespace, since every token counts against ``max_tokens`` (and a small
    model can emit whitespace forever inside a valid prefix)."""
    for call in tag["format"]["tags"]:
        schema = json.dumps(call["content"]["json_schema"])
        ebnf = str(_xgr().Grammar.from_json_schema(schema, any_whitespace=False))
        call["content"] = {"type": "grammar", "grammar": ebnf}
    return tag


def new_matcher(constraint: Constraint) -> xgr.GrammarMatcher:
    matcher: xgr.GrammarMatcher = _xgr().GrammarMatcher(constraint.compiled)
    return matcher


def _byte_tokens(decoded_vocab: list[bytes]) -> dict[int, int]:
    """byte -> a token that is exactly that byte (the first one, for determinism)."""
    found: dict[int, int] = {}
    for token, raw in enumerate(decoded_vocab):
        if len(raw) == 1 and raw[0] not in found:
            found[raw[0]] = token
    return found


def mask_rows(logits: torch.Tensor, matchers: list[tuple[int, xgr.GrammarMatcher]]) -> None:
    """Set to -inf every token the row's matcher forbids next, in place."""
    if not matchers:
        return
    bitmask = _xgr().allocate_token_bitmask(logits.shape[0], logits.shape[-1])
    for row, matcher in matchers:
        matcher.fill_next_token_bitmask(bitmask, row)
    _xgr().apply_token_bitmask_inplace(
        logits, bitmask, vocab_size=logits.shape[-1], indices=[row for row, _ in matchers]
    )
