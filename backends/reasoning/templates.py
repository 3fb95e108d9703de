"""Reasoning controls as chat-template variables, for backends that render the prompt
themselves (hf, Triton): the switch a template reads (Qwen3's ``enable_thinking``,
Granite's ``thinking``), gpt-oss's ``reasoning_effort``, and the client's own
``chat_template_kwargs``. A server that renders (vLLM) gets the same as request fields
(``backends.openai_proxy.payload``).
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import ReasoningControls
from backends.reasoning.formats import template_reads

SWITCHES = ("enable_thinking", "thinking")
"""The variables templates switch their thought with, the most common first."""


def template_switch(template: str | None) -> str | None:
    """The variable ``template`` switches thinking with, or None when it has none."""
    if not template:
        return None
    return next((name for name in SWITCHES if template_reads(template, name)), None)


def reads_effort(template: str | None) -> bool:
    """Whether ``template`` takes a ``reasoning_effort`` (gpt-oss's does)."""
    return bool(template) and template_reads(template or "", "reasoning_effort")


def template_kwargs(template: str | None, controls: ReasoningControls) -> dict[str, Any]:
    """The extra variables to render ``template`` with: the client's
    ``chat_template_kwargs`` first (they win), then the switch and the effort where the
    template reads them."""
    kwargs: dict[str, Any] = (
        orjson.loads(controls.template_kwargs) if controls.template_kwargs else {}
    )
    switch = template_switch(template)
    if controls.thinking is not None and switch is not None:
        kwargs.setdefault(switch, controls.thinking)
    if controls.effort is not None and controls.effort != "none" and reads_effort(template):
        kwargs.setdefault("reasoning_effort", controls.effort)
    return kwargs
