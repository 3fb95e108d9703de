"""Tool calls as text, for backends that own the prompt (hf, Triton): Hermes-style markup.

A call is written ``<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>``: the
format of Hermes, Qwen 2.5/3 and the many chat templates that copied them, and the one
the grammar (``xgrammar``'s ``qwen_3`` structural tag) forces. One module per job:
``markup`` (the format itself), ``prompt`` (tools and past calls rendered into chat
messages, through the template when it takes ``tools``, else as a system prompt),
``constraints`` (the grammar a request decodes under), ``parser`` (a model's streamed
text back into content and ``ToolCallDelta`` events, never leaking the markup) and
``answer`` (a choice's text into thought, content and calls: a reasoning model's thought
split off before calls are read).
"""
