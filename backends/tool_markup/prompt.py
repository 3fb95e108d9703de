"""Tools and past tool turns rendered into a chat prompt: through the tokenizer's chat
template when it takes ``tools``, else as a system prompt with the markup's rules. The
request's reasoning controls become template variables (``backends.reasoning``), and an
earlier assistant turn's thought its ``reasoning_content``, which the template keeps or
drops as the model's own does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from backends.base import ChatMessage, GenerationRequest, InvalidRequest, ToolCall, ToolSpec
from backends.reasoning import template_kwargs
from backends.tool_markup.markup import CLOSE, OPEN, render_call, tools_active


def _tool_json(tool: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = tool.parameters
    return {"type": "function", "function": function}


def tools_json(request: GenerationRequest) -> list[dict[str, Any]]:
    """The request's tools in the OpenAI shape (what templates and xgrammar take)."""
    return [_tool_json(tool) for tool in request.tools]


def tools_system_prompt(request: GenerationRequest) -> str:
    """How the tools are explained to a model whose chat template does not take them."""
    listing = "\n".join(json.dumps(tool) for tool in tools_json(request))
    return (
        "You can call functions to help answer. The functions, as JSON signatures:\n"
        f"<tools>\n{listing}\n</tools>\n"
        "To call a function, answer with a JSON object naming it and its arguments, "
        "inside tags:\n"
        f'{OPEN}\n{{"name": "function name", "arguments": {{...}}}}\n{CLOSE}'
    )


def chat_messages(request: GenerationRequest, template_takes_tools: bool) -> list[dict[str, Any]]:
    """The request's messages as chat-template dicts, with tools and past calls rendered.

    A template that takes ``tools`` gets calls and tool results in the Hugging Face shape
    (it renders them itself); otherwise calls become markup in the assistant's text, tool
    results a ``<tool_response>`` user turn, and the tools a system prompt.
    """
    messages = [_message(m, template_takes_tools) for m in request.messages]
    if tools_active(request) and not template_takes_tools:
        prompt = tools_system_prompt(request)
        if messages and messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": messages[0]["content"] + "\n\n" + prompt}
        else:
            messages.insert(0, {"role": "system", "content": prompt})
    return messages


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders a ``tools`` list itself (Hermes, Qwen, Llama 3)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def read_chat_template(value: str) -> str:
    """A configured ``chat_template``: Jinja text as given, or the text of the file it
    names (Jinja text always holds ``{{`` or ``{%``; a path never needs to). Blocking."""
    if "{{" in value or "{%" in value:
        return value
    return Path(value).expanduser().read_text(encoding="utf-8")


_RENDER_ARGUMENTS = frozenset(
    {
        "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
        "continue_final_message", "tokenize", "padding", "truncation", "max_length",
        "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    }
)  # fmt: skip
"""``apply_chat_template``'s own arguments: a client's template variable of the same name
would clash with them, so it is not passed."""


def render_chat(tokenizer: Any, request: GenerationRequest) -> str:
    """The prompt text of a chat request, tools and past calls included. A tokenizer
    without a chat template (a base model's) is the client's 400, naming the fix."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest(
            "this model has no chat template (a base model?): use /v1/completions, or set "
            "`chat_template:` in the model's config",
            param="messages",
        )
    takes_tools = template_takes_tools(tokenizer)
    extra: dict[str, Any] = {}
    if request.reasoning.asked:
        variables = template_kwargs(tokenizer.chat_template, request.reasoning)
        extra.update((k, v) for k, v in variables.items() if k not in _RENDER_ARGUMENTS)
    if takes_tools and tools_active(request):
        extra["tools"] = tools_json(request)
    text = tokenizer.apply_chat_template(
        chat_messages(request, takes_tools), tokenize=False, add_generation_prompt=True, **extra
    )
    return str(text)


def _message(message: ChatMessage, template_takes_tools: bool) -> dict[str, Any]:
    rendered = _rendered(message, template_takes_tools)
    if message.reasoning:
        rendered["reasoning_content"] = message.reasoning
    return rendered


def _rendered(message: ChatMessage, template_takes_tools: bool) -> dict[str, Any]:
    if template_takes_tools:
        out: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _arguments(call)},
                }
                for call in message.tool_calls
            ]
        if message.role == "tool":
            out["tool_call_id"] = message.tool_call_id
            if message.name:
                out["name"] = message.name
        return out
    if message.tool_calls:
        text = "\n".join([message.content, *(render_call(c) for c in message.tool_calls)])
        return {"role": "assistant", "content": text.strip("\n")}
    if message.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message.content}\n</tool_response>"}
    return {"role": message.role, "content": message.content}


def _arguments(call: ToolCall) -> Any:
    try:
        return json.loads(call.arguments)
    except ValueError:
        return call.arguments
