"""Prompt text and token counts from a local Hugging Face tokenizer, for servers fed text.

Triton's LLM contract takes text, so the gateway renders chat messages with the model's
chat template itself, and counts tokens for usage when the model does not report them;
the ``openai`` backend renders a chat prompt the same way to resume a broken chat stream
on an engine that cannot continue an assistant message (``backends.openai_proxy.resume``).
The tokenizer is loaded once in ``Prompter.load`` (in a thread: it reads files and imports
transformers) and is read-only afterwards; fast tokenizers are safe to share across
threads, so callers may run ``render``/``count`` through ``asyncio.to_thread``.
"""

from __future__ import annotations

from typing import Any

from backends.base import GenerationRequest, InvalidRequest, RequestKind
from backends.process_wide import exclusive
from backends.tool_markup.prompt import read_chat_template, render_chat


class Prompter:
    """Chat template + token counting. ``source`` may be None (completions only);
    ``chat_template`` (text or a file) replaces the tokenizer's own."""

    def __init__(self, source: str | None, chat_template: str | None = None) -> None:
        self._source = source
        self._chat_template = chat_template
        self._tokenizer: Any = None

    def load(self) -> None:
        """Blocking: resolve the source (maybe converting a packaged model) and load."""
        if self._source is None or self._tokenizer is not None:
            return
        from backends.hf.loading.model_source import resolve_source

        resolved = resolve_source(self._source)
        with exclusive(f"tokenizer of {self._source}"):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(resolved.path_or_id)
        if self._chat_template is not None:
            tokenizer.chat_template = read_chat_template(self._chat_template)
        self._tokenizer = tokenizer

    @property
    def loaded(self) -> bool:
        return self._tokenizer is not None

    @property
    def template(self) -> str | None:
        """The chat template text of the loaded tokenizer (None: none, or not loaded)."""
        template = getattr(self._tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    def render(self, request: GenerationRequest) -> str:
        """The text_input for ``request``; raises InvalidRequest when chat cannot be
        rendered (no tokenizer configured, or one without a chat template)."""
        if request.kind is RequestKind.COMPLETION:
            return request.prompt
        if self._tokenizer is None:
            raise InvalidRequest(
                "this model has no tokenizer configured to render a chat prompt with; "
                "use /v1/completions or set `tokenizer:` in the model config",
                param="messages",
            )
        return render_chat(self._tokenizer, request)

    def ids(self, text: str) -> list[int]:
        """The token ids of ``text`` as an engine tokenises a prompt it is sent (special
        tokens written in the text are parsed, none added); needs a loaded tokenizer."""
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def count(self, text: str, *, prompt: bool) -> int | None:
        """Tokens in ``text``; None without a tokenizer. A prompt is counted the way a
        model tokenizes its input (with special tokens such as BOS), generated text not."""
        if self._tokenizer is None:
            return None
        if not text:
            return 0
        return len(self._tokenizer(text, add_special_tokens=prompt)["input_ids"])
