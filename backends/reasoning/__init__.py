"""Reasoning models' thoughts kept apart from their answers. Pure: no torch, no I/O.

A model that thinks before it answers writes its thought in a markup of its family
(``<think>``...``</think>``, harmony channels, Granite's headings). Each family is a
``ReasoningFormat`` under vLLM's parser name (``formats.FORMATS``); its ``parser()`` is an
incremental ``ReasoningParser`` over one choice's detokenized text: ``feed(delta)`` gives
the decided ``Split(reasoning, content)``, ``finish()`` what it held back. Every backend
that sees raw model text uses these (the hf engine, the Triton backend, the openai relay
in front of a server that does not split the thought itself), so all split alike.

Public surface:

- ``reasoning_format(name)`` / ``FORMATS`` / ``PARSER_NAMES``;
- ``ReasoningFormat.parser(in_thought=...)``, ``.starts_in_thought(prompt, thinking)``,
  ``.prompt_state(prompt)``, ``.template_opens_thought(template)``, ``.opening`` and
  ``.closing`` (the text an engine forces to end a thought at its budget);
- ``Split``, ``Phase``, ``ReasoningParser``;
- ``detect_format(template, special_tokens)`` for ``reasoning_parser: auto``;
- ``template_kwargs(template, controls)`` / ``template_switch(template)``: the reasoning
  controls as chat-template variables.
"""

from backends.reasoning.formats import (
    FORMATS,
    PARSER_NAMES,
    ParserName,
    ReasoningFormat,
    detect_format,
    reasoning_format,
)
from backends.reasoning.scanner import NOTHING, Phase, ReasoningParser, Split
from backends.reasoning.templates import reads_effort, template_kwargs, template_switch

__all__ = [
    "FORMATS",
    "NOTHING",
    "PARSER_NAMES",
    "ParserName",
    "Phase",
    "ReasoningFormat",
    "ReasoningParser",
    "Split",
    "detect_format",
    "reads_effort",
    "reasoning_format",
    "template_kwargs",
    "template_switch",
]
