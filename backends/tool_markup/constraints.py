"""The grammar a request decodes under: a JSON Schema, any JSON object, or the tool-call
markup (an xgrammar structural tag), as vLLM's ``structured_outputs`` parameters."""

from __future__ import annotations

import json
from typing import Any

from backends.base import GenerationRequest
from backends.tool_markup.markup import CLOSE, OPEN, tools_active


def structured_outputs(request: GenerationRequest) -> dict[str, Any] | None:
    """The request's constraint as vLLM's ``structured_outputs`` parameters (what Triton's
    vLLM backend takes in ``sampling_parameters``), or ``None`` for free text. Tool calls
    use an xgrammar structural tag with the Hermes markup above."""
    if tools_active(request):
        return {"structural_tag": json.dumps(_tool_tag(request))}
    fmt = request.response_format
    if fmt.type == "json_object" and fmt.schema is None:
        return {"json_object": True}
    if fmt.type != "text":  # json_schema, or json_object with a schema
        return {"json": fmt.schema if fmt.schema is not None else {}}
    return None


def _tool_tag(request: GenerationRequest) -> dict[str, Any]:
    choice = request.effective_tool_choice
    single = request.parallel_tool_calls is not True or choice.mode == "named"
    tags = [
        {
            "type": "tag",
            "begin": f'{OPEN}\n{{"name": {json.dumps(tool.name)}, "arguments": ',
            "content": {"type": "json_schema", "json_schema": tool.parameters},
            "end": f"}}\n{CLOSE}",
        }
        for tool in request.tools
        if choice.mode != "named" or tool.name == choice.name
    ]
    body: dict[str, Any] = (
        {"type": "triggered_tags", "triggers": [OPEN], "tags": tags, "stop_after_first": single}
        if choice.mode == "auto"
        else {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": single,
        }
    )
    return {"type": "structural_tag", "format": body}
